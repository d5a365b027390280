// The CUDA driver's state, asked through the dynamic linker: the library
// is looked for among those already loaded, never loaded here.
#include "os/cuda_driver.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstring>

namespace cohort::os {
namespace {

// The driver's soname, which the CUDA runtime loads it by.
constexpr const char* driver_library = "libcuda.so.1";
// CUresult CUDA_ERROR_NOT_INITIALIZED (cuda.h): what every driver call but
// cuInit answers before cuInit has run.
constexpr int not_initialised = 3;

// CUresult cuDeviceGet(CUdevice* device, int ordinal), CUdevice an int:
// the cheapest call that tells whether cuInit has run.
using device_get = int (*)(int* device, int ordinal);

// Whether an object whose file is named libcuda.so* is loaded: a walk of
// the loader's list in memory, where dlopen with RTLD_NOLOAD would look
// for the file on disk (a handful of system calls per fork start).
bool driver_file_loaded() noexcept {
  return ::dl_iterate_phdr(
             [](dl_phdr_info* info, std::size_t, void*) {
               const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
               const char* slash = std::strrchr(name, '/');
               return std::strncmp(slash != nullptr ? slash + 1 : name, "libcuda.so", 10) == 0 ? 1 : 0;
             },
             nullptr) != 0;
}

}  // namespace

bool cuda_initialised() noexcept {
  if (!driver_file_loaded()) return false;
  void* library = ::dlopen(driver_library, RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return false;
  bool initialised = false;
  if (auto* get = reinterpret_cast<device_get>(::dlsym(library, "cuDeviceGet"))) {
    int device = 0;
    initialised = get(&device, 0) != not_initialised;
  }
  ::dlclose(library);  // the reference RTLD_NOLOAD took
  return initialised;
}

}  // namespace cohort::os
