// Refused on g++ 12: a spawn_options temporary given with an executor and a
// token, inside co_await.
// expected error: g++ 12 destroys a spawn_options temporary twice inside co_await
#include "cohort/spawn.hpp"

asio::awaitable<void> start() {
  auto executor = co_await asio::this_coro::executor;
  const cohort::command cmd("pwd");
  cohort::child c = co_await cohort::spawn(executor, cmd, {.cwd = "/"}, asio::use_awaitable);
}
