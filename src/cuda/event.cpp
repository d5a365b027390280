// Interprocess events: the runtime's cudaEventInterprocess events, with
// timing disabled as CUDA requires of them.
#include "cohort/cuda/event.hpp"

#include "cohort/cuda/error.hpp"
#include "cuda/driver.hpp"
#include "cuda/poller.hpp"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>
#include <utility>

namespace cohort::cuda {
namespace {

static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(ipc_event_handle::bytes));

std::string describe(const char* entry, int device) { return fmt::format("{}: event on device {}", entry, device); }

// Throws std::logic_error for an empty event, no_device where it cannot be
// (an event came from CUDA), naming `entry`.
void check_usable(const CUevent_st* e, const char* entry) {
  if (e == nullptr) throw std::logic_error(fmt::format("{}: an empty event", entry));
  detail::driver(entry);
}

}  // namespace

event::event(int device) {
  constexpr const char* entry = "cohort::cuda::event";
  detail::check_device(device, entry);
  const auto context = describe(entry, device);
  const detail::device_guard current(device, context);
  cudaEvent_t made = nullptr;
  detail::check(cudaEventCreateWithFlags(&made, cudaEventInterprocess | cudaEventDisableTiming),
                "cudaEventCreateWithFlags", context);
  event_ = made;
  device_ = device;
}

event event::from_ipc_handle(int device, const ipc_event_handle& handle) {
  constexpr const char* entry = "cohort::cuda::event::from_ipc_handle";
  detail::check_device(device, entry);
  const auto context = describe(entry, device);
  const detail::device_guard current(device, context);
  cudaIpcEventHandle_t raw{};
  std::memcpy(&raw, handle.bytes.data(), sizeof raw);
  cudaEvent_t opened = nullptr;
  detail::check(cudaIpcOpenEventHandle(&opened, raw), "cudaIpcOpenEventHandle", context);
  event e;
  e.event_ = opened;
  e.device_ = device;
  e.opened_ = true;
  return e;
}

event::event(event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)),
      device_(std::exchange(other.device_, -1)),
      opened_(std::exchange(other.opened_, false)) {}

event& event::operator=(event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
    device_ = std::exchange(other.device_, -1);
    opened_ = std::exchange(other.opened_, false);
  }
  return *this;
}

// An event recorded and not yet complete is destroyed at once, its
// resources freed by the driver when the work completes.
event::~event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void event::record(CUstream_st* stream) {
  constexpr const char* entry = "cohort::cuda::event::record";
  check_usable(event_, entry);
  const auto context = describe(entry, device_);
  // The event's device current: a null stream is its default stream.
  const detail::device_guard current(device_, context);
  detail::check(cudaEventRecord(event_, stream), "cudaEventRecord", context);
}

void event::wait(CUstream_st* stream) const {
  constexpr const char* entry = "cohort::cuda::event::wait";
  check_usable(event_, entry);
  detail::check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent", describe(entry, device_));
}

void event::synchronize() const {
  constexpr const char* entry = "cohort::cuda::event::synchronize";
  check_usable(event_, entry);
  detail::check(cudaEventSynchronize(event_), "cudaEventSynchronize", describe(entry, device_));
}

void event::when_done(std::unique_ptr<detail::event_waiter> waiter) const {
  check_usable(event_, "cohort::cuda::event::async_wait");
  detail::watch_event(device_, event_, false, std::move(waiter));
}

bool event::query() const {
  constexpr const char* entry = "cohort::cuda::event::query";
  check_usable(event_, entry);
  const cudaError_t done = cudaEventQuery(event_);
  if (done == cudaErrorNotReady) return false;
  detail::check(done, "cudaEventQuery", describe(entry, device_));
  return true;
}

ipc_event_handle event::ipc_handle() const {
  constexpr const char* entry = "cohort::cuda::event::ipc_handle";
  check_usable(event_, entry);
  cudaIpcEventHandle_t raw{};
  detail::check(cudaIpcGetEventHandle(&raw, event_), "cudaIpcGetEventHandle", describe(entry, device_));
  ipc_event_handle handle;
  std::memcpy(handle.bytes.data(), &raw, sizeof raw);
  return handle;
}

}  // namespace cohort::cuda
