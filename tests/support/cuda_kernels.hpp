// Two kernels for the tests and benchmarks of the cuda layer, which has
// none of its own: one that waits on the device before it writes (so a
// reader that does not wait for it sees the old values), and one that adds
// one float32 array into another. PTX, loaded through the driver, so the
// programs need no nvcc step of their own.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

struct CUstream_st;

namespace cohort::test {

inline constexpr const char* kernels_ptx = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin_fill(.param .u64 out, .param .u32 n, .param .u32 value, .param .u64 ns)
{
  .reg .pred %p<3>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [n];
  ld.param.u32 %r2, [value];
  ld.param.u64 %rd2, [ns];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r6, %r3, %r4, %r5;
  setp.ge.u32 %p1, %r6, %r1;
  @%p1 bra DONE;
  mov.u64 %rd3, %globaltimer;
  add.u64 %rd4, %rd3, %rd2;
WAIT:
  mov.u64 %rd5, %globaltimer;
  setp.lt.u64 %p2, %rd5, %rd4;
  @%p2 bra WAIT;
  cvta.to.global.u64 %rd6, %rd1;
  mul.wide.u32 %rd7, %r6, 4;
  add.s64 %rd8, %rd6, %rd7;
  st.global.u32 [%rd8], %r2;
DONE:
  ret;
}

.visible .entry add_f32(.param .u64 a, .param .u64 b, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .b32 %r<7>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [b];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd3, %rd1;
  cvta.to.global.u64 %rd4, %rd2;
  mul.wide.u32 %rd5, %r5, 4;
  add.s64 %rd6, %rd3, %rd5;
  add.s64 %rd7, %rd4, %rd5;
  ld.global.f32 %f1, [%rd6];
  ld.global.f32 %f2, [%rd7];
  add.f32 %f3, %f1, %f2;
  st.global.f32 [%rd6], %f3;
DONE:
  ret;
}
)";

/// The kernels above on device 0, loaded on first use.
class kernels {
 public:
  static kernels& get() {
    static kernels k;
    return k;
  }
  /// Writes `value` to `n` words at `out` once `ns` nanoseconds have passed
  /// on the device, on `stream`.
  void spin_fill(void* out, std::uint32_t n, std::uint32_t value, std::uint64_t ns, CUstream_st* stream) {
    auto address = reinterpret_cast<CUdeviceptr>(out);
    void* args[] = {&address, &n, &value, &ns};
    launch(spin_fill_, n, args, stream);
  }
  /// a[i] += b[i] for i < n, float32, on `stream`.
  void add_f32(void* a, const void* b, std::uint32_t n, CUstream_st* stream) {
    auto to = reinterpret_cast<CUdeviceptr>(a);
    auto from = reinterpret_cast<CUdeviceptr>(b);
    void* args[] = {&to, &from, &n};
    launch(add_f32_, n, args, stream);
  }

 private:
  template <class F>
  static void resolve(const char* name, F& slot) {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &found) != cudaSuccess || f == nullptr) {
      throw std::runtime_error(std::string("no driver function ") + name);
    }
    slot = reinterpret_cast<F>(f);
  }
  static void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + " failed: " + std::to_string(r));
  }
  kernels() {
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) throw std::runtime_error("no device 0");
    resolve("cuModuleLoadData", load_);
    resolve("cuModuleGetFunction", function_);
    resolve("cuLaunchKernel", launch_);
    check(load_(&module_, kernels_ptx), "cuModuleLoadData");
    check(function_(&spin_fill_, module_, "spin_fill"), "cuModuleGetFunction");
    check(function_(&add_f32_, module_, "add_f32"), "cuModuleGetFunction");
  }
  void launch(CUfunction f, std::uint32_t n, void** args, CUstream_st* stream) {
    const unsigned threads = 256;
    const unsigned blocks = (n + threads - 1) / threads;
    check(launch_(f, blocks == 0 ? 1 : blocks, 1, 1, threads, 1, 1, 0, reinterpret_cast<CUstream>(stream), args, nullptr),
          "cuLaunchKernel");
  }

  PFN_cuModuleLoadData_v2000 load_ = nullptr;
  PFN_cuModuleGetFunction_v2000 function_ = nullptr;
  PFN_cuLaunchKernel_v4000 launch_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction spin_fill_ = nullptr;
  CUfunction add_f32_ = nullptr;
};

}  // namespace cohort::test
