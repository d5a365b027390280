// The CUDA runtime (cudart, linked statically into this library) and the
// driver functions this layer calls, looked up once through the runtime
// (cudaGetDriverEntryPointByVersion): nothing links libcuda, so programs
// load and run where no driver is installed, and are told so when they ask
// for a device.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace cohort::cuda::detail {

/// The driver functions this layer calls, each at the ABI its typedef names
/// (the version asked of cudaGetDriverEntryPointByVersion).
struct driver_api {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuDeviceGetUuid_v11040 device_get_uuid = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 device_primary_ctx_retain = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuMemGetInfo_v3020 mem_get_info = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 mem_export_to_shareable_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 mem_import_from_shareable_handle = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemsetD16Async_v3020 memset_d16_async = nullptr;
  PFN_cuMemsetD32Async_v3020 memset_d32_async = nullptr;
  PFN_cuMemsetD2D32Async_v3020 memset_d2d32_async = nullptr;
  /// Null where the driver or device has no stream memory operations:
  /// receivers then wait on a sender's event itself.
  PFN_cuStreamWaitValue32_v11070 stream_wait_value32 = nullptr;
};

/// A device's primary context (the runtime's too), retained by this layer
/// on first use and held until the process ends, as the runtime holds it.
struct primary_context {
  std::once_flag retained;
  CUcontext context = nullptr;
  CUresult result = CUDA_SUCCESS;
};

/// What CUDA's initialisation in this process found, settled by the first
/// call (the runtime's initialisation and the driver's cuInit happen then)
/// and the same ever after; any thread may ask.
struct driver_state {
  /// Why CUDA cannot be used; empty when it can.
  std::string unavailable;
  /// The cudaError_t behind `unavailable`, cudaSuccess when usable.
  cudaError_t init_error = cudaSuccess;
  int device_count = 0;
  driver_api api;
  /// One per device.
  std::unique_ptr<primary_context[]> primaries;
};
const driver_state& state();

/// The driver's functions, for the entry point `entry` of this layer
/// ("cohort::cuda::chunk::create"): throws no_device naming it when CUDA
/// cannot be used here.
const driver_api& driver(const char* entry);
/// Throws std::invalid_argument, naming `entry`, unless 0 <= device <
/// device_count(); no_device first when CUDA cannot be used at all.
void check_device(int device, const char* entry);

/// Throws error for a runtime call `call` that returned `result`: "<context>: <call> failed: ...".
void check(cudaError_t result, const char* call, std::string_view context);
/// The same for a driver call.
void check(CUresult result, const char* call, std::string_view context);

/// "<n> bytes (<n> GiB)" (or MiB), as messages give sizes.
std::string describe_bytes(std::size_t n);

/// Makes device `device`'s primary context current on this thread for the
/// guard's life (the driver's calls and the runtime's act on the current
/// context), then the context that was current before, or none. Through
/// the driver, not cudaSetDevice: the runtime's own choice of device for
/// the thread is left as it was, and no other device's context is made.
/// For a `device` checked by check_device.
class device_guard {
 public:
  /// Throws error, naming `context`, when it cannot switch.
  device_guard(int device, std::string_view context);
  /// For destructors: a switch that fails is left at that.
  explicit device_guard(int device) noexcept;
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard();

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace cohort::cuda::detail
