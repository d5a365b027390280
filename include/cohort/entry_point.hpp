// Functions as entry points: a function registered with COHORT_ENTRYPOINT
// runs as a rank of a group, called as fn(rank, args...) in a child process
// started by re-executing this program (spawn), by fork, or from a
// forkserver.
#pragma once

#include "cohort/export.hpp"

#include "cohort/encoding.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

COHORT_API_BEGIN

namespace cohort {

/// How a function's child process comes to be.
enum class start_method {
  /// Re-executes this program (/proc/self/exe); its main must hand control
  /// to child_main() first. The child starts clean: no threads, no state of
  /// the parent but what the arguments carry. The default.
  spawn,
  /// Forks this process; the child calls the function and exits without
  /// returning to the caller's code and without running static destructors
  /// or atexit handlers. Only the forking thread exists in the child: locks
  /// that other threads of the parent held stay locked there. Refused
  /// (std::logic_error) in a process that has initialised CUDA, which a
  /// forked child cannot use.
  fork,
  /// Forks from a server process started on first use by re-executing this
  /// program (so main must call child_main() first): no threads, small, and
  /// quick to fork. The children are this process's own (CLONE_PARENT).
  forkserver,
};

/// "spawn", "fork" or "forkserver".
std::string_view to_string(start_method method) noexcept;

/// A registered function with the arguments to call it with after the rank.
/// Made by call(); copyable, so one call serves every rank of a group.
struct function_call {
  std::string name;  ///< the name it was registered under
  encoded args;      ///< the arguments after the rank, as one tuple
  start_method method = start_method::spawn;
  /// Whether what the function returns is read back (into
  /// run_result::return_values). call() sets it false for a function that
  /// returns void, and a rank then gets no result file to write; a value
  /// returned when it is false is dropped.
  bool returns_value = true;
};

/// In a process started to run an entry point (start methods spawn and
/// forkserver), runs it and returns the exit code for main to return: 0 when
/// the function returned, 1 when an exception escaped it (after writing the
/// error file). Elsewhere returns nullopt at once. Call it first thing in
/// main, outside any try block:
///
///     if (auto rc = cohort::child_main(argc, argv)) return *rc;
///
/// A main that goes on past an exit code would run the parent's code in the
/// child: once child_main has returned one, this process refuses to start
/// functions (std::logic_error), where each rank would otherwise start ranks
/// of its own in turn.
///
/// COHORT_ENTRY and COHORT_FORKSERVER are cohort's own, set in the processes
/// it starts: a value it would not have set (COHORT_FORKSERVER naming no
/// socket, a COHORT_ENTRY malformed or naming descriptors other than the
/// memfds cohort made for the rank) throws std::invalid_argument naming it.
[[nodiscard("main must return the exit code child_main returns")]] std::optional<int> child_main(int argc,
                                                                                               char** argv);

namespace detail {

/// A registered function, its type erased.
using erased_function = void (*)();
/// Calls the erased function as fn(rank, args...) with `args` decoded to its
/// parameter types; returns its result encoded, nullopt for void.
using entry_thunk = std::optional<encoded> (*)(erased_function fn, int rank, const encoded& args);

template <class R, class... P, std::size_t... I>
std::optional<encoded> call_decoded(R (*fn)(int, P...), int rank, std::tuple<std::decay_t<P>...>& values,
                                    std::index_sequence<I...>) {
  if constexpr (std::is_void_v<R>) {
    fn(rank, std::forward<P>(std::get<I>(values))...);
    return std::nullopt;
  } else {
    return encode<std::decay_t<R>>(fn(rank, std::forward<P>(std::get<I>(values))...));
  }
}

template <class R, class... P>
std::optional<encoded> thunk(erased_function fn, int rank, const encoded& args) {
  auto values = decode<std::tuple<std::decay_t<P>...>>(args);
  return call_decoded(reinterpret_cast<R (*)(int, P...)>(fn), rank, values, std::index_sequence_for<P...>{});
}

template <class R, class... P>
constexpr void check_signature() {
  static_assert((crossable<std::decay_t<P>> && ...),
                "cohort: every parameter after the rank must be a type that can cross to another process "
                "(integers, floating point, bool, std::string, byte vectors, the shared handles storage, tensor, "
                "queue and event, and vectors, tuples and pairs of these)");
  static_assert(std::is_void_v<R> || crossable<std::decay_t<R>>,
                "cohort: an entry point returns void or a type that can cross to another process");
  static_assert(((!std::is_rvalue_reference_v<P>) && ...), "cohort: an entry point takes no rvalue references");
}

/// Records `fn` under `name`; static initialisation calls it. Two different
/// functions under one name make that name unusable (reported on use).
bool register_entry(std::string_view name, erased_function fn, entry_thunk thunk) noexcept;
/// The name `fn` was registered under. Throws std::logic_error when it was
/// not registered, or its name is shared with another function.
const std::string& registered_name(erased_function fn);

template <class R, class... P>
bool register_function(std::string_view name, R (*fn)(int, P...)) noexcept {
  check_signature<R, P...>();
  return register_entry(name, reinterpret_cast<erased_function>(fn), &thunk<R, P...>);
}

/// Whether F is a function type whose first parameter is the rank, an int.
template <class F>
inline constexpr bool takes_rank_first = false;
template <class R, class... P>
inline constexpr bool takes_rank_first<R(int, P...)> = true;
template <class R, class... P>
inline constexpr bool takes_rank_first<R(int, P...) noexcept> = true;

// Any other function (or object) would otherwise leave only "no matching
// function"; the constraint keeps this one out of the way of a noexcept
// entry point, which it would match better than the overload above.
template <class F>
  requires(!takes_rank_first<F>)
bool register_function(std::string_view, F*) noexcept {
  static_assert(takes_rank_first<F>,
                "cohort: an entry point is a function, and its first parameter is the rank, an int: "
                "write fn(int rank, ...)");
  return false;
}

}  // namespace detail

/// Binds a registered function to the arguments it receives after the rank.
/// Each argument is converted to the parameter's type, then encoded: a
/// parameter type that cannot cross, or an argument that does not convert,
/// is a compile-time error. Throws std::logic_error when `fn` was not
/// registered with COHORT_ENTRYPOINT.
template <class R, class... P, class... A>
function_call call(start_method method, R (*fn)(int, P...), A&&... args) {
  detail::check_signature<R, P...>();
  static_assert(sizeof...(A) == sizeof...(P), "cohort::call: give exactly the arguments that follow the rank");
  using values = std::tuple<std::decay_t<P>...>;
  const auto& name = detail::registered_name(reinterpret_cast<detail::erased_function>(fn));
  return function_call{name, encode(values(std::forward<A>(args)...)), method, !std::is_void_v<R>};
}

template <class R, class... P, class... A>
function_call call(R (*fn)(int, P...), A&&... args) {
  return call(start_method::spawn, fn, std::forward<A>(args)...);
}

}  // namespace cohort

#define COHORT_ENTRYPOINT_JOIN_(a, b) a##b
#define COHORT_ENTRYPOINT_AT_(fn, n)                                                       \
  [[maybe_unused]] static const bool COHORT_ENTRYPOINT_JOIN_(cohort_entrypoint_, n) = \
      ::cohort::detail::register_function(#fn, &fn)

/// Registers `fn` (a function taking `int rank` first) as an entry point
/// under its name as written. Put it at namespace scope in a source file of
/// the program, next to the function.
#define COHORT_ENTRYPOINT(fn) COHORT_ENTRYPOINT_AT_(fn, __COUNTER__)

COHORT_API_END
