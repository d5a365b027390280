// Refused on g++ 12: a braced list of items mapped with a token inside
// co_await.
// expected error: g++ 12 cannot compile a braced list inside co_await
#include "cohort/pool.hpp"

int item(int, int value) { return value; }

asio::awaitable<void> map(cohort::pool& p) {
  auto values = co_await p.map(item, {1, 2, 3}, asio::use_awaitable);
}
