// Refused on g++ 12: run() with its options in braces, in a call whose
// result is part of a co_await expression.
// expected error: g++ 12 destroys a spawn_options temporary twice inside co_await
#include "cohort/spawn.hpp"

asio::awaitable<int> identity(int value) { co_return value; }

asio::awaitable<void> start() {
  const cohort::command cmd("pwd");
  int code = co_await identity(cohort::run(cmd, {.cwd = "/tmp"}).code());
}
