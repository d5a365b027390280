// Whether this process has initialised the CUDA driver, asked without
// CUDA's headers or libraries: a forked child cannot use the driver its
// parent initialised, so the fork start method checks this first.
#pragma once

namespace cohort::os {

/// True when the CUDA driver (libcuda.so.1, from a file named libcuda.so*)
/// is loaded in this process and initialised: cuInit has run, so its
/// cuDeviceGet answers something other than CUDA_ERROR_NOT_INITIALIZED. A
/// driver that is loaded but was never initialised (cudart asked only for
/// its version, say) does not count; one whose cuInit failed may. Loads
/// nothing and initialises nothing; any thread may call it.
bool cuda_initialised() noexcept;

}  // namespace cohort::os
