// What the CUDA layer throws: a CUDA call that failed, and no device to use.
#pragma once

#include "cohort/export.hpp"

#include <stdexcept>
#include <string>

COHORT_API_BEGIN

namespace cohort::cuda {

/// A CUDA call failed. what(): "<context>: <call> failed: <name> (<description>)",
/// e.g. "cohort::cuda::chunk::create: 4294967296 bytes (4.0 GiB) on device 0, of which
/// 1073741824 bytes (1.0 GiB) free: cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
class error : public std::runtime_error {
 public:
  error(const std::string& context, std::string call, int code, std::string name, const std::string& description);
  /// The CUDA call that failed: "cuMemCreate", "cudaEventRecord"; for no_device,
  /// the entry point of this library that was called.
  const std::string& call() const noexcept { return call_; }
  /// What it returned: a CUresult (driver calls, "cu...") or a cudaError_t (runtime calls, "cuda...").
  int code() const noexcept { return code_; }
  /// The code's name: "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorInvalidValue".
  const std::string& name() const noexcept { return name_; }

 protected:
  struct whole_message {};
  error(whole_message, const std::string& what, std::string call, int code, std::string name);

 private:
  std::string call_;
  int code_;
  std::string name_;
};

/// CUDA cannot be used in this process: no driver, no device it may use, or
/// a driver older than the CUDA this library was built with. Every entry
/// point of the CUDA layer throws it then, save available(),
/// unavailable_reason() and device_count(). what(): "<entry point>: no CUDA
/// device: <reason>", e.g. "cohort::cuda::event: no CUDA device: no driver
/// (libcuda.so.1 could not be loaded)".
class no_device : public error {
 public:
  /// `code`: the cudaError_t CUDA's initialisation ended with, `name` its name.
  no_device(const std::string& entry, std::string reason, int code, std::string name);
  /// unavailable_reason(): "no driver (...)", "no device (...)", "driver too old (...)"...
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string reason_;
};

}  // namespace cohort::cuda

COHORT_API_END
