// What cohort's public headers require of the compiler, checked before
// anything else: cohort/export.hpp, which every public header includes
// first, includes it.
#pragma once

#if __cplusplus < 202002L
#error "cohort needs C++20: compile with -std=c++20 (in meson, cpp_std=c++20; in CMake, cxx_std_20)"
#endif
