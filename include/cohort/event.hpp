// A flag shared by processes that they can wait on (torch.multiprocessing's
// Event): set, clear, and waits that sleep in the kernel until it is set.
#pragma once

#include "cohort/export.hpp"

#include "cohort/completion_token.hpp"
#include "cohort/encoding.hpp"
#include "cohort/storage.hpp"
#include "cohort/timeout.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

COHORT_API_BEGIN

namespace cohort {

class event;
namespace detail {
/// The waits on `e` counted asleep now (for tests).
std::uint32_t event_sleepers(const event& e);
/// Sets `e`'s flag as set() does and stops there, before waking anyone:
/// what a setter killed at that point leaves (for tests).
void event_store_flag_only(event& e);
}  // namespace detail

/// Starts clear. Copies, and handles sent to other processes (as entry
/// point arguments or through queues), are the same event. Every call may
/// come from any thread of any process holding it (a cancellation slot's
/// signal from the wait's executor, as asio requires). set() enters the kernel
/// only when someone waits (or, once, after a waiter was killed while it
/// waited). A wait ends at any set() made while it waits,
/// even one that a clear() follows at once, as Python's Event.wait does.
/// A setter killed inside set() before its wake: a wait, blocking or
/// awaited, looks at the flag again at least once a second.
class event {
 public:
  /// A new event in shared memory. Throws shm_error.
  event();
  /// Copies are handles to the same event. A move copies too, so an event
  /// moved from is still that event, never an empty handle to crash on.
  event(const event&) = default;
  event& operator=(const event&) = default;

  void set();
  void clear() noexcept;
  bool is_set() const noexcept;

  /// Waits until the event is set; an asio asynchronous operation
  /// completing as void(std::exception_ptr), by default an
  /// asio::awaitable<void> that starts lazily, when awaited. It runs on the
  /// handler's associated executor, which must be an io_context's (the
  /// awaiting coroutine's for use_awaitable; bind one with
  /// asio::bind_executor for a callback or asio::use_future); a handler
  /// that names none is refused with std::invalid_argument (see
  /// cohort/completion_token.hpp). Cancellation
  /// of any type through the token's cancellation slot ends it with
  /// std::system_error(operation_aborted); the event is untouched.
  template <completion_token_of<void> Token = default_token>
  [[nodiscard]] auto wait(Token&& token = {}) const {
    return detail::async_awaitable<void>(
        std::nullopt,
        [state = state_](asio::any_io_executor executor) {
          return detail::taking_any_cancellation(wait_on(std::move(executor), state));
        },
        std::forward<Token>(token));
  }
  /// Blocks until the event is set (true) or `timeout` passes (false).
  bool wait_for(std::optional<std::chrono::nanoseconds> timeout = std::nullopt) const;
  /// The same with a timeout of any duration type: one too long to count in
  /// nanoseconds (seconds::max()) waits without end.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return wait_for(std::optional(detail::saturating_cast<std::chrono::nanoseconds>(timeout)));
  }

 private:
  static asio::awaitable<void> wait_on(asio::any_io_executor executor, storage state);
  friend struct detail::handle_codec<event>;
  friend std::uint32_t detail::event_sleepers(const event& e);
  friend void detail::event_store_flag_only(event& e);
  explicit event(storage state);
  storage state_;
};

namespace detail {

/// An event crosses as the storage of its flag.
template <>
struct handle_codec<event> {
  static std::string signature() { return "e"; }
  static std::size_t size_bound(const event& e) { return handle_codec<storage>::size_bound(e.state_); }
  static void write(std::vector<std::byte>& out, const event& e) { handle_codec<storage>::write(out, e.state_); }
  static event read(reader& in) { return event(handle_codec<storage>::read(in)); }
};

}  // namespace detail

}  // namespace cohort

COHORT_API_END
