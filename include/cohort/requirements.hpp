// What cohort's public headers require of the compiler and of Asio, checked
// before anything else: cohort/export.hpp, which every public header
// includes first, includes it.
#pragma once

#if __cplusplus < 202002L
#error "cohort needs C++20: compile with -std=c++20 (in meson, cpp_std=c++20; in CMake, cxx_std_20)"
#endif

// Asio 1.22 turns co_await on for clang only where libc++'s
// <experimental/coroutine> exists, not with libstdc++'s <coroutine>, which
// works once Asio is told. cohort.pc and cohort::cohort give the same flag,
// for a program that includes Asio before cohort.
#if !defined(ASIO_HAS_CO_AWAIT) && defined(__cpp_impl_coroutine)
#if defined(ASIO_DETAIL_CONFIG_HPP)
#error "Asio was included before cohort and without co_await: compile with -DASIO_HAS_CO_AWAIT=1, as cohort.pc and cohort::cohort do"
#endif
#define ASIO_HAS_CO_AWAIT 1
#endif

// Asio recycles the memory of its handlers between translation units: a
// block one allocated, another frees. Where Asio's configuration is read
// after a standard library header it allocates with std::aligned_alloc
// and frees with std::free, and otherwise with operator new and delete; so
// a program that included Asio or cohort first, as most do, freed with
// one what the library had allocated with the other, which a replaced
// operator new (a heap profiler's, a pool's) cannot survive. The library,
// cohort.pc and cohort::cohort turn std::aligned_alloc off; so does this,
// for a program that included nothing of Asio yet.
#if defined(ASIO_HAS_STD_ALIGNED_ALLOC)
#error "Asio was included before cohort, after a standard library header, and set to allocate with std::aligned_alloc: compile with -DASIO_DISABLE_STD_ALIGNED_ALLOC=1, as cohort.pc and cohort::cohort do, so that it allocates as the library does"
#endif
#if !defined(ASIO_DISABLE_STD_ALIGNED_ALLOC)
#define ASIO_DISABLE_STD_ALIGNED_ALLOC 1
#endif
