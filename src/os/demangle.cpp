// Demangling through the C++ runtime's __cxa_demangle.
#include "os/demangle.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace cohort::os {

std::string demangle(const char* mangled) {
  if (mangled == nullptr) return {};
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(mangled);
}

}  // namespace cohort::os
