// Refused on g++ 12: a join_options temporary, in a spawn_and_join whose
// result is part of a co_await expression.
// expected error: g++ 12 destroys a join_options temporary twice inside co_await
#include "cohort/spawn_and_join.hpp"

#include <asio/awaitable.hpp>

long rank_times_ten(int rank) { return rank * 10L; }
COHORT_ENTRYPOINT(rank_times_ten);

asio::awaitable<long> sum(std::vector<long> values) {
  long total = 0;
  for (long v : values) total += v;
  co_return total;
}

asio::awaitable<void> run() {
  long total = co_await sum(cohort::spawn_and_join(rank_times_ten, std::tuple{}, 2,
                                                   cohort::join_options{.method = cohort::start_method::fork}));
}
