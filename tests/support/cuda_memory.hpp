// Device memory seen from the tests of the cuda layer: filling and checking
// chunks through the runtime, mapping a chunk that crossed from another
// process, and whether a test gave back the memory it took.
#pragma once

#include <cohort/cuda/chunk.hpp>
#include <cohort/cuda/device.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cohort::test {

/// Throws for a runtime call that failed.
inline void cuda_check(cudaError_t result, const char* call) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(result));
}

/// Sets every 32-bit word of `memory` (on `device`) to `word`.
inline void fill_words(int device, void* memory, std::size_t size, std::uint32_t word) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  const std::vector<std::uint32_t> words(size / sizeof word, word);
  cuda_check(cudaMemcpy(memory, words.data(), size, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
inline void fill_words(const cuda::chunk& c, std::uint32_t word) { fill_words(c.device(), c.data(), c.size(), word); }

/// How many 32-bit words of `memory` (on `device`) are not `word`.
inline std::uint64_t words_other_than(int device, const void* memory, std::size_t size, std::uint32_t word) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  std::vector<std::uint32_t> words(size / sizeof word);
  cuda_check(cudaMemcpy(words.data(), memory, size, cudaMemcpyDeviceToHost), "cudaMemcpy from the device");
  return static_cast<std::uint64_t>(std::count_if(words.begin(), words.end(), [word](auto w) { return w != word; }));
}
inline std::uint64_t words_other_than(const cuda::chunk& c, std::uint32_t word) {
  return words_other_than(c.device(), c.data(), c.size(), word);
}

/// The index, in this process, of the device whose UUID is `id` (to_string's form).
inline int device_by_uuid(const std::string& id) {
  const auto parsed = cuda::parse_uuid(id);
  if (!parsed) throw std::invalid_argument("not a UUID: " + id);
  const auto device = cuda::find_device(*parsed);
  if (!device) throw std::runtime_error("no device " + id + " in this process");
  return *device;
}

/// What crosses for a chunk: its kind (a cuda::sharing), its size, and its
/// descriptor (file_descriptor: kept open for the receiver) or its handle's
/// bytes (ipc_handle).
struct chunk_ticket {
  int kind = 0;
  std::uint64_t size = 0;
  int fd = -1;
  std::vector<std::byte> handle;
};

/// A ticket for `c`; for a file_descriptor chunk, a new descriptor the
/// caller closes.
inline chunk_ticket ticket_for(const cuda::chunk& c) {
  chunk_ticket t{static_cast<int>(c.kind()), c.size(), -1, {}};
  if (c.kind() == cuda::sharing::file_descriptor) {
    t.fd = c.export_fd();
  } else {
    const auto h = c.ipc_handle();
    t.handle.assign(h.bytes.begin(), h.bytes.end());
  }
  return t;
}

/// Maps on `device` the chunk a ticket names.
inline cuda::chunk chunk_from(int device, int kind, std::uint64_t size, int fd, const std::vector<std::byte>& handle) {
  if (static_cast<cuda::sharing>(kind) == cuda::sharing::file_descriptor) return cuda::chunk::import(device, fd, size);
  cuda::ipc_memory_handle h;
  if (handle.size() != h.bytes.size()) throw std::invalid_argument("an IPC handle of another size");
  std::copy(handle.begin(), handle.end(), h.bytes.begin());
  return cuda::chunk::open(device, h, size);
}

/// The kinds of chunk device `device` can make.
inline std::vector<cuda::sharing> kinds_on(int device) {
  if (cuda::supports_file_descriptors(device)) return {cuda::sharing::file_descriptor, cuda::sharing::ipc_handle};
  return {cuda::sharing::ipc_handle};
}

/// Device memory free on `device` once this process has used each kind of
/// chunk once (the runtime and the driver set up what they keep on first
/// use), for a test to check that it gave back what it took.
class memory_mark {
 public:
  explicit memory_mark(int device) : device_(device) {
    for (auto kind : kinds_on(device)) {
      auto c = cuda::chunk::create(device, 1, kind);
      fill_words(c, 0);
      words_other_than(c, 0);
    }
    free_ = cuda::device_memory(device).free;
  }

  /// Whether the device has at least as much free again. A rank's memory
  /// goes with its process, which the driver may finish tearing down after
  /// the rank was reaped: a few seconds' patience.
  bool given_back() const {
    for (int i = 0; i < 100; ++i) {
      if (cuda::device_memory(device_).free >= free_) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  int device_;
  std::size_t free_ = 0;
};

}  // namespace cohort::test
