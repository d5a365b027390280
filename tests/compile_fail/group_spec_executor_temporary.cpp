// Refused on g++ 12: a group_spec temporary given with an executor and a
// token, inside co_await.
// expected error: g++ 12 destroys a group_spec temporary twice inside co_await
#include "cohort/group.hpp"

asio::awaitable<void> start() {
  auto executor = co_await asio::this_coro::executor;
  cohort::group g = co_await cohort::start_processes(
      executor, cohort::group_spec{.entry = cohort::command("true"), .nprocs = 2}, asio::use_awaitable);
}
