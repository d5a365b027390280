// Chunks of device memory that other processes map: cuMemCreate with a
// POSIX file descriptor handle, reserved and mapped into this process's
// address space; or, where the device cannot, cudaMalloc and the runtime's
// IPC handles.
#include "cohort/cuda/chunk.hpp"

#include "cohort/cuda/error.hpp"
#include "cuda/driver.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <utility>

namespace cohort::cuda {
namespace {

static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(unsigned long long));
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(ipc_memory_handle::bytes));

// ipc_handle chunks' granularity: the large page of device memory.
constexpr std::size_t ipc_granularity = std::size_t{2} << 20;

CUdevice device_handle(const detail::driver_api& api, int device, std::string_view context) {
  CUdevice handle = 0;
  detail::check(api.device_get(&handle, device), "cuDeviceGet", context);
  return handle;
}

// Device memory on `device` that can be exported as a POSIX descriptor.
CUmemAllocationProp exportable_memory(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

int device_attribute(const detail::driver_api& api, CUdevice device, CUdevice_attribute attribute,
                     std::string_view context) {
  int value = 0;
  detail::check(api.device_get_attribute(&value, attribute, device), "cuDeviceGetAttribute", context);
  return value;
}

// What a failed allocation's message says: the size, the device and what
// it has free, when the driver can tell.
std::string allocation_context(const detail::driver_api& api, const char* entry, std::size_t size, int device) {
  std::size_t free = 0;
  std::size_t total = 0;
  if (api.mem_get_info(&free, &total) != CUDA_SUCCESS) {
    return fmt::format("{}: {} on device {}", entry, detail::describe_bytes(size), device);
  }
  return fmt::format("{}: {} on device {}, which has {} free of {}", entry, detail::describe_bytes(size), device,
                     detail::describe_bytes(free), detail::describe_bytes(total));
}

std::size_t granularity_of(const detail::driver_api& api, int device, sharing how, std::string_view context) {
  if (how == sharing::ipc_handle) return ipc_granularity;
  const CUmemAllocationProp prop = exportable_memory(device_handle(api, device, context));
  std::size_t step = 0;
  detail::check(api.mem_get_allocation_granularity(&step, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                "cuMemGetAllocationGranularity", context);
  return step;
}

// Reserves an address range of `size` bytes for `allocation`, maps it
// there and lets `device` read and write it. Each step done is noted in
// `address`, `reserved` and `mapped` as it is, for the chunk to undo.
void map_allocation(const detail::driver_api& api, CUmemGenericAllocationHandle allocation, std::size_t size,
                    CUdevice device, std::string_view context, std::uintptr_t& address, bool& reserved, bool& mapped) {
  CUdeviceptr range = 0;
  detail::check(api.mem_address_reserve(&range, size, 0, 0, 0), "cuMemAddressReserve", context);
  address = static_cast<std::uintptr_t>(range);
  reserved = true;
  detail::check(api.mem_map(range, size, 0, allocation, 0), "cuMemMap", context);
  mapped = true;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  detail::check(api.mem_set_access(range, size, &access, 1), "cuMemSetAccess", context);
}

void check_size(std::size_t size, std::size_t step, const char* entry) {
  if (size == 0 || size % step != 0) {
    throw std::invalid_argument(
        fmt::format("{}: a chunk's size must be a positive multiple of {} bytes, not {}", entry, step, size));
  }
}

}  // namespace

bool supports_file_descriptors(int device) {
  constexpr const char* entry = "cohort::cuda::supports_file_descriptors";
  detail::check_device(device, entry);
  const auto& api = detail::driver(entry);
  const auto context = fmt::format("{}: device {}", entry, device);
  const CUdevice handle = device_handle(api, device, context);
  return device_attribute(api, handle, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, context) != 0 &&
         device_attribute(api, handle, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, context) != 0;
}

sharing preferred_sharing(int device) {
  detail::check_device(device, "cohort::cuda::preferred_sharing");
  return supports_file_descriptors(device) ? sharing::file_descriptor : sharing::ipc_handle;
}

std::size_t granularity(int device, sharing how) {
  constexpr const char* entry = "cohort::cuda::granularity";
  detail::check_device(device, entry);
  return granularity_of(detail::driver(entry), device, how, fmt::format("{}: device {}", entry, device));
}

chunk chunk::create(int device, std::size_t size) {
  detail::check_device(device, "cohort::cuda::chunk::create");
  return create(device, size, preferred_sharing(device));
}

chunk chunk::create(int device, std::size_t size, sharing how) {
  constexpr const char* entry = "cohort::cuda::chunk::create";
  detail::check_device(device, entry);
  if (size == 0) throw std::invalid_argument(fmt::format("{}: a chunk of 0 bytes", entry));
  const auto& api = detail::driver(entry);
  const std::size_t step = granularity_of(api, device, how, fmt::format("{}: device {}", entry, device));
  if (size > SIZE_MAX - (step - 1)) throw std::invalid_argument(fmt::format("{}: {} bytes is too large", entry, size));
  const std::size_t rounded = (size + step - 1) / step * step;
  const auto context = fmt::format("{}: {} on device {}", entry, detail::describe_bytes(rounded), device);
  const detail::device_guard current(device, context);

  chunk c;
  c.size_ = rounded;
  c.device_ = device;
  c.kind_ = how;
  c.made_here_ = true;
  if (how == sharing::ipc_handle) {
    void* memory = nullptr;
    const cudaError_t made = cudaMalloc(&memory, rounded);
    if (made != cudaSuccess) {
      cudaGetLastError();  // the failure is thrown: the runtime's last error need not repeat it
      detail::check(made, "cudaMalloc", allocation_context(api, entry, rounded, device));
    }
    c.address_ = reinterpret_cast<std::uintptr_t>(memory);
    return c;
  }
  const CUmemAllocationProp prop = exportable_memory(device_handle(api, device, context));
  CUmemGenericAllocationHandle allocation = 0;
  const CUresult made = api.mem_create(&allocation, rounded, &prop, 0);
  if (made != CUDA_SUCCESS) detail::check(made, "cuMemCreate", allocation_context(api, entry, rounded, device));
  c.allocation_ = allocation;
  c.allocated_ = true;
  map_allocation(api, allocation, rounded, prop.location.id, context, c.address_, c.reserved_, c.mapped_);
  return c;
}

chunk chunk::import(int device, int fd, std::size_t size) {
  constexpr const char* entry = "cohort::cuda::chunk::import";
  detail::check_device(device, entry);
  if (fd < 0) throw std::invalid_argument(fmt::format("{}: descriptor {}", entry, fd));
  const auto& api = detail::driver(entry);
  check_size(size, granularity_of(api, device, sharing::file_descriptor, fmt::format("{}: device {}", entry, device)),
             entry);
  const auto context =
      fmt::format("{}: {} from descriptor {} on device {}", entry, detail::describe_bytes(size), fd, device);
  const detail::device_guard current(device, context);

  chunk c;
  c.size_ = size;
  c.device_ = device;
  c.kind_ = sharing::file_descriptor;
  CUmemGenericAllocationHandle allocation = 0;
  // The descriptor's number is the handle; the driver takes a reference of
  // its own and leaves the descriptor to the caller.
  detail::check(api.mem_import_from_shareable_handle(&allocation, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                "cuMemImportFromShareableHandle", context);
  c.allocation_ = allocation;
  c.allocated_ = true;
  map_allocation(api, allocation, size, device_handle(api, device, context), context, c.address_, c.reserved_,
                 c.mapped_);
  return c;
}

chunk chunk::open(int device, const ipc_memory_handle& handle, std::size_t size) {
  constexpr const char* entry = "cohort::cuda::chunk::open";
  detail::check_device(device, entry);
  check_size(size, ipc_granularity, entry);
  const auto context = fmt::format("{}: {} on device {}", entry, detail::describe_bytes(size), device);
  const detail::device_guard current(device, context);

  cudaIpcMemHandle_t raw{};
  std::memcpy(&raw, handle.bytes.data(), sizeof raw);
  void* memory = nullptr;
  detail::check(cudaIpcOpenMemHandle(&memory, raw, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle", context);
  chunk c;
  c.address_ = reinterpret_cast<std::uintptr_t>(memory);
  c.size_ = size;
  c.device_ = device;
  c.kind_ = sharing::ipc_handle;
  return c;
}

chunk::chunk(chunk&& other) noexcept
    : address_(std::exchange(other.address_, 0)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)),
      kind_(other.kind_),
      made_here_(std::exchange(other.made_here_, false)),
      allocation_(std::exchange(other.allocation_, 0)),
      allocated_(std::exchange(other.allocated_, false)),
      reserved_(std::exchange(other.reserved_, false)),
      mapped_(std::exchange(other.mapped_, false)) {}

chunk& chunk::operator=(chunk&& other) noexcept {
  if (this != &other) {
    release();
    address_ = std::exchange(other.address_, 0);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
    kind_ = other.kind_;
    made_here_ = std::exchange(other.made_here_, false);
    allocation_ = std::exchange(other.allocation_, 0);
    allocated_ = std::exchange(other.allocated_, false);
    reserved_ = std::exchange(other.reserved_, false);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

chunk::~chunk() { release(); }

// Unmaps before the range and the allocation go: the driver frees the
// memory once no process maps it, holds a handle or a descriptor for it.
// The device's queued work first: unlike cudaFree, unmapping and closing an
// import do not wait for the work that may still use the memory.
void chunk::release() noexcept {
  if (address_ == 0 && !allocated_) return;
  const detail::device_guard current(device_);
  if (mapped_ || (kind_ == sharing::ipc_handle && !made_here_ && address_ != 0)) {
    std::ignore = cudaDeviceSynchronize();
  }
  if (kind_ == sharing::file_descriptor) {
    const auto& api = detail::state().api;
    if (mapped_) api.mem_unmap(address_, size_);
    if (reserved_) api.mem_address_free(address_, size_);
    if (allocated_) api.mem_release(allocation_);
  } else if (made_here_) {
    cudaFree(reinterpret_cast<void*>(address_));
  } else {
    cudaIpcCloseMemHandle(reinterpret_cast<void*>(address_));
  }
  address_ = 0;
  size_ = 0;
  allocated_ = reserved_ = mapped_ = made_here_ = false;
}

int chunk::export_fd() const {
  constexpr const char* entry = "cohort::cuda::chunk::export_fd";
  if (!allocated_ || kind_ != sharing::file_descriptor) {
    throw std::logic_error(fmt::format("{}: only a file_descriptor chunk has a descriptor", entry));
  }
  const auto& api = detail::driver(entry);
  const auto context = fmt::format("{}: {} on device {}", entry, detail::describe_bytes(size_), device_);
  int fd = -1;
  detail::check(api.mem_export_to_shareable_handle(&fd, allocation_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                "cuMemExportToShareableHandle", context);
  // Handed on explicitly (keep_fds, SCM_RIGHTS), never leaked into an exec.
  if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
    const int error = errno;
    ::close(fd);
    throw std::system_error(error, std::system_category(), context + ": fcntl(FD_CLOEXEC)");
  }
  return fd;
}

ipc_memory_handle chunk::ipc_handle() const {
  constexpr const char* entry = "cohort::cuda::chunk::ipc_handle";
  if (address_ == 0 || kind_ != sharing::ipc_handle || !made_here_) {
    throw std::logic_error(fmt::format("{}: only an ipc_handle chunk made in this process has a handle", entry));
  }
  detail::driver(entry);
  const auto context = fmt::format("{}: {} on device {}", entry, detail::describe_bytes(size_), device_);
  const detail::device_guard current(device_, context);
  cudaIpcMemHandle_t raw{};
  detail::check(cudaIpcGetMemHandle(&raw, reinterpret_cast<void*>(address_)), "cudaIpcGetMemHandle", context);
  ipc_memory_handle handle;
  std::memcpy(handle.bytes.data(), &raw, sizeof raw);
  return handle;
}

}  // namespace cohort::cuda
