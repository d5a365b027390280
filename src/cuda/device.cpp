// Device discovery: how many, their UUIDs, their memory.
#include "cohort/cuda/device.hpp"

#include "cohort/cuda/error.hpp"
#include "cuda/driver.hpp"

#include <fmt/format.h>

#include <cctype>

namespace cohort::cuda {

bool available() { return detail::state().unavailable.empty(); }

std::string unavailable_reason() { return detail::state().unavailable; }

int device_count() { return detail::state().device_count; }

std::string to_string(const uuid& id) {
  std::string text = "GPU-";
  for (std::size_t i = 0; i < id.bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += fmt::format("{:02x}", id.bytes[i]);
  }
  return text;
}

std::optional<uuid> parse_uuid(std::string_view text) {
  // "GPU-" and 32 hex digits in groups of 8-4-4-4-12.
  if (text.size() != 4 + 32 + 4 || text.substr(0, 4) != "GPU-") return std::nullopt;
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  uuid id;
  std::size_t at = 4;
  for (std::size_t i = 0; i < id.bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) {
      if (text[at++] != '-') return std::nullopt;
    }
    const int high = digit(text[at++]);
    const int low = digit(text[at++]);
    if (high < 0 || low < 0) return std::nullopt;
    id.bytes[i] = static_cast<unsigned char>(high * 16 + low);
  }
  return id;
}

uuid device_uuid(int device) {
  constexpr const char* entry = "cohort::cuda::device_uuid";
  detail::check_device(device, entry);
  const auto& api = detail::driver(entry);
  const auto context = fmt::format("{}: device {}", entry, device);
  CUdevice handle = 0;
  detail::check(api.device_get(&handle, device), "cuDeviceGet", context);
  CUuuid raw{};
  detail::check(api.device_get_uuid(&raw, handle), "cuDeviceGetUuid", context);
  uuid id;
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<unsigned char>(raw.bytes[i]);
  return id;
}

std::optional<int> find_device(const uuid& id) {
  detail::driver("cohort::cuda::find_device");
  for (int device = 0; device < device_count(); ++device) {
    if (device_uuid(device) == id) return device;
  }
  return std::nullopt;
}

memory_info device_memory(int device) {
  constexpr const char* entry = "cohort::cuda::device_memory";
  detail::check_device(device, entry);
  const auto& api = detail::driver(entry);
  const auto context = fmt::format("{}: device {}", entry, device);
  const detail::device_guard current(device, context);
  memory_info info;
  detail::check(api.mem_get_info(&info.free, &info.total), "cuMemGetInfo", context);
  return info;
}

}  // namespace cohort::cuda
