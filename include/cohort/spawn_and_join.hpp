// The blocking way to run N ranks of a function, as torch.multiprocessing's
// spawn(fn, args, nprocs): start them, wait for all, throw the first failure.
#pragma once

#include "cohort/export.hpp"

#include "cohort/compiler.hpp"
#include "cohort/entry_point.hpp"
#include "cohort/group.hpp"
#include "cohort/process_error.hpp"

#include <filesystem>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

struct join_options {
  start_method method = start_method::spawn;
  /// How every rank starts (environment, directory, standard streams...).
  spawn_options spawn{};
  shutdown_policy shutdown{};
  /// As group_spec::error_dir.
  std::filesystem::path error_dir{};
  /// As group_spec::start_threads.
  unsigned start_threads = 0;
};

namespace detail {
/// Runs the group on an io_context of its own and returns when every rank
/// has ended; throws the first failure (throw_first_failure).
run_result run_to_end(const function_call& call, int nprocs, const join_options& options);
}  // namespace detail

/// Runs fn(rank, args...) for every rank 0..nprocs-1 in its own process and
/// blocks until all have ended. The first failure shuts the others down (as
/// options.shutdown says) and is thrown: process_raised_error when an
/// exception escaped fn, process_exited_error when a rank exited non-zero or
/// was killed by a signal. Returns what each rank returned, in rank order
/// (nothing for a void fn). Launch failures throw std::system_error, bad
/// arguments std::invalid_argument, an fn not registered std::logic_error;
/// a rank whose end the supervisor could not see (reaped elsewhere, its
/// result unreadable) throws process_error. What the ranks started ends
/// with the run, as start_processes says (group.hpp), while each rank
/// leads its own process group (spawn.new_process_group, the default);
/// with the ranks in this process's group, only what carries the group's
/// marker, or what a shutdown finds under a live rank. Should this
/// process die meanwhile (Ctrl-C or SIGTERM with their default action,
/// SIGKILL), the ranks die by their parent-death signal, but what they
/// started lives on, handed to init, unless a cohort::guardian
/// (cohort/guardian.hpp), made first, kills it:
///
///     cohort::guardian guard;  // before the first run
///     auto parts = cohort::spawn_and_join(fn, std::tuple{}, 4);
template <class R, class... P, class... A>
auto spawn_and_join(R (*fn)(int, P...), std::tuple<A...> args, int nprocs, const join_options& options) {
  const function_call call_spec = std::apply(
      [&](auto&&... a) { return call(options.method, fn, std::forward<decltype(a)>(a)...); }, std::move(args));
  run_result result = detail::run_to_end(call_spec, nprocs, options);
  if constexpr (!std::is_void_v<R>) {
    std::vector<std::decay_t<R>> values;
    values.reserve(result.return_values.size());
    for (const auto& value : result.return_values) values.push_back(value.value().template as<std::decay_t<R>>());
    return values;
  }
}
#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, which destroy a
/// join_options temporary twice when the call is part of a co_await
/// expression (`co_await f(spawn_and_join(fn, args, n, {...}))`). Refused
/// everywhere, since the call cannot tell whether it is inside one; a named
/// join_options is taken by the overload above.
template <class R, class... P, class... A>
auto spawn_and_join(R (*fn)(int, P...), std::tuple<A...> args, int nprocs, join_options&& options) {
  static_assert(detail::refused<R>,
                "g++ 12 destroys a join_options temporary twice inside co_await (std::move of a named one is "
                "refused too): name the options first, `join_options options{...}; "
                "spawn_and_join(fn, args, n, options);`");
  return spawn_and_join(fn, std::move(args), nprocs, static_cast<const join_options&>(options));
}
#endif
/// With default options. (An overload, not a default argument: g++ 12
/// destroys a defaulted `{}` twice when the call is part of a co_await
/// expression.)
template <class R, class... P, class... A>
auto spawn_and_join(R (*fn)(int, P...), std::tuple<A...> args, int nprocs) {
  const join_options defaults;
  return spawn_and_join(fn, std::move(args), nprocs, defaults);
}

}  // namespace cohort

COHORT_API_END
