// Refused on g++ 12: a braced list of braced items (each item a vector)
// mapped with a token inside co_await.
// expected error: g++ 12 cannot compile a braced list inside co_await
#include "cohort/pool.hpp"

long total(int, std::vector<int> values) {
  long sum = 0;
  for (int v : values) sum += v;
  return sum;
}
COHORT_ENTRYPOINT(total);

asio::awaitable<void> map(cohort::pool& p) {
  auto totals = co_await p.map(total, {{1, 2}, {3}}, asio::use_awaitable);
}
