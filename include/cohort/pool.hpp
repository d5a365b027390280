// A pool of worker processes mapping a registered function over items
// (torch.multiprocessing's Pool.map): tensors and storages in the items
// are shared with the workers, not copied.
#pragma once

#include "cohort/export.hpp"

#include "cohort/entry_point.hpp"
#include "cohort/group.hpp"
#include "cohort/process_error.hpp"
#include "cohort/queue.hpp"

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

struct pool_options {
  start_method method = start_method::spawn;
  /// How each worker starts (environment, directory, standard streams...).
  spawn_options spawn{};
  shutdown_policy shutdown{};
};

namespace detail {
class pool_state;
/// Runs `tasks` (encoded arguments) through the function registered as
/// `name`; returns the encoded results in order. Throws as pool::map.
std::vector<std::optional<encoded>> pool_run(pool_state& pool, const std::string& name,
                                             const std::vector<encoded>& tasks);
}  // namespace detail

/// `workers` processes, started at construction, ended at destruction
/// (they finish the item in hand first). A function mapped over items is
/// registered with COHORT_ENTRYPOINT and called as fn(worker, item), where
/// `worker` is the index of the process running it. One map at a time;
/// map() may be called from any thread.
class pool {
 public:
  /// Starts the workers. Throws what start_processes throws.
  explicit pool(int workers, const pool_options& options = {});
  pool(pool&&) noexcept;
  pool& operator=(pool&&) noexcept;
  /// Lets the workers finish their item in hand, then ends them.
  ~pool();

  /// fn(worker, item) for every item, spread over the workers; returns the
  /// results in the items' order (nothing for a void fn). An exception
  /// escaping fn is thrown here as process_raised_error-like std::runtime_error
  /// naming the item and the exception; the pool stays usable. A worker that
  /// dies ends the pool: its failure (process_exited_error) is thrown, and
  /// every later map throws std::logic_error. Returned handles (tensors,
  /// storages) stay valid: each worker keeps what it returned until the
  /// pool ends.
  template <class R, class A>
  auto map(R (*fn)(int, A), const std::vector<std::decay_t<A>>& items) {
    detail::check_signature<R, A>();
    const auto& name = detail::registered_name(reinterpret_cast<detail::erased_function>(fn));
    std::vector<encoded> tasks;
    tasks.reserve(items.size());
    for (const auto& item : items) tasks.push_back(encode(std::tuple<std::decay_t<A>>(item)));
    auto results = detail::pool_run(*state_, name, tasks);
    if constexpr (!std::is_void_v<R>) {
      std::vector<std::decay_t<R>> values;
      values.reserve(results.size());
      for (const auto& r : results) values.push_back(r.value().template as<std::decay_t<R>>());
      return values;
    }
  }

  int workers() const noexcept;

 private:
  std::unique_ptr<detail::pool_state> state_;
};

}  // namespace cohort

COHORT_API_END
