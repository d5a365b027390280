// Interprocess events: the runtime's cudaEventInterprocess events, with
// timing disabled as CUDA requires of them.
#include "cohort/cuda/event.hpp"

#include "cohort/cuda/device.hpp"
#include "cohort/cuda/error.hpp"
#include "cuda/driver.hpp"
#include "cuda/poller.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace cohort::cuda {
namespace {

static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(ipc_event_handle::bytes));

std::string describe(const char* entry, int device) { return fmt::format("{}: event on device {}", entry, device); }

// The CUDA event `e` of `device`, destroyed with the last copy that holds
// it, on whichever thread that is: with its device's context current, as
// every call here makes it, since on a thread with none the runtime would
// make device 0's. An event recorded and not yet complete is destroyed at
// once, its resources freed by the driver when the work completes.
std::shared_ptr<CUevent_st> owned(cudaEvent_t e, int device) {
  return std::shared_ptr<CUevent_st>(e, [device](CUevent_st* made) {
    const detail::device_guard current(device);
    std::ignore = cudaEventDestroy(made);
  });
}

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
  event_ = owned(made, device);
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
  e.event_ = owned(opened, device);
  e.device_ = device;
  e.opened_ = true;
  e.opened_from_ = handle;
  return e;
}

event::event(event&& other) noexcept
    : event_(std::move(other.event_)),
      device_(std::exchange(other.device_, -1)),
      opened_(std::exchange(other.opened_, false)),
      opened_from_(other.opened_from_) {}

event& event::operator=(event&& other) noexcept {
  if (this != &other) {
    event_ = std::move(other.event_);
    device_ = std::exchange(other.device_, -1);
    opened_ = std::exchange(other.opened_, false);
    opened_from_ = other.opened_from_;
  }
  return *this;
}

void event::record(CUstream_st* stream) {
  constexpr const char* entry = "cohort::cuda::event::record";
  check_usable(event_.get(), entry);
  const auto context = describe(entry, device_);
  // The event's device current: a null stream is its default stream.
  const detail::device_guard current(device_, context);
  detail::check(cudaEventRecord(event_.get(), stream), "cudaEventRecord", context);
}

void event::wait(CUstream_st* stream) const {
  constexpr const char* entry = "cohort::cuda::event::wait";
  check_usable(event_.get(), entry);
  const auto context = describe(entry, device_);
  // As record(): a null stream is the event's device's default stream.
  const detail::device_guard current(device_, context);
  detail::check(cudaStreamWaitEvent(stream, event_.get(), 0), "cudaStreamWaitEvent", context);
}

void event::synchronize() const {
  constexpr const char* entry = "cohort::cuda::event::synchronize";
  check_usable(event_.get(), entry);
  const auto context = describe(entry, device_);
  const detail::device_guard current(device_, context);
  detail::check(cudaEventSynchronize(event_.get()), "cudaEventSynchronize", context);
}

void event::check_waitable() const { check_usable(event_.get(), "cohort::cuda::event::async_wait"); }

void event::when_done(std::unique_ptr<detail::event_waiter>& waiter) const {
  check_waitable();
  detail::watch_event(device_, event_.get(), event_, std::move(waiter));
}

bool event::query() const {
  constexpr const char* entry = "cohort::cuda::event::query";
  check_usable(event_.get(), entry);
  const auto context = describe(entry, device_);
  const detail::device_guard current(device_, context);
  const cudaError_t done = cudaEventQuery(event_.get());
  if (done == cudaErrorNotReady) return false;
  detail::check(done, "cudaEventQuery", context);
  return true;
}

ipc_event_handle event::ipc_handle() const {
  constexpr const char* entry = "cohort::cuda::event::ipc_handle";
  check_usable(event_.get(), entry);
  if (opened_) return opened_from_;
  const auto context = describe(entry, device_);
  const detail::device_guard current(device_, context);
  cudaIpcEventHandle_t raw{};
  detail::check(cudaIpcGetEventHandle(&raw, event_.get()), "cudaIpcGetEventHandle", context);
  ipc_event_handle handle;
  std::memcpy(handle.bytes.data(), &raw, sizeof raw);
  return handle;
}

}  // namespace cohort::cuda

namespace cohort::detail {

void handle_codec<cuda::event>::write(std::vector<std::byte>& out, const cuda::event& value) {
  if (!value) {
    out.push_back(std::byte{0});
    return;
  }
  // Opened events are passed on as their maker made them, by the handle
  // they were opened from (ipc_handle()): the same in every process.
  const auto handle = value.ipc_handle();
  const auto id = cuda::device_uuid(value.device());
  const auto maker = static_cast<std::uint32_t>(value.opened() ? 0 : ::getpid());
  out.push_back(std::byte{1});
  const auto* pid = reinterpret_cast<const std::byte*>(&maker);
  out.insert(out.end(), pid, pid + sizeof maker);
  for (auto b : id.bytes) out.push_back(static_cast<std::byte>(b));
  out.insert(out.end(), handle.bytes.begin(), handle.bytes.end());
}

cuda::event handle_codec<cuda::event>::read(reader& in) {
  const auto kind = std::to_integer<unsigned>(in.next());
  if (kind == 0) return {};
  if (kind != 1) throw decode_error(fmt::format("cohort::decode: an event handle of kind {}", kind));
  if (in.left() < handle_size - 1) throw decode_error("cohort::decode: the input ends early");
  std::uint32_t maker = 0;
  std::memcpy(&maker, in.take(sizeof maker).data(), sizeof maker);
  cuda::uuid id;
  std::memcpy(id.bytes.data(), in.take(id.bytes.size()).data(), id.bytes.size());
  cuda::ipc_event_handle handle;
  std::memcpy(handle.bytes.data(), in.take(handle.bytes.size()).data(), handle.bytes.size());
  if (maker != 0 && static_cast<pid_t>(maker) == ::getpid()) {
    throw decode_error("cohort::decode: an event received by the process that made it, which cannot open it: use the event itself");
  }
  const auto device = cuda::find_device(id);
  if (!device) {
    throw decode_error(fmt::format(
        "cohort::decode: an event on device {}, which this process does not see (see CUDA_VISIBLE_DEVICES)",
        cuda::to_string(id)));
  }
  try {
    return cuda::event::from_ipc_handle(*device, handle);
  } catch (const cuda::error& e) {
    throw decode_error(std::string("cohort::decode: an event that does not open: ") + e.what());
  }
}

}  // namespace cohort::detail
