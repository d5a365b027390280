// What the CUDA layer throws.
#include "cohort/cuda/error.hpp"

#include <fmt/format.h>

namespace cohort::cuda {

error::error(const std::string& context, std::string call, int code, std::string name, const std::string& description)
    : std::runtime_error(fmt::format("{}: {} failed: {} ({})", context, call, name, description)),
      call_(std::move(call)),
      code_(code),
      name_(std::move(name)) {}

error::error(whole_message, const std::string& what, std::string call, int code, std::string name)
    : std::runtime_error(what), call_(std::move(call)), code_(code), name_(std::move(name)) {}

no_device::no_device(const std::string& entry, std::string reason, int code, std::string name)
    : error(whole_message{}, fmt::format("{}: no CUDA device: {}", entry, reason), entry, code, std::move(name)),
      reason_(std::move(reason)) {}

}  // namespace cohort::cuda
