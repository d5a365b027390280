// The readable names of C++ symbols and types.
#pragma once

#include <exception>
#include <string>
#include <typeinfo>

namespace cohort::os {

/// `mangled` demangled, or as it is when it is not a C++ name; empty for
/// null. Allocates.
std::string demangle(const char* mangled);
/// The demangled name of a type.
inline std::string demangle(const std::type_info& type) { return demangle(type.name()); }

/// "<demangled type>: <what()>", a what() that breaks its contract by
/// returning null read as empty.
inline std::string exception_message(const std::exception& e) {
  const char* what = e.what();
  return demangle(typeid(e)) + ": " + (what != nullptr ? what : "");
}

}  // namespace cohort::os
