// Refused on g++ 12: a group_spec temporary, inside co_await.
// expected error: g++ 12 destroys a group_spec temporary twice inside co_await
#include "cohort/group.hpp"

asio::awaitable<void> start() {
  cohort::group g = co_await cohort::start_processes(
      cohort::group_spec{.entry = cohort::command("true"), .nprocs = 4});
}
