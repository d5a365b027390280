// Tensors on CUDA devices that cross between processes without a copy: made
// from this process's device arena, sent through queues and as entry point
// arguments as a small record (never a handle or a descriptor per tensor),
// ordered on the receiver's stream after the sender's work by an event.
#pragma once

#include "cohort/cuda/event.hpp"
#include "cohort/export.hpp"
#include "cohort/tensor.hpp"

#include <cstdint>
#include <memory>

struct CUstream_st;

COHORT_API_BEGIN

namespace cohort::cuda {

/// The stream this thread's device work goes on: the copies and fills of
/// this header, the event recorded as a device tensor is sent, and the wait
/// on that event as one is received. Null, the default, is each device's
/// legacy default stream; any other stream must be of the tensor's device.
CUstream_st* current_stream() noexcept;
/// Sets this thread's current stream.
void set_current_stream(CUstream_st* stream) noexcept;

/// A contiguous, uninitialised tensor on device `device` (this process's
/// index), from the device's arena: blocks of 512 B .. 1 MiB carved from
/// shared chunks, larger tensors a chunk each. is_shared() is true: it
/// crosses to other processes as it is. Throws std::invalid_argument for a
/// bad shape or device index, no_device, or error (out of memory names the
/// size asked for and the device's free memory).
tensor empty(int_list shape, dtype type, int device);
/// As empty(), every element `value` converted as tensor::fill_ converts
/// it, set on the current stream.
tensor full(int_list shape, scalar value, dtype type, int device);
/// As full() with 0.
tensor zeros(int_list shape, dtype type, int device);

/// Sets every element of a contiguous device tensor to `value`, on the
/// current stream. Throws std::logic_error for a tensor not on a CUDA
/// device or not contiguous, std::invalid_argument as tensor::fill_.
void fill_(const tensor& t, scalar value);

/// tensor::to and tensor::to_cpu call to_device and to_cpu below, and
/// tensor::clone of a device tensor calls clone, once this library is loaded;
/// tensor::to from one device to another first waits for the current stream
/// of the source (synchronize). The current stream is one per thread: set
/// it to a stream of the device a call works on, or leave it null.

/// A copy on device `device` of a tensor of the CPU or of any device, with
/// the same layout, on the current stream. Throws as empty(), error.
tensor to_device(const tensor& t, int device);
/// A copy in this process's memory, with the same layout; waits for the
/// current stream. A CPU tensor is returned as it is.
tensor to_cpu(const tensor& t);
/// A copy of a device tensor on its device, on the current stream, with
/// the same layout. Throws std::logic_error for a CPU tensor (call
/// tensor::clone), and as empty().
tensor clone(const tensor& t);

/// Blocks until the work queued on the current stream of device `device` is
/// done (cudaStreamSynchronize). Throws error, with any failure of that
/// work.
void synchronize(int device);

namespace detail {
/// Throws as synchronize() for a `device` that cannot be used, naming
/// async_synchronize.
void check_stream_device(int device);
/// async_synchronize's work: records an event on the current stream of
/// `device` and takes `waiter`, told once that work is done. Throws, with
/// `waiter` left, where the work cannot be marked.
void when_stream_done(int device, std::unique_ptr<event_waiter>& waiter);
}  // namespace detail

/// As synchronize(), blocking no thread: completes `token`
/// (void(std::exception_ptr); an awaitable by default) once the work queued
/// so far on the current stream of `device` is done, on the handler's
/// associated executor (event::async_wait). No device to use (no_device,
/// a device number out of range) is thrown by this call; CUDA's failure
/// to mark the work, when the wait starts, completes the token with it.
template <completion_token_of<void> Token = default_token>
auto async_synchronize(int device, Token&& token = {}) {
  detail::check_stream_device(device);
  return detail::initiate_wait(std::forward<Token>(token), [device](std::unique_ptr<detail::event_waiter>& w) {
    detail::when_stream_done(device, w);
  });
}

/// Lets go of the device memory this process keeps for reuse: its arenas'
/// chunks with no block in use (once every receiver of their blocks is
/// done), and its mappings of other processes' chunks that no tensor here
/// uses. Returns how many chunks went. torch's empty_cache. No
/// ipc_collect() is needed for blocks: each comes back to its maker's free
/// list as its receivers let go. A chunk's device memory, though, stays
/// allocated while any process maps it: a receiver unmaps a chunk it no
/// longer uses only if it is a large tensor's own or its maker has ended
/// (as it next maps a new chunk), and keeps a running maker's carved chunk
/// mapped until its own empty_cache(). Until then the maker's
/// empty_cache(), and its retry when out of device memory, let go of the
/// chunk there without giving that memory back to the device.
int empty_cache();

}  // namespace cohort::cuda

COHORT_API_END
