// Tensors shared between processes without a copy, as torch.multiprocessing
// shares them; compiled with the examples and quoted in the README.
#include <cohort/cohort.hpp>

#include <fmt/format.h>

// Rank 0 makes tensors in shared memory and sends them; rank 1 doubles
// each in place and sends it back. Only handles travel through the queues.
void stage(int rank, cohort::queue<cohort::tensor> to_worker, cohort::queue<cohort::tensor> back, int n) {
  for (int i = 0; i < n; ++i) {
    if (rank == 0) {
      to_worker.put(cohort::tensor::full({2, 3}, i, cohort::dtype::float32, {.shared = true}));
    } else {
      cohort::tensor t = to_worker.get().value();
      for (float& x : t.data<float>()) x *= 2;
      back.put(t.select(1, 0));  // a view: the receiver sees the same bytes
    }
  }
}
COHORT_ENTRYPOINT(stage);

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  cohort::queue<cohort::tensor> to_worker(16), back(16);
  cohort::spawn_and_join(stage, std::tuple{to_worker, back, 3}, 2);
  // The ranks have ended, and what they sent is still here: as a rank
  // ends, the memory its values in flight name goes to this process.
  for (int i = 0; i < 3; ++i) {
    cohort::tensor column = back.get().value();
    fmt::print("{} shared={}\n", column, column.is_shared());
  }
}
