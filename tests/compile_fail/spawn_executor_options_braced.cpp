// Refused on g++ 12: spawn options in braces given with an executor and no
// token, in a call whose child is awaited.
// expected error: g++ 12 destroys a spawn_options temporary twice inside co_await
#include "cohort/spawn.hpp"

asio::awaitable<void> start() {
  auto executor = co_await asio::this_coro::executor;
  const cohort::command cmd("pwd");
  cohort::exit_status status = co_await cohort::spawn(executor, cmd, {.cwd = "/tmp"}).wait();
}
