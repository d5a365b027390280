// A shared library that is not a CUDA driver: it loads, and has none of the
// driver's functions. tests/cuda/no_device.cpp finds it first as
// libcuda.so.1.
extern "C" {
int cohort_test_not_a_driver = 1;
}
