// The readable names of C++ symbols and types, and what exceptions say.
#pragma once

#include <string>
#include <system_error>
#include <typeinfo>

namespace cohort::os {

/// `mangled` demangled, or as it is when it is not a C++ name; empty for
/// null. Allocates.
std::string demangle(const char* mangled);
/// The demangled name of a type.
inline std::string demangle(const std::type_info& type) { return demangle(type.name()); }

/// What `e` says before the ": <its error's message>" std::system_error
/// appends, for a message that names the error in its own way.
inline std::string system_error_words(const std::system_error& e) {
  std::string what = e.what();
  const std::string error = ": " + e.code().message();
  if (what.ends_with(error)) what.resize(what.size() - error.size());
  return what;
}

}  // namespace cohort::os
