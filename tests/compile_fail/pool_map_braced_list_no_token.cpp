// Refused on g++ 12: a braced list of items mapped without a token, the
// map's result part of a co_await expression.
// expected error: g++ 12 cannot compile a braced list inside co_await, and map cannot tell
#include "cohort/pool.hpp"

long twice(int, long value) { return 2 * value; }
COHORT_ENTRYPOINT(twice);

asio::awaitable<long> sum(std::vector<long> values) {
  long total = 0;
  for (long v : values) total += v;
  co_return total;
}

asio::awaitable<void> map(cohort::pool& p) {
  long total = co_await sum(p.map(twice, {1L, 2L}));
}
