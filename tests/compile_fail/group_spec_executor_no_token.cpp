// Refused on g++ 12: a group_spec temporary given with an executor and no
// token, in a call whose group is awaited.
// expected error: g++ 12 destroys a group_spec temporary twice inside co_await
#include "cohort/group.hpp"

asio::awaitable<void> start() {
  auto executor = co_await asio::this_coro::executor;
  cohort::run_result result = co_await cohort::start_processes(
      executor, cohort::group_spec{.name = "pair", .entry = cohort::command("true"), .nprocs = 2}).wait();
}
