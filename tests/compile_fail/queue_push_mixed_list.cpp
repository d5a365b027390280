// Refused on g++ 12: a braced list of values of mixed types (an int and a
// long for a vector of longs) pushed inside co_await.
// expected error: g++ 12 cannot compile a braced list inside co_await
#include "cohort/queue.hpp"

asio::awaitable<void> push(cohort::queue<std::vector<long>>& q) {
  co_await q.push({1, 2L});
}
