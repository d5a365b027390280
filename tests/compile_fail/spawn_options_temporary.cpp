// Refused on g++ 12: a spawn_options temporary, inside co_await.
// expected error: g++ 12 destroys a spawn_options temporary twice inside co_await
#include "cohort/spawn.hpp"

asio::awaitable<void> start() {
  cohort::child c = co_await cohort::spawn(cohort::command("true"), cohort::spawn_options{.cwd = "/"});
}
