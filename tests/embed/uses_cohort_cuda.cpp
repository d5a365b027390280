// A program of another project that links libcohort-cuda and calls none of
// its functions: it reaches the CUDA layer through the core library alone
// (tensor::to), which finds the layer only where the program loaded it
// (tests/support/embed.py).
#include <cohort/tensor.hpp>

#include <fmt/format.h>

#include <exception>

int main() {
  try {
    const cohort::tensor host = cohort::tensor::zeros({4}, cohort::dtype::float32);
    const cohort::tensor copy = host.to(cohort::device{kDLCUDA, 0});
    fmt::print("copied to device {}:{}\n", static_cast<int>(copy.device().type), copy.device().id);
  } catch (const std::exception& e) {
    // Without a device, the layer's no_device; without the layer, the core
    // library's "no device layer ... is loaded".
    fmt::print("{}\n", e.what());
  }
  return 0;
}
