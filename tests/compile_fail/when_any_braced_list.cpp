// Refused: a braced list of awaitables given to when_any inside co_await
// (awaitables can only be moved; an initializer_list holds them const).
// expected error: a braced list of awaitables cannot be moved from
#include "cohort/when_any.hpp"

asio::awaitable<void> none() { co_return; }

asio::awaitable<void> first() {
  const auto winner = co_await cohort::when_any({none(), none()});
}
