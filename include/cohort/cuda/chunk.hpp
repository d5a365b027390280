// A chunk of device memory that other processes can map: the unit that
// crosses between processes, once per receiver, for device tensors.
#pragma once

#include "cohort/export.hpp"

#include <array>
#include <cstddef>
#include <cstdint>

COHORT_API_BEGIN

namespace cohort::cuda {

/// How a chunk's memory reaches other processes.
enum class sharing {
  /// cuMemCreate with a POSIX file descriptor handle: a descriptor crosses
  /// (inheritance, SCM_RIGHTS, pidfd_getfd) and the receiver imports and
  /// maps it. The memory lives while any process holds a descriptor for it
  /// or a chunk of it, whichever process made it: the kernel and the
  /// driver count.
  file_descriptor,
  /// cudaMalloc with cudaIpcGetMemHandle: 64 bytes cross, which the
  /// receiver opens with cudaIpcOpenMemHandle. The memory lives as long as
  /// the chunk of the process that made it: receivers must be done first.
  /// For devices or drivers without file_descriptor.
  ipc_handle,
};

/// Whether device `device` can make file_descriptor chunks (its attributes
/// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
/// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED). Throws
/// no_device, std::invalid_argument for an index out of range, or error.
bool supports_file_descriptors(int device);
/// file_descriptor where the device supports it, else ipc_handle.
sharing preferred_sharing(int device);
/// The size every chunk of `how` on `device` is a multiple of: for
/// file_descriptor the driver's minimum granularity for such an allocation
/// (cuMemGetAllocationGranularity), for ipc_handle 2 MiB, the size of
/// device memory's large pages, so that both kinds carve alike. Throws
/// no_device, std::invalid_argument or error.
std::size_t granularity(int device, sharing how);

/// What crosses for an ipc_handle chunk (a cudaIpcMemHandle_t).
struct ipc_memory_handle {
  std::array<std::byte, 64> bytes{};
};

/// Device memory mapped in this process, readable and writable by its
/// device: made here (create) or another process's (import, open). Moving
/// leaves the source empty; destruction unmaps it and lets go of this
/// process's hold (cuMemUnmap, cuMemAddressFree, cuMemRelease; cudaFree;
/// cudaIpcCloseMemHandle), with the device's context current for the call
/// and the thread's current device restored. Not for sharing between
/// threads without a lock; any one thread may use it.
class chunk {
 public:
  /// Makes `size` bytes, rounded up to granularity(device, how), on device
  /// `device`. Throws std::invalid_argument for size 0 or a bad index,
  /// no_device, or error: out of memory names the size asked for and the
  /// device's free memory.
  static chunk create(int device, std::size_t size, sharing how);
  /// As create(device, size, preferred_sharing(device)).
  static chunk create(int device, std::size_t size);
  /// Maps on `device` the file_descriptor chunk of `size` bytes (its size
  /// in the process that made it) for which another process exported
  /// `fd`. `fd` stays the caller's, who may close it at once. Throws
  /// std::invalid_argument for a size that is 0 or not a multiple of the
  /// granularity, no_device, or error.
  static chunk import(int device, int fd, std::size_t size);
  /// Opens on `device` the ipc_handle chunk of `size` bytes for which
  /// another process made `handle`: cudaIpcOpenMemHandle (which refuses the
  /// process that made it). Throws std::invalid_argument, no_device, or
  /// error.
  static chunk open(int device, const ipc_memory_handle& handle, std::size_t size);

  /// An empty chunk: no memory, data() null.
  chunk() noexcept = default;
  chunk(chunk&& other) noexcept;
  chunk& operator=(chunk&& other) noexcept;
  chunk(const chunk&) = delete;
  chunk& operator=(const chunk&) = delete;
  ~chunk();

  /// Where it lies in this process's address space: a device pointer.
  void* data() const noexcept { return reinterpret_cast<void*>(address_); }
  std::size_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  sharing kind() const noexcept { return kind_; }
  /// Made by this process (create), not another's (import, open).
  bool made_here() const noexcept { return made_here_; }
  explicit operator bool() const noexcept { return address_ != 0; }

  /// A new descriptor for a file_descriptor chunk
  /// (cuMemExportToShareableHandle), close-on-exec and the caller's to
  /// close; pass it to import() in another process. Throws std::logic_error
  /// for another kind or an empty chunk, error.
  int export_fd() const;
  /// The handle of an ipc_handle chunk made here (cudaIpcGetMemHandle), for
  /// open() in another process. Throws std::logic_error for another kind,
  /// one not made here or an empty chunk, error.
  ipc_memory_handle ipc_handle() const;

 private:
  void release() noexcept;

  std::uintptr_t address_ = 0;  // the mapping, or the cudaMalloc/cudaIpcOpenMemHandle pointer
  std::size_t size_ = 0;
  int device_ = -1;
  sharing kind_ = sharing::file_descriptor;
  bool made_here_ = false;
  // file_descriptor: what is in place, each undone in turn: the allocation
  // held (a CUmemGenericAllocationHandle), the address range reserved, the
  // allocation mapped into it.
  unsigned long long allocation_ = 0;
  bool allocated_ = false;
  bool reserved_ = false;
  bool mapped_ = false;
};

}  // namespace cohort::cuda

COHORT_API_END
