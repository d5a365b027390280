// Refused on g++ 12: spawn options in braces, inside co_await.
// expected error: g++ 12 destroys a spawn_options temporary twice inside co_await
#include "cohort/spawn.hpp"

asio::awaitable<void> start() {
  cohort::child c = co_await cohort::spawn(cohort::command("true"), {.out = cohort::stdio::pipe()});
}
