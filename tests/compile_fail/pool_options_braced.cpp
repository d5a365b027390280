// Refused on g++ 12: a pool made with its options in braces inside
// co_await, whose temporary g++ 12 would destroy twice.
// expected error: g++ 12 destroys a pool_options temporary twice inside co_await
#include "cohort/pool.hpp"

int item(int, int value) { return value; }
COHORT_ENTRYPOINT(item);

asio::awaitable<void> map() {
  const std::vector<int> items{1, 2, 3};
  auto values = co_await cohort::pool(2, {.method = cohort::start_method::fork}).map(item, items, asio::use_awaitable);
}
