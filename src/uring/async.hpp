// Glue from one small kernel-operation type to an asio asynchronous
// operation: on the ring when the service has it, on asio's reactor
// otherwise. Each operation header (waitid.hpp, poll.hpp, read.hpp) supplies
// a `ring` part (fills the SQE, reads the result) and an `attempt` part (the
// same work done without blocking once the descriptor is ready).
#pragma once

#include "uring/service.hpp"

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/compose.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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
/// `Ring` has `void prepare(io_uring_sqe&)` and `result_type result(int res)`
/// where result_type is `std::pair<std::error_code, T>`; it lives inside this
/// object, so pointers it puts into the SQE stay valid until completion.
template <class Ring, class Handler>
class ring_operation final : public operation {
 public:
  ring_operation(service& owner, Ring ring, Handler handler, asio::any_io_executor fallback)
      : owner_(owner),
        ring_(std::move(ring)),
        handler_(std::move(handler)),
        work_(asio::get_associated_executor(handler_, std::move(fallback))) {}

  /// Submits, with the handler's cancellation slot (if any) mapped to
  /// IORING_OP_ASYNC_CANCEL. Cancellation must be emitted from the handler's
  /// own executor, as for every asio operation.
  void start() {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) {
      slot.assign([this](asio::cancellation_type) { owner_.cancel(*this); });
    }
    owner_.start(*this);
  }

  void prepare(io_uring_sqe& sqe) override { ring_.prepare(sqe); }

  void complete(int res) override {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.clear();
    auto [ec, value] = ring_.result(res);
    auto work = std::move(work_);
    auto handler = std::move(handler_);
    delete this;
    asio::dispatch(work.get_executor(),
                   [handler = std::move(handler), ec = ec, value = std::move(value)]() mutable {
                     std::move(handler)(ec, std::move(value));
                   });
  }

  void destroy() override { delete this; }

 private:
  service& owner_;
  Ring ring_;
  Handler handler_;
  asio::executor_work_guard<asio::associated_executor_t<Handler, asio::any_io_executor>> work_;
};

/// Watches a descriptor the caller owns, on asio's reactor, through a
/// duplicate: several operations may watch one descriptor at once (epoll
/// takes each number once), and the caller's descriptor stays open. asio
/// puts a watched descriptor in non-blocking mode, which the duplicate
/// shares; the original mode is put back when the watch ends.
class borrowed_descriptor {
 public:
  borrowed_descriptor(const asio::any_io_executor& executor, int fd, std::error_code& ec) : sd_(executor) {
    flags_ = ::fcntl(fd, F_GETFL);
    int copy = flags_ < 0 ? -1 : ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (copy < 0) {
      ec.assign(errno, std::system_category());
      return;
    }
    sd_.assign(copy, ec);
    if (ec) ::close(copy);
  }
  borrowed_descriptor(const borrowed_descriptor&) = delete;
  borrowed_descriptor& operator=(const borrowed_descriptor&) = delete;
  ~borrowed_descriptor() {
    if (!sd_.is_open()) return;
    ::fcntl(sd_.native_handle(), F_SETFL, flags_);
    std::error_code ignored;
    sd_.close(ignored);
  }
  asio::posix::stream_descriptor& get() { return sd_; }

 private:
  asio::posix::stream_descriptor sd_;
  int flags_ = -1;
};

/// The reactor path: wait until `fd` is ready for `wait`, then run `attempt`,
/// which returns the result or nullopt to wait again (a spurious wake-up).
template <class Attempt>
class reactor_operation {
 public:
  using value_type = typename std::invoke_result_t<Attempt&>::value_type::second_type;

  reactor_operation(const asio::any_io_executor& executor, int fd,
                    asio::posix::descriptor_base::wait_type wait, Attempt attempt)
      : executor_(executor), fd_(fd), wait_(wait), attempt_(std::move(attempt)) {}

  template <class Self>
  void operator()(Self& self) {
    std::error_code ec;
    sd_ = std::make_unique<borrowed_descriptor>(executor_, fd_, ec);
    if (ec) return finish(self, ec, value_type{});
    sd_->get().async_wait(wait_, std::move(self));
  }

  template <class Self>
  void operator()(Self& self, std::error_code ec) {
    if (ec) return finish(self, ec, value_type{});
    if (auto result = attempt_()) return finish(self, result->first, std::move(result->second));
    sd_->get().async_wait(wait_, std::move(self));
  }

 private:
  template <class Self>
  void finish(Self& self, std::error_code ec, value_type value) {
    sd_.reset();
    self.complete(ec, std::move(value));
  }

  asio::any_io_executor executor_;
  std::unique_ptr<borrowed_descriptor> sd_;
  int fd_;
  asio::posix::descriptor_base::wait_type wait_;
  Attempt attempt_;
};

/// Starts an operation that completes with `void(std::error_code, T)`:
/// `ring` on the ring when `on_ring`, otherwise `attempt` after readiness of
/// `fd` on the reactor. The initiation owns copies of everything: tokens
/// such as use_awaitable run it only later, when the result is awaited.
template <class T, class Ring, class Attempt, class Token>
auto async_start(const asio::any_io_executor& executor, bool on_ring, Ring ring, int fd,
                 asio::posix::descriptor_base::wait_type wait, Attempt attempt, Token&& token) {
  return asio::async_initiate<Token, void(std::error_code, T)>(
      [executor, on_ring, ring = std::move(ring), fd, wait,
       attempt = std::move(attempt)](auto handler) mutable {
        using handler_type = decltype(handler);
        if (on_ring) {
          auto* op = new ring_operation<Ring, handler_type>(service_of(executor), std::move(ring),
                                                            std::move(handler), executor);
          op->start();
        } else {
          asio::async_compose<handler_type, void(std::error_code, T)>(
              reactor_operation<Attempt>(executor, fd, wait, std::move(attempt)), handler,
              executor);
        }
      },
      token);
}

}  // namespace cohort::uring
