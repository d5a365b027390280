// Functions as entry points, as torch.multiprocessing.spawn runs them;
// compiled with the examples and quoted in the README.
#include <cohort/cohort.hpp>

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

// Every rank gets its rank first, then the arguments given to all.
long sum_of_squares(int rank, long upto) {
  long sum = 0;
  for (long i = rank; i < upto; i += 4) sum += i * i;
  return sum;
}
COHORT_ENTRYPOINT(sum_of_squares);

void give_up_on_rank_two(int rank) {
  if (rank == 2) throw std::runtime_error("rank 2 gives up");
}
COHORT_ENTRYPOINT(give_up_on_rank_two);

int main(int argc, char** argv) {
  // A process started to run an entry point runs it here, and ends.
  if (auto rc = cohort::child_main(argc, argv)) return *rc;

  // Four processes (start method spawn: this program, re-executed).
  std::vector<long> parts = cohort::spawn_and_join(sum_of_squares, std::tuple{1000L}, 4);
  long total = 0;
  for (long part : parts) total += part;
  fmt::print("the squares below 1000 sum to {}\n", total);  // 332833500

  // The first failure stops the others and is thrown here.
  try {
    cohort::join_options options{.method = cohort::start_method::fork};
    cohort::spawn_and_join(give_up_on_rank_two, std::tuple{}, 4, options);
  } catch (const cohort::process_raised_error& e) {
    fmt::print("rank {} raised {}\n", e.rank(), e.message());  // rank 2 raised std::runtime_error: rank 2 gives up
  }
}
