// Refused on g++ 12: a braced list pushed with a token inside co_await.
// expected error: g++ 12 cannot compile a braced list inside co_await
#include "cohort/queue.hpp"

asio::awaitable<void> push(cohort::queue<std::vector<int>>& q) {
  co_await q.push({1, 2, 3}, asio::use_awaitable);
}
