// What cohort's public headers know of the compilers that build them.
#pragma once

#include "cohort/export.hpp"

/// 1 where the compiler miscompiles temporaries inside a co_await
/// expression: g++ 12 and older destroy an aggregate initialized there twice
/// (a map or vector in it is freed twice, or walked after it was freed), and
/// reject a std::initializer_list there ("array used as initializer", at the
/// enclosing function's closing brace). A temporary built by a constructor
/// is fine. Awaited functions refuse such arguments at compile time where
/// this is 1, saying what to write instead.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ <= 12
#define COHORT_AWAIT_TEMPORARY_BUG 1
#else
#define COHORT_AWAIT_TEMPORARY_BUG 0
#endif

COHORT_API_BEGIN

namespace cohort::detail {

/// False, but only once T is known: a static_assert on it fires when the
/// template holding it is instantiated, not when it is defined.
template <class T>
inline constexpr bool refused = false;

}  // namespace cohort::detail

COHORT_API_END
