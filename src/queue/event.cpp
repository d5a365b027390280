// cohort::event: a flag word and a sleeper count in shared memory.
#include "cohort/event.hpp"

#include "queue/strand_race.hpp"
#include "os/deadline.hpp"
#include "os/futex.hpp"
#include "uring/futex.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/multiple_exceptions.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <system_error>
#include <vector>

namespace cohort {

namespace {

constexpr std::uint32_t magic = 0x34766e65;  // "env4": waits sleep on the generation ("env3" slept on the flag)
constexpr std::uint32_t set_bit = 1;
constexpr std::uint64_t count_mask = 0xffffffff;
// The longest a wait sleeps before it looks at the flag again.
constexpr std::chrono::nanoseconds recheck_after = std::chrono::seconds(1);

struct event_state {
  std::uint32_t magic;
  // Bit 0 is the flag; the bits above count the set() calls (mod 2^31),
  // so that a waiter woken by a set() that a clear() followed at once
  // still sees that it came, and returns as Python's Event.wait does.
  std::atomic<std::uint32_t> flag;
  // The waiters of the current generation (low 32 bits) below the
  // generation, which a set() that finds waiters advances, counting none,
  // before it wakes them all. A waiter counts itself and learns its
  // generation in one step, looks at the flag, and sleeps on the
  // generation's word (the high half) while it still holds its own: a
  // set() after its count either finds it counted and wakes it, or has
  // moved the generation on, and the sleep does not begin. A waiter
  // uncounts itself only from its own generation, so a waiter killed
  // while it waited is counted until the next set(), not for good.
  std::atomic<std::uint64_t> sleepers;
};
static_assert(std::endian::native == std::endian::little && sizeof(std::atomic<std::uint32_t>) == 4);

event_state& state_of(const storage& s) { return *reinterpret_cast<event_state*>(s.data()); }

// The generation's word, which waits sleep on: the high half of sleepers.
std::atomic<std::uint32_t>& generation_word(event_state& s) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(reinterpret_cast<std::byte*>(&s.sleepers) + 4);
}

struct counted_sleeper {
  std::atomic<std::uint64_t>& sleepers;
  std::uint64_t generation;
  explicit counted_sleeper(std::atomic<std::uint64_t>& s) : sleepers(s), generation(s.fetch_add(1) >> 32) {}
  ~counted_sleeper() {
    auto now = sleepers.load();
    while ((now >> 32) == generation && (now & count_mask) != 0 && !sleepers.compare_exchange_weak(now, now - 1)) {
    }
  }
};

}  // namespace

event::event() : state_(storage::allocate_shared(sizeof(event_state))) {
  new (state_.data()) event_state{magic, {0}, {0}};
}

event::event(storage state) : state_(std::move(state)) {
  if (state_.nbytes() != sizeof(event_state) || state_of(state_).magic != magic) {
    throw decode_error("cohort::event: an event handle names something else");
  }
}

namespace {

void store_flag(event_state& s) {
  std::uint32_t word = s.flag.load();
  while (!s.flag.compare_exchange_weak(word, (word + 2) | set_bit)) {
  }
}

}  // namespace

void detail::event_store_flag_only(event& e) { store_flag(state_of(e.state_)); }

void event::set() {
  auto& s = state_of(state_);
  store_flag(s);
  auto sleepers = s.sleepers.load();
  while ((sleepers & count_mask) != 0 && !s.sleepers.compare_exchange_weak(sleepers, ((sleepers >> 32) + 1) << 32)) {
  }
  if ((sleepers & count_mask) != 0) os::futex_wake(generation_word(s), INT_MAX);
}

std::uint32_t detail::event_sleepers(const event& e) {
  return static_cast<std::uint32_t>(state_of(e.state_).sleepers.load() & count_mask);
}

void event::clear() noexcept { state_of(state_).flag.fetch_and(~set_bit); }
bool event::is_set() const noexcept { return (state_of(state_).flag.load() & set_bit) != 0; }

// A wait ends once the flag's word differs from what it was as the wait
// began, clear: only a set() changes a clear word.

namespace {

// Ends at a wake on the generation's word or after recheck_after, whichever
// comes first: asleep a second at most, as a blocking wait, so that a set()
// whose setter was killed before its wake is seen that late. A branch that
// fails ends nothing; `||` throws multiple_exceptions once both have
// failed, as a cancellation from outside makes them.
asio::awaitable<void> wake_or_recheck(std::atomic<std::uint32_t>& word, std::uint32_t generation) {
  using namespace asio::experimental::awaitable_operators;
  // when_any's strand, where `||` starts its branches: there the two
  // never complete at once, as on an io_context run by several threads,
  // where the one that won cancelled the other while that one was being
  // freed.
  auto strand = co_await asio::this_coro::executor;
  asio::steady_timer recheck(strand, recheck_after);
  co_await (uring::async_futex_wait(strand, word, generation, asio::use_awaitable) ||
            recheck.async_wait(asio::use_awaitable));
}

}  // namespace

// `state` keeps the flag mapped while the wait lasts.
asio::awaitable<void> event::wait_on(asio::any_io_executor executor, storage state) {
  // Refused here, every time, not inside the first sleep, where the throw
  // would find no coroutine to reach (std::terminate).
  (void)uring::io_context_of(executor, "cohort::event::wait");
  auto& s = state_of(state);
  const std::uint32_t begun = s.flag.load();
  if ((begun & set_bit) != 0) co_return;
  // Before the timer, which would bring up asio's reactor with asio's bare
  // message where no descriptor is left.
  (void)uring::service_for(executor, "cohort::event::wait");
  while (s.flag.load() == begun) {
    const counted_sleeper sleeper(s.sleepers);
    if (s.flag.load() != begun) break;
    co_await detail::race_on_own_strand(
        wake_or_recheck(generation_word(s), static_cast<std::uint32_t>(sleeper.generation)), "cohort::event");
  }
}

bool event::wait_for(std::optional<std::chrono::nanoseconds> timeout) const {
  auto& s = state_of(state_);
  const auto deadline =
      timeout ? std::optional(os::deadline_after(std::chrono::steady_clock::now(), *timeout)) : std::nullopt;
  const std::uint32_t begun = s.flag.load();
  if ((begun & set_bit) != 0) return true;
  while (s.flag.load() == begun) {
    const counted_sleeper sleeper(s.sleepers);
    if (s.flag.load() != begun) break;
    // Asleep a second at most, then looked again: a set() whose setter
    // was killed before its wake is seen that late.
    std::chrono::nanoseconds left = recheck_after;
    if (deadline) {
      left = std::min(left, *deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::nanoseconds(0)) return false;
    }
    os::futex_wait(generation_word(s), static_cast<std::uint32_t>(sleeper.generation), left);
  }
  return true;
}

}  // namespace cohort
