// CUDA's initialisation in this process, once: the driver's version and
// devices through the runtime, the driver functions through
// cudaGetDriverEntryPointByVersion, and why CUDA cannot be used when it
// cannot.
#include "cuda/driver.hpp"

#include "cohort/cuda/error.hpp"

#include <dlfcn.h>
#include <link.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace cohort::cuda::detail {
namespace {

// "13.0" for 13000 (1000 * major + 10 * minor).
std::string cuda_version(int number) { return fmt::format("{}.{}", number / 1000, number % 1000 / 10); }

// What CUDA_VISIBLE_DEVICES hides, when it is set.
std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible != nullptr ? fmt::format("; CUDA_VISIBLE_DEVICES={}", visible) : std::string();
}

// Looks `symbol` up at the ABI of CUDA `version` into `slot`; false, with
// the reason in `why`, when the driver has no such function.
template <class F>
bool resolve(const char* symbol, unsigned version, F& slot, std::string& why) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t result = cudaGetDriverEntryPointByVersion(symbol, &function, version, cudaEnableDefault, &found);
  if (result != cudaSuccess || found != cudaDriverEntryPointSuccess || function == nullptr) {
    why = fmt::format("the driver offers no {} of CUDA {} ({})", symbol, cuda_version(static_cast<int>(version)),
                      result != cudaSuccess                              ? cudaGetErrorName(result)
                      : found == cudaDriverEntryPointVersionNotSufficent ? "version not sufficient"
                                                                         : "symbol not found");
    return false;
  }
  slot = reinterpret_cast<F>(function);
  return true;
}

// Why the runtime found no driver: no libcuda.so.1 to load, or one that
// loads and is not a driver it can use, named by where it lies and, where
// it lacks one, the first of the functions every driver of CUDA 12 or newer
// has.
std::string no_driver_reason() {
  void* library = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (library == nullptr) return "no driver (libcuda.so.1 could not be loaded)";
  std::string where = "libcuda.so.1";
  const link_map* map = nullptr;
  if (::dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name[0] != '\0') where = map->l_name;
  std::string what = "gives no driver version";
  for (const char* symbol : {"cuInit", "cuDriverGetVersion", "cuGetProcAddress_v2"}) {
    if (::dlsym(library, symbol) == nullptr) {
      what = fmt::format("has no {}", symbol);
      break;
    }
  }
  ::dlclose(library);
  return fmt::format("no driver (the libcuda.so.1 found, {}, is not a CUDA driver: it {})", where, what);
}

bool resolve_all(driver_api& api, std::string& why) {
  return resolve("cuGetErrorName", 6000, api.get_error_name, why) &&
         resolve("cuGetErrorString", 6000, api.get_error_string, why) &&
         resolve("cuDeviceGet", 2000, api.device_get, why) &&
         resolve("cuDeviceGetAttribute", 2000, api.device_get_attribute, why) &&
         resolve("cuDeviceGetUuid", 11040, api.device_get_uuid, why) &&
         resolve("cuDevicePrimaryCtxRetain", 7000, api.device_primary_ctx_retain, why) &&
         resolve("cuCtxGetCurrent", 4000, api.ctx_get_current, why) &&
         resolve("cuCtxSetCurrent", 4000, api.ctx_set_current, why) &&
         resolve("cuMemGetInfo", 3020, api.mem_get_info, why) &&
         resolve("cuMemGetAllocationGranularity", 10020, api.mem_get_allocation_granularity, why) &&
         resolve("cuMemCreate", 10020, api.mem_create, why) &&
         resolve("cuMemRelease", 10020, api.mem_release, why) &&
         resolve("cuMemExportToShareableHandle", 10020, api.mem_export_to_shareable_handle, why) &&
         resolve("cuMemImportFromShareableHandle", 10020, api.mem_import_from_shareable_handle, why) &&
         resolve("cuMemAddressReserve", 10020, api.mem_address_reserve, why) &&
         resolve("cuMemAddressFree", 10020, api.mem_address_free, why) &&
         resolve("cuMemMap", 10020, api.mem_map, why) &&
         resolve("cuMemUnmap", 10020, api.mem_unmap, why) &&
         resolve("cuMemSetAccess", 10020, api.mem_set_access, why) &&
         resolve("cuMemsetD16Async", 3020, api.memset_d16_async, why) &&
         resolve("cuMemsetD32Async", 3020, api.memset_d32_async, why) &&
         resolve("cuMemsetD2D32Async", 3020, api.memset_d2d32_async, why);
}

driver_state initialise() {
  driver_state s;
  // 0 when no driver could be loaded: the runtime found no libcuda.so.1.
  int driver_version = 0;
  int count = 0;
  if (cudaDriverGetVersion(&driver_version) != cudaSuccess || driver_version == 0) {
    // The toolkit's stub libcuda.so (for linking, not running) reports no
    // version either; the runtime tells it apart as it counts devices.
    if (cudaGetDeviceCount(&count) == cudaErrorStubLibrary) {
      s.unavailable = "no driver (the libcuda.so.1 found is the CUDA toolkit's stub, not a driver's)";
      s.init_error = cudaErrorStubLibrary;
    } else {
      s.unavailable = no_driver_reason();
      s.init_error = cudaErrorInsufficientDriver;
    }
    return s;
  }
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted == cudaErrorInsufficientDriver) {
    s.unavailable = fmt::format("driver too old (it runs CUDA {}; this library was built with CUDA {})",
                                cuda_version(driver_version), cuda_version(CUDART_VERSION));
  } else if (counted == cudaErrorNoDevice || (counted == cudaSuccess && count <= 0)) {
    s.unavailable = fmt::format("no device (the driver, CUDA {}, sees none{})", cuda_version(driver_version),
                                visible_devices_note());
  } else if (counted != cudaSuccess) {
    s.unavailable = fmt::format("{} ({})", cudaGetErrorName(counted), cudaGetErrorString(counted));
  }
  if (!s.unavailable.empty()) {
    s.init_error = counted != cudaSuccess ? counted : cudaErrorNoDevice;
    return s;
  }
  std::string why;
  if (!resolve_all(s.api, why)) {
    s.unavailable = fmt::format("driver too old ({})", why);
    s.init_error = cudaErrorInsufficientDriver;
    s.api = {};
    return s;
  }
  std::string optional_why;
  if (!resolve("cuStreamWaitValue32", 11070, s.api.stream_wait_value32, optional_why)) s.api.stream_wait_value32 = nullptr;
  s.device_count = count;
  s.primaries = std::make_unique<primary_context[]>(static_cast<std::size_t>(count));
  return s;
}

// Device `device`'s primary context, retained on first use; nullptr with
// the driver's result in `result` when it could not be, or when this
// process has no such device (every entry point checks the index first:
// this keeps a call that did not from reading past the contexts).
CUcontext primary(int device, CUresult& result) noexcept {
  const driver_state& s = state();
  if (device < 0 || device >= s.device_count) {
    result = CUDA_ERROR_INVALID_DEVICE;
    return nullptr;
  }
  primary_context& p = s.primaries[static_cast<std::size_t>(device)];
  std::call_once(p.retained, [&] {
    CUdevice handle = 0;
    p.result = s.api.device_get(&handle, device);
    if (p.result == CUDA_SUCCESS) p.result = s.api.device_primary_ctx_retain(&p.context, handle);
  });
  result = p.result;
  return p.result == CUDA_SUCCESS ? p.context : nullptr;
}

}  // namespace

const driver_state& state() {
  static const driver_state s = initialise();
  return s;
}

const driver_api& driver(const char* entry) {
  const driver_state& s = state();
  if (!s.unavailable.empty()) throw no_device(entry, s.unavailable, s.init_error, cudaGetErrorName(s.init_error));
  return s.api;
}

void check_device(int device, const char* entry) {
  driver(entry);
  const int count = state().device_count;
  if (device < 0 || device >= count) {
    throw std::invalid_argument(fmt::format("{}: no CUDA device {}: this process sees {} (0 to {})", entry, device,
                                            count, count - 1));
  }
}

void check(cudaError_t result, const char* call, std::string_view context) {
  if (result == cudaSuccess) return;
  throw error(std::string(context), call, result, cudaGetErrorName(result), cudaGetErrorString(result));
}

void check(CUresult result, const char* call, std::string_view context) {
  if (result == CUDA_SUCCESS) return;
  const driver_api& api = state().api;  // resolved: a driver call was made
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name == nullptr || api.get_error_name(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (api.get_error_string == nullptr || api.get_error_string(result, &text) != CUDA_SUCCESS) text = nullptr;
  throw error(std::string(context), call, result,
              name != nullptr ? name : fmt::format("CUresult {}", static_cast<int>(result)),
              text != nullptr ? text : "unknown error");
}

std::string describe_bytes(std::size_t n) {
  const auto in = [n](int shift) { return static_cast<double>(n) / static_cast<double>(std::uint64_t{1} << shift); };
  if (n >= std::size_t{1} << 30) return fmt::format("{} bytes ({:.1f} GiB)", n, in(30));
  if (n >= std::size_t{1} << 20) return fmt::format("{} bytes ({:.1f} MiB)", n, in(20));
  return fmt::format("{} bytes", n);
}

device_guard::device_guard(int device, std::string_view context) {
  const driver_api& api = state().api;
  CUresult result = CUDA_SUCCESS;
  const CUcontext wanted = primary(device, result);
  check(result, "cuDevicePrimaryCtxRetain", context);
  check(api.ctx_get_current(&previous_), "cuCtxGetCurrent", context);
  check(api.ctx_set_current(wanted), "cuCtxSetCurrent", context);
  switched_ = true;
}

device_guard::device_guard(int device) noexcept {
  const driver_api& api = state().api;
  CUresult result = CUDA_SUCCESS;
  const CUcontext wanted = primary(device, result);
  switched_ = wanted != nullptr && api.ctx_get_current(&previous_) == CUDA_SUCCESS &&
              api.ctx_set_current(wanted) == CUDA_SUCCESS;
}

device_guard::~device_guard() {
  if (switched_) state().api.ctx_set_current(previous_);
}

}  // namespace cohort::cuda::detail
