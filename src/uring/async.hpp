// Glue from one small kernel-operation type to an asio asynchronous
// operation: on the ring when the service has it, on asio's reactor
// otherwise. Each operation header (waitid.hpp, poll.hpp, read.hpp) supplies
// a `ring` part (fills the SQE, reads the result) and an `attempt` part (the
// same work done without blocking once the descriptor is ready).
#pragma once

#include "os/descriptor_limit.hpp"
#include "os/owned_fd.hpp"
#include "uring/service.hpp"

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/compose.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/append.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cohort::uring {

/// A completion's `res` as an error: -ECANCELED is asio's operation_aborted
/// (cancellation is not a failure), other negative values are errno codes.
inline std::error_code error_from_res(int res) {
  if (res >= 0) return {};
  if (res == -ECANCELED) return asio::error::operation_aborted;
  return {-res, std::system_category()};
}

/// An operation on the ring that ends by calling an asio handler.
/// `Ring` has `void prepare(io_uring_sqe&)` and `std::pair<std::error_code, T>
/// result(int res)`, and may have `bool orphaned(int res) const`; it lives
/// inside this object, so pointers it puts into the SQE stay valid until
/// completion.
template <class Ring, class Handler>
class ring_operation final : public operation {
 public:
  ring_operation(service& owner, Ring ring, Handler handler, asio::any_io_executor fallback)
      : owner_(owner),
        ring_(std::move(ring)),
        handler_(std::move(handler)),
        work_(asio::get_associated_executor(handler_, std::move(fallback))) {}

  /// Submits, with the handler's cancellation slot (if any) mapped to
  /// IORING_OP_ASYNC_CANCEL. As for every asio operation, cancellation must
  /// be emitted from the handler's own executor: the slot is cleared, and
  /// this object freed, only there.
  void start() {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) {
      slot.assign([this](asio::cancellation_type) { owner_.cancel(*this); });
    }
    owner_.start(*this);
  }

  void prepare(io_uring_sqe& sqe) override { ring_.prepare(sqe); }

  bool orphaned(int res) const override {
    if constexpr (requires(const Ring& r) { r.orphaned(res); }) return ring_.orphaned(res);
    return false;
  }

  void complete(int res) override {
    auto [ec, value] = ring_.result(res);
    auto executor = work_.get_executor();
    asio::dispatch(executor, finisher{this, ec, std::move(value)});
  }

  void destroy() override {
    clear_slot();
    delete this;
  }

 private:
  using value_type = decltype(std::declval<Ring&>().result(0).second);

  // Runs on the handler's executor: clears the slot there, frees the
  // operation, then calls the handler. Destroyed uncalled (the io_context
  // went first), it frees the operation without calling anything.
  struct finisher {
    ring_operation* op;
    std::error_code ec;
    value_type value;

    finisher(ring_operation* o, std::error_code e, value_type v) : op(o), ec(e), value(std::move(v)) {}
    finisher(finisher&& other) noexcept
        : op(std::exchange(other.op, nullptr)), ec(other.ec), value(std::move(other.value)) {}
    finisher& operator=(finisher&&) = delete;
    ~finisher() {
      if (op != nullptr) op->destroy();
    }
    void operator()() {
      ring_operation* self = std::exchange(op, nullptr);
      self->clear_slot();
      auto handler = std::move(self->handler_);
      auto work = std::move(self->work_);
      delete self;
      std::move(handler)(ec, std::move(value));
    }
  };

  void clear_slot() {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.clear();
  }

  service& owner_;
  Ring ring_;
  Handler handler_;
  asio::executor_work_guard<asio::associated_executor_t<Handler, asio::any_io_executor>> work_;
};

/// The readiness of one descriptor for the reactor path, without touching
/// it: a private epoll set holds the caller's descriptor with the exact event
/// mask, and asio watches that set, which reads ready while the descriptor
/// is. The caller's file flags stay as they are (asio would make a
/// descriptor it watches non-blocking), and any number of operations may
/// watch one descriptor at once, up to the kernel's limit on nested epoll
/// wake-up paths: beyond 500 at once on one descriptor the watch fails with
/// EINVAL. Regular files, which epoll refuses, are always ready.
///
/// Where the operation can open a descriptor of its own on the same object
/// (a second pidfd of a process), asio watches that one directly instead:
/// its flags are the watch's to change, and a wake-up passes through one
/// epoll set instead of two.
class readiness_watch {
 public:
  readiness_watch(const asio::any_io_executor& executor, int fd, short events, std::error_code& ec)
      : sd_(executor) {
    int set = ::epoll_create1(EPOLL_CLOEXEC);
    if (set < 0) {
      ec.assign(errno, std::system_category());
      return;
    }
    epoll_event ev{};
    ev.events = static_cast<std::uint32_t>(events);
    if (::epoll_ctl(set, EPOLL_CTL_ADD, fd, &ev) != 0) {
      if (errno == EPERM) {
        always_ready_ = true;
      } else {
        ec.assign(errno, std::system_category());
        ::close(set);
        return;
      }
    }
    own(set, ec);
  }
  /// Watches `own`, a descriptor the watch takes over, for reading.
  readiness_watch(const asio::any_io_executor& executor, os::owned_fd own_fd, std::error_code& ec)
      : sd_(executor) {
    own(own_fd.release(), ec);
  }
  readiness_watch(const readiness_watch&) = delete;
  readiness_watch& operator=(const readiness_watch&) = delete;

  bool always_ready() const noexcept { return always_ready_; }
  asio::posix::stream_descriptor& get() { return sd_; }

 private:
  void own(int fd, std::error_code& ec) {
    sd_.assign(fd, ec);
    if (ec) ::close(fd);
  }

  asio::posix::stream_descriptor sd_;  // owns the epoll set or the descriptor of its own
  bool always_ready_ = false;
};

/// The reactor path: wait until `fd` has one of `events`, then run
/// `attempt`, which returns the result or nullopt to wait again (a spurious
/// wake-up). An attempt with `once_ready()` says its result itself when the
/// watch reads ready: readiness then needs no system call to confirm.
///
/// A watch takes a descriptor. Where none is left (EMFILE, ENFILE: a
/// process waiting for hundreds of children under the usual soft limit of
/// 1024 descriptors, two of them each on this path), the operation polls
/// instead: it looks at `fd` with poll(2) on a timer, from 1 ms apart
/// doubling to 100 ms, and tries for a watch again at each look, so that it
/// goes back to waiting on the reactor once a descriptor is free. Slower to
/// notice, never a failure.
template <class Attempt>
class reactor_operation {
 public:
  using value_type = typename std::invoke_result_t<Attempt&>::value_type::second_type;

  reactor_operation(const asio::any_io_executor& executor, int fd, short events, Attempt attempt)
      : executor_(executor), fd_(fd), events_(events), attempt_(std::move(attempt)) {}

  template <class Self>
  void operator()(Self& self) {
    // Every type of cancellation ends the wait, as on the ring: what reaches
    // it is for the awaiting coroutine's filter to decide (async_compose
    // would let terminal ones alone through).
    self.reset_cancellation_state(asio::enable_total_cancellation());
    if (const auto ec = watch_now(); ec) {
      if (out_of_descriptors(ec)) return poll_later(self);
      return fail_soon(self, ec);
    }
    wait(self);
  }

  template <class Self>
  void operator()(Self& self, std::error_code ec) {
    if (ec) return finish(self, ec, value_type{});
    if (!watch_) return look(self);  // polling: the timer ran out
    if constexpr (requires(const Attempt& a) { a.once_ready(); }) {
      if (!cancelled(self)) {
        auto result = attempt_.once_ready();
        return finish(self, result.first, std::move(result.second));
      }
    }
    if (auto result = attempt_()) return finish(self, result->first, std::move(result->second));
    if (cancelled(self)) return finish(self, asio::error::operation_aborted, value_type{});
    wait(self);
  }

 private:
  static constexpr std::chrono::milliseconds first_poll{1}, longest_poll{100};

  static bool out_of_descriptors(std::error_code ec) {
    return ec.category() == std::system_category() && os::out_of_descriptors(ec.value());
  }

  // Sets up watch_; the error when it could not be (watch_ then empty).
  std::error_code watch_now() {
    std::error_code ec;
    try {
      watch_ = make_watch(ec);
    } catch (const std::system_error& e) {  // asio could not bring up its reactor
      ec = e.code();
    }
    if (ec) watch_.reset();
    return ec;
  }

  // A cancellation that came while no wait of ours was pending (between a
  // wake-up and its handler): asio resets the slot at each resumption and
  // only records it, so it is looked for before waiting again.
  template <class Self>
  static bool cancelled(Self& self) {
    return self.get_cancellation_state().cancelled() != asio::cancellation_type::none;
  }

  // Polling: one look at `fd`, with the attempt when it is ready; else
  // another try for a watch, else another look later.
  template <class Self>
  void look(Self& self) {
    pollfd p{fd_, events_, 0};
    if (::poll(&p, 1, 0) != 0) {  // ready, or poll failed: the attempt says which
      if (auto result = attempt_()) return finish(self, result->first, std::move(result->second));
    }
    if (cancelled(self)) return finish(self, asio::error::operation_aborted, value_type{});
    const auto ec = watch_now();
    if (!ec) return wait(self);
    if (!out_of_descriptors(ec)) return finish(self, ec, value_type{});
    poll_later(self);
  }

  template <class Self>
  void poll_later(Self& self) {
    if (!timer_) {
      timer_ = std::make_unique<asio::steady_timer>(executor_);
      interval_ = first_poll;
    } else {
      interval_ = std::min(interval_ * 2, longest_poll);
    }
    timer_->expires_after(interval_);
    timer_->async_wait(std::move(self));
  }

  // A watch on a descriptor of the operation's own when `Attempt` can open
  // one (`own_descriptor()`, -1 when it cannot), else on a private epoll set.
  std::unique_ptr<readiness_watch> make_watch(std::error_code& ec) {
    if constexpr (requires(const Attempt& a) { a.own_descriptor(); }) {
      // Owned from here, so that a throw before the watch holds it closes it.
      if (os::owned_fd own(attempt_.own_descriptor()); own.get() >= 0) {
        return std::make_unique<readiness_watch>(executor_, std::move(own), ec);
      }
    }
    return std::make_unique<readiness_watch>(executor_, fd_, events_, ec);
  }

  template <class Self>
  void wait(Self& self) {
    if (watch_->always_ready()) {
      auto executor = executor_;  // copied before `self`, which holds it, moves
      asio::post(executor, asio::experimental::append(std::move(self), std::error_code{}));
    } else {
      watch_->get().async_wait(asio::posix::descriptor_base::wait_read, std::move(self));
    }
  }

  // Fails with `ec` at the next turn of the loop (the resumption finishes
  // on an error): never from within the initiating call.
  template <class Self>
  void fail_soon(Self& self, std::error_code ec) {
    auto executor = executor_;  // copied before `self`, which holds it, moves
    asio::post(executor, asio::experimental::append(std::move(self), ec));
  }

  // The watch goes after the handler has run: its descriptors' removal
  // and close are not on the way to the caller.
  template <class Self>
  void finish(Self& self, std::error_code ec, value_type value) {
    auto watch = std::move(watch_);
    self.complete(ec, std::move(value));
  }

  asio::any_io_executor executor_;
  int fd_;
  short events_;
  Attempt attempt_;
  std::unique_ptr<readiness_watch> watch_;
  std::unique_ptr<asio::steady_timer> timer_;  // while polling
  std::chrono::milliseconds interval_{};
};

/// Starts an operation that completes with `void(std::error_code, T)`:
/// `ring` on the ring when `on_ring`, otherwise `attempt` once `fd` has one
/// of `events` (poll(2) bits) on the reactor. Either way an `attempt` that
/// declares `never_blocks` is tried once first, and a result completes the
/// operation at the next turn of the loop. The initiation owns copies of
/// everything: tokens such as use_awaitable run it only later, when the
/// result is awaited.
template <class T, class Ring, class Attempt, class Token>
auto async_start(const asio::any_io_executor& executor, bool on_ring, Ring ring, int fd, short events,
                 Attempt attempt, Token&& token) {
  return asio::async_initiate<Token, void(std::error_code, T)>(
      [executor, on_ring, ring = std::move(ring), fd, events,
       attempt = std::move(attempt)](auto handler) mutable {
        using handler_type = decltype(handler);
        // Tried once first where the attempt cannot block: what is ready
        // already (a child that has exited, a pipe that holds data)
        // completes without the ring's round trip, or a watch on the
        // reactor, which costs a descriptor and four or five system calls.
        // A read is not: its attempt falls back to a plain read where
        // RWF_NOWAIT is refused (a pty, inotify), which would block here.
        if constexpr (requires { Attempt::never_blocks; }) {
          if (auto result = attempt()) {
            asio::post(executor, asio::experimental::append(std::move(handler), result->first, std::move(result->second)));
            return;
          }
        }
        if (on_ring) {
          auto* op = new ring_operation<Ring, handler_type>(service_of(executor), std::move(ring),
                                                            std::move(handler), executor);
          op->start();
        } else {
          asio::async_compose<handler_type, void(std::error_code, T)>(
              reactor_operation<Attempt>(executor, fd, events, std::move(attempt)), handler, executor);
        }
      },
      token);
}

}  // namespace cohort::uring
