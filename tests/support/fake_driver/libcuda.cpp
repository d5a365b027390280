// A stand-in for the CUDA driver, built as libcuda.so.1 (its soname), for
// testing on machines without one what a process that loaded and
// initialised the driver may do. It answers as the driver does: every call
// but cuInit returns CUDA_ERROR_NOT_INITIALIZED (3) until cuInit has run.
#include <atomic>

namespace {

constexpr int success = 0;
constexpr int not_initialised = 3;

std::atomic<bool> initialised{false};

}  // namespace

extern "C" {

// CUresult cuInit(unsigned int flags)
int cuInit(unsigned int) {
  initialised = true;
  return success;
}

// CUresult cuDeviceGet(CUdevice* device, int ordinal)
int cuDeviceGet(int* device, int ordinal) {
  if (!initialised) return not_initialised;
  *device = ordinal;
  return success;
}

}  // extern "C"
