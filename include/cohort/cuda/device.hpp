// Which CUDA devices this process sees, named by UUID: processes with
// different CUDA_VISIBLE_DEVICES number the same device differently, so a
// device crosses between them as its UUID, never as its index.
#pragma once

#include "cohort/export.hpp"

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

COHORT_API_BEGIN

namespace cohort::cuda {

/// Whether CUDA can be used in this process: a driver as new as the CUDA
/// this library was built with, and at least one device. The first call to
/// any function of this library but to_string and parse_uuid initialises
/// CUDA in this process (the runtime and the driver's cuInit), once, and
/// settles what it answers for good. From then on the process may not
/// start ranks by fork (start_method::fork is refused: a forked child
/// cannot use CUDA); spawn and forkserver start them from a fresh image of
/// the program. Any thread may call it.
bool available();

/// Why CUDA cannot be used: "no driver (libcuda.so.1 could not be loaded)",
/// "no driver (the libcuda.so.1 found is the CUDA toolkit's stub, not a
/// driver's)", "no device (...)", "driver too old (...)", or CUDA's own
/// error; empty when available().
std::string unavailable_reason();

/// How many devices this process sees (CUDA_VISIBLE_DEVICES applied); 0
/// when CUDA cannot be used. Devices are numbered 0..device_count()-1.
int device_count();

/// A device's UUID: the same in every process on the machine.
struct uuid {
  std::array<unsigned char, 16> bytes{};
  friend bool operator==(const uuid&, const uuid&) = default;
};

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L writes it.
std::string to_string(const uuid& id);
/// A UUID from to_string's form; nullopt for any other text.
std::optional<uuid> parse_uuid(std::string_view text);

/// The UUID of device `device` (cuDeviceGetUuid). Throws no_device,
/// std::invalid_argument for an index this process has no device for, or
/// error.
uuid device_uuid(int device);
/// This process's index for the device with UUID `id`; nullopt when it does
/// not see that device. Throws no_device or error.
std::optional<int> find_device(const uuid& id);

/// A device's memory in bytes, as cuMemGetInfo reports it: `free` counts
/// what every process on the device has left unused.
struct memory_info {
  std::size_t free = 0;
  std::size_t total = 0;
};
/// Device `device`'s memory now. Throws no_device, std::invalid_argument or error.
memory_info device_memory(int device);

}  // namespace cohort::cuda

COHORT_API_END
