// Refused on g++ 12: a braced list of items of mixed types (an int and a
// long for long items) mapped with a token inside co_await.
// expected error: g++ 12 cannot compile a braced list inside co_await
#include "cohort/pool.hpp"

long twice(int, long value) { return 2 * value; }
COHORT_ENTRYPOINT(twice);

asio::awaitable<void> map(cohort::pool& p) {
  auto values = co_await p.map(twice, {1, 2L}, asio::use_awaitable);
}
