// Refused on g++ 12: a braced list of braced lists (each value a vector of
// vectors) pushed inside co_await.
// expected error: g++ 12 cannot compile a braced list inside co_await
#include "cohort/queue.hpp"

asio::awaitable<void> push(cohort::queue<std::vector<std::vector<int>>>& q) {
  co_await q.push({{1, 2}, {3}});
}
