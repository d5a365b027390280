// Events that order one process's device work after another's: the
// producer records one after its writes, a receiver's stream waits on it.
#pragma once

#include "cohort/completion_token.hpp"
#include "cohort/encoding.hpp"
#include "cohort/export.hpp"

#include <asio/async_result.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <vector>
#include <exception>
#include <memory>
#include <utility>

// CUDA's stream and event types, whose pointers cudaStream_t (CUstream) and
// cudaEvent_t (CUevent) are: declared here so this header needs no CUDA
// header of its own.
struct CUstream_st;
struct CUevent_st;

COHORT_API_BEGIN

namespace cohort::cuda {

/// What crosses for an event (a cudaIpcEventHandle_t).
struct ipc_event_handle {
  std::array<std::byte, 64> bytes{};
};

namespace detail {
/// What an asynchronous wait completes: called once, from a thread of this
/// layer, with the wait's failure or null.
struct event_waiter {
  virtual ~event_waiter() = default;
  virtual void done(std::exception_ptr error) = 0;
};

/// Completes `Handler` on its associated executor.
template <class Handler>
struct posting_waiter final : event_waiter {
  Handler handler;
  asio::executor_work_guard<asio::associated_executor_t<Handler>> work;
  explicit posting_waiter(Handler&& h)
      : handler(std::move(h)), work(asio::make_work_guard(asio::get_associated_executor(handler))) {}
  void done(std::exception_ptr error) override {
    auto executor = work.get_executor();
    asio::post(executor, [h = std::move(handler), error]() mutable { std::move(h)(error); });
    work.reset();
  }
};

/// Starts a wait: `enroll(waiter)` takes the waiter (moves it out) once
/// nothing is left that could throw. A failure before that completes the
/// handler with it: thrown from the initiation, it would end the program
/// under use_awaitable, whose initiation runs where no caller can catch.
template <class Token, class Register>
auto initiate_wait(Token&& token, Register&& enroll) {
  return asio::async_initiate<Token, completion_signature<void>>(
      [enroll = std::forward<Register>(enroll)](auto handler) mutable {
        std::unique_ptr<event_waiter> waiter =
            std::make_unique<posting_waiter<decltype(handler)>>(std::move(handler));
        try {
          enroll(waiter);
        } catch (...) {
          if (!waiter) throw;  // taken: the handler is no longer here to tell
          waiter->done(std::current_exception());
        }
      },
      token);
}
}  // namespace detail

/// An interprocess event, timing disabled (cudaEventInterprocess |
/// cudaEventDisableTiming): made here, or opened from another process's
/// ipc_handle(). Recorded in either process, it may be waited on in either:
/// a record captures the work queued on a stream so far, and a wait or
/// synchronize waits for the last record made before it, in whichever
/// process. The event made here must outlive every process's use of its
/// handle (CUDA: operations on an opened event after the maker destroyed
/// it are undefined). Copies share the event; moving leaves the source
/// empty; the last copy's destruction destroys this process's event
/// (cudaEventDestroy). Every call that fails throws error.
class event {
 public:
  /// An empty event.
  event() noexcept = default;
  /// A new event on device `device`. Throws no_device,
  /// std::invalid_argument for an index out of range, or error.
  explicit event(int device);
  /// Opens on `device` the event for which another process made `handle`
  /// (cudaIpcOpenEventHandle); not in the process that made it.
  static event from_ipc_handle(int device, const ipc_event_handle& handle);

  /// Copies are the same event: a record through one is waited on through
  /// all, and the CUDA event is destroyed with the last copy.
  event(const event&) = default;
  event& operator=(const event&) = default;
  event(event&& other) noexcept;
  event& operator=(event&& other) noexcept;
  ~event() = default;

  /// Captures the work queued so far on `stream`, a stream of the event's
  /// device (null: that device's legacy default stream); returns at once.
  void record(CUstream_st* stream);
  /// Makes the work queued on `stream` after this call wait until the work
  /// captured by the event's last record is done (cudaStreamWaitEvent);
  /// returns at once. `stream` may belong to another device (null: the
  /// event's device's legacy default stream).
  void wait(CUstream_st* stream) const;
  /// Blocks the calling thread until the work captured by the last record
  /// is done (cudaEventSynchronize).
  void synchronize() const;
  /// Completes `token` (void(std::exception_ptr); an awaitable by default)
  /// once the work captured by the last record is done, blocking no thread:
  /// a thread of this layer polls the event and completes the handler on
  /// its associated executor, with error when the event reports a failure.
  /// The wait holds a copy of the event; it cannot be cancelled.
  /// An empty event (std::logic_error) or no device (no_device) is thrown
  /// by this call, before any wait starts.
  template <completion_token_of<void> Token = default_token>
  auto async_wait(Token&& token = {}) const {
    check_waitable();
    // A copy: a token that starts the wait later (use_awaitable, deferred)
    // may outlive this object.
    return detail::initiate_wait(std::forward<Token>(token), [self = *this](std::unique_ptr<detail::event_waiter>& w) {
      self.when_done(w);
    });
  }
  /// Whether the work captured by the last record is done (cudaEventQuery);
  /// true for an event never recorded.
  bool query() const;
  /// What another process opens this event by: cudaIpcGetEventHandle's
  /// for an event made here; for an opened one, the handle it was opened
  /// from (CUDA gives handles only for events made interprocess, which an
  /// opened event is not), so that it may be passed on.
  ipc_event_handle ipc_handle() const;

  /// The cudaEvent_t, this object's still.
  CUevent_st* native_handle() const noexcept { return event_.get(); }
  /// Throws std::logic_error for an empty event, no_device where there is
  /// none, naming async_wait.
  void check_waitable() const;
  /// async_wait's work: takes `waiter`, which is told once the last
  /// record's work is done. Throws as check_waitable(), `waiter` left.
  void when_done(std::unique_ptr<detail::event_waiter>& waiter) const;
  int device() const noexcept { return device_; }
  /// Opened from another process's handle, not made here.
  bool opened() const noexcept { return opened_; }
  explicit operator bool() const noexcept { return event_ != nullptr; }

 private:
  std::shared_ptr<CUevent_st> event_;
  int device_ = -1;
  bool opened_ = false;
  ipc_event_handle opened_from_;  // an opened event's maker's handle
};

}  // namespace cohort::cuda

namespace cohort::detail {

/// A cuda::event crosses (as an entry point's argument, through a queue) as
/// its maker's pid, its device's UUID and its IPC handle; the receiver
/// opens it on its own index of that device (event::from_ipc_handle). The
/// event made here must outlive every receiver's use of it, as for
/// ipc_handle(). An empty event crosses as one byte. A receiver with no
/// CUDA driver or no device at all gets cuda::no_device, as for a device
/// tensor; one that is the event's maker, does not see its device, or
/// cannot open it gets a decode_error.
template <>
struct handle_codec<cuda::event> {
  static std::string signature() { return "E"; }
  static constexpr std::size_t handle_size = 1 + 4 + 16 + 64;
  static std::size_t size_bound(const cuda::event&) noexcept { return handle_size; }
  static void write(std::vector<std::byte>& out, const cuda::event& value);
  static cuda::event read(reader& in);
};

}  // namespace cohort::detail

COHORT_API_END
