// The helper threads of futex waits without the ring's futex op.
#include "uring/futex.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace cohort::uring {

/// One helper thread and the waits it sleeps on. Its control word is
/// bumped and woken whenever the waits change or the service stops it, so
/// that it sleeps again on the waits as they are.
struct futex_helper {
  std::atomic<std::uint32_t> control{0};
  std::vector<futex_thread_wait*> waits;  // under the service's lock
  bool stopping = false;                  // under the service's lock
  std::jthread thread;
};

namespace {

// futex_waitv takes at most 128 words: the control word and 127 waits.
constexpr std::size_t waitv_most = 128;
// How often a helper without futex_waitv looks at its control word.
constexpr std::chrono::milliseconds control_check{50};

void bump(futex_helper& h) {
  // release: the helper reads its waits under the lock; this only wakes it.
  h.control.fetch_add(1, std::memory_order_release);
  os::futex_wake(h.control, 1);
}

}  // namespace

futex_threads::futex_threads(asio::execution_context& context)
    : asio::execution_context::service(context), owner_(os::this_process()) {}
futex_threads::~futex_threads() = default;

std::size_t futex_threads::waits_per_thread() { return os::futex_waitv_supported() ? waitv_most - 1 : 1; }

std::size_t futex_threads::threads() const {
  std::lock_guard lock(mutex_);
  return os::this_process() == owner_ ? helpers_.size() : 0;
}

// In a forked child, the helpers listed are the parent's: their threads do
// not run here, so a wait given to one would never end. They are left
// (leaked: there is no thread to join), and the waits they held, copies of
// the parent's that nothing wakes here, are destroyed at shutdown.
void futex_threads::leave_inherited_helpers_locked() {
  const pid_t self = os::this_process();
  if (owner_ == self) return;
  owner_ = self;
  for (auto& h : helpers_) {
    inherited_waits_.insert(inherited_waits_.end(), h->waits.begin(), h->waits.end());
    (void)h.release();
  }
  helpers_.clear();
}

// A forked child told of the fork ends its copies of the parent's waits,
// which nothing wakes here, as cancelled: they would keep its run() from
// returning. (The fork waited for the lock: no helper was changing them.)
void futex_threads::notify_fork(asio::execution_context::fork_event event) {
  if (event != asio::execution_context::fork_child) return;
  std::lock_guard lock(mutex_);
  if (shut_down_) return;
  leave_inherited_helpers_locked();
  for (auto* w : std::exchange(inherited_waits_, {})) {
    w->helper_ = nullptr;
    w->post(asio::error::operation_aborted);
  }
}

void futex_threads::start(futex_thread_wait& w) {
  std::unique_lock lock(mutex_);
  if (shut_down_) {
    // Outside the lock: what the wait's end lets go of (a coroutine's
    // frame, a queue's watch) may take or make other locks.
    lock.unlock();
    return w.destroy();
  }
  leave_inherited_helpers_locked();
  // acquire: pairs with the waker's release store, for the data it published.
  if (w.word_.load(std::memory_order_acquire) != w.expected_) return w.post({});
  const auto room = std::ranges::find_if(helpers_, [](const auto& h) { return h->waits.size() < waits_per_thread(); });
  futex_helper* h = room != helpers_.end() ? room->get() : nullptr;
  try {
    if (h == nullptr) {
      auto made = std::make_unique<futex_helper>();
      made->thread = std::jthread([this, helper = made.get()] { run(*helper); });
      h = helpers_.emplace_back(std::move(made)).get();
    }
    h->waits.push_back(&w);
  } catch (const std::system_error& e) {  // no thread to be had
    return w.post(e.code());
  } catch (const std::bad_alloc&) {
    return w.post(std::make_error_code(std::errc::not_enough_memory));
  }
  w.helper_ = h;
  bump(*h);
}

void futex_threads::cancel(futex_thread_wait& w) {
  std::lock_guard lock(mutex_);
  if (w.helper_ == nullptr || w.cancelled_) return;  // ended already
  w.cancelled_ = true;
  bump(*w.helper_);
}

void futex_threads::run(futex_helper& h) {
  // Process-directed signals go to the program's own threads, not here.
  sigset_t all;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::vector<futex_waitv> words;
  words.reserve(waitv_most);
  std::uint32_t control = 0;
  bool fault = false;  // the last sleep failed for a word that is not mapped or not aligned
  const std::atomic<std::uint32_t>* woken = nullptr;  // the word the last sleep was woken on
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (h.stopping) return;  // shutdown joins this thread and destroys the waits
      // Every wait that can end now ends: cancelled, its word woken (a wake
      // with no store behind it is spurious for the waiter, which re-checks
      // its word) or changed, or, after a fault, its own wait that does not
      // sleep fails. What stays is slept on.
      std::erase_if(h.waits, [fault, woken](futex_thread_wait* w) {
        std::error_code ec;
        if (w->cancelled_) {
          ec = asio::error::operation_aborted;
        } else if (&w->word_ != woken && w->word_.load(std::memory_order_acquire) == w->expected_ &&
                   (!fault || (os::futex_wait(w->word_, w->expected_, std::chrono::nanoseconds(0), ec), !ec))) {
          return false;
        }
        w->helper_ = nullptr;
        w->post(ec);
        return true;
      });
      fault = false;
      woken = nullptr;
      control = h.control.load(std::memory_order_acquire);
      words.clear();
      words.push_back({control, reinterpret_cast<std::uintptr_t>(&h.control), config::futex2_size_u32, 0});
      for (auto* w : h.waits) {
        words.push_back({w->expected_, reinterpret_cast<std::uintptr_t>(&w->word_), config::futex2_size_u32, 0});
      }
    }
    if (!os::futex_waitv_supported()) {
      // One wait at most: sleep on its word, looking at the control word
      // every control_check; or on the control word alone.
      const auto& first = words.back();
      auto* word = reinterpret_cast<std::atomic<std::uint32_t>*>(first.uaddr);
      std::error_code ec;
      os::futex_wait(*word, static_cast<std::uint32_t>(first.val),
                     words.size() > 1 ? std::optional<std::chrono::nanoseconds>(control_check) : std::nullopt, ec);
      continue;
    }
    const long index = ::syscall(SYS_futex_waitv, words.data(), static_cast<unsigned>(words.size()), 0, nullptr,
                                 CLOCK_MONOTONIC);
    fault = index < 0 && errno != EAGAIN && errno != EINTR;
    if (index > 0) woken = reinterpret_cast<std::atomic<std::uint32_t>*>(words[static_cast<std::size_t>(index)].uaddr);
    // A wait's word woken, the control word moved (a wait came, was
    // cancelled, or the service stops), a word no longer held its value
    // (EAGAIN), a signal, or a fault: the pass above sorts each out.
  }
}

void futex_threads::shutdown() {
  std::vector<futex_thread_wait*> waits;
  std::vector<std::unique_ptr<futex_helper>> helpers;
  {
    std::lock_guard lock(mutex_);
    shut_down_ = true;
    leave_inherited_helpers_locked();
    waits.swap(inherited_waits_);
    for (auto& h : helpers_) {
      h->stopping = true;
      waits.insert(waits.end(), h->waits.begin(), h->waits.end());
      h->waits.clear();
      bump(*h);
    }
    helpers.swap(helpers_);
  }
  for (auto& h : helpers) h->thread.join();
  for (auto* w : waits) w->destroy();
}

}  // namespace cohort::uring
