// What the shared library exports. It is built with -fvisibility=hidden:
// only the declarations of cohort's public headers, each of which brackets
// its contents with COHORT_API_BEGIN and COHORT_API_END, are visible to
// programs; the internals under src/ are not. Every public header includes
// it first, and with it cohort/requirements.hpp.
#pragma once

#include "cohort/requirements.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define COHORT_API_BEGIN _Pragma("GCC visibility push(default)")
#define COHORT_API_END _Pragma("GCC visibility pop")
#else
#define COHORT_API_BEGIN
#define COHORT_API_END
#endif
