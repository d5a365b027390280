// The random-kill soak: a producer -> cloning relay -> summer pipeline of
// small shared tensors, one of its three ranks SIGKILLed at a random moment,
// RUNS times under each sharing strategy. After every run it looks for what
// must never happen and prints, per strategy: runs, hangs (a run that did
// not end within 30 s), leaks (cohort files in /dev/shm, descriptors of this
// process), orphans (a rank or a child of this process still there), wrong
// errors (a survivor ending with anything but its work done or peer_lost),
// and the time from the kill to a survivor's peer_lost (p50/p99/max). It
// also counts the survivors the supervisor's shutdown had to end (after a
// grace, 10 s unless GRACE says how many seconds): those that waited on a
// peer killed before it ever used the queue, or that waited at their end
// for a receiver. Exits 1 when any of hangs, leaks, orphans or wrong errors
// was seen.
//
//   kill_pipeline [RUNS [SEED [GRACE]]]     (default 20 runs per strategy)
#include <cohort/cohort.hpp>

#include <fmt/format.h>

#include <asio/io_context.hpp>

#include <dirent.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// What a rank leaves in its slot of the shared outcome storage.
constexpr std::int64_t finished = 1;      // its work done
constexpr std::int64_t wrong_error = -1;  // anything else; larger values are the time of peer_lost

// Rank 0 pushes `items` tensors into `first`; rank 1 clones each from
// `first` into `second`; rank 2 sums what comes out of `second`.
void stage(int rank, cohort::queue<cohort::tensor> first, cohort::queue<cohort::tensor> second,
           cohort::storage outcome, std::int64_t items) {
  auto* slot = reinterpret_cast<std::int64_t*>(outcome.data()) + rank;
  try {
    for (std::int64_t i = 0; i < items; ++i) {
      if (rank == 0) {
        first.put(cohort::tensor::full({4}, static_cast<double>(i), cohort::dtype::float32, {.shared = true}));
      } else if (rank == 1) {
        second.put(first.get().value().clone({.shared = true}));
      } else {
        (void)second.get().value();
      }
    }
    *slot = finished;
  } catch (const cohort::peer_lost&) {
    *slot = now_ns();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    *slot = wrong_error;
  }
}
COHORT_ENTRYPOINT(stage);

void nothing(int) {}
COHORT_ENTRYPOINT(nothing);

int open_fds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// The cohort files in /dev/shm that one of `makers` made.
int files_of(const std::vector<pid_t>& makers) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const auto name = e.path().filename().string();
    for (pid_t p : makers) {
      if (name.rfind(fmt::format("cohort_{}_", p), 0) == 0) ++n;
    }
  }
  return n;
}

bool exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// This process's children, running or not yet reaped.
int children() {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::FILE* f = std::fopen((task.path() / "children").c_str(), "re");
    if (f == nullptr) continue;
    int pid = 0;
    while (std::fscanf(f, "%d", &pid) == 1) ++n;
    std::fclose(f);
  }
  return n;
}

struct tally {
  int runs = 0, hangs = 0, leaked_files = 0, leaked_fds = 0, orphans = 0, wrong_errors = 0, ended_by_shutdown = 0;
  std::vector<double> latency_ms;
};

void run_once(std::mt19937& random, std::chrono::seconds grace, tally& t) {
  const int fds_before = open_fds();
  const int children_before = children();
  std::vector<pid_t> makers{::getpid()};
  {
    cohort::queue<cohort::tensor> first(64), second(64);
    cohort::storage outcome = cohort::storage::allocate_shared(3 * sizeof(std::int64_t));
    std::fill_n(reinterpret_cast<std::int64_t*>(outcome.data()), 3, 0);
    cohort::group_spec spec;
    spec.name = "pipeline";
    spec.entry = cohort::call(cohort::start_method::fork, stage, first, second, outcome, std::int64_t{200000});
    spec.nprocs = 3;
    spec.shutdown.grace = grace;  // survivors end by themselves first
    asio::io_context io;
    cohort::group g = cohort::start_processes(io.get_executor(), spec);
    std::thread runner([&io] { io.run(); });
    const auto pids = g.pids();
    makers.insert(makers.end(), pids.begin(), pids.end());
    const int victim = std::uniform_int_distribution<int>(0, 2)(random);
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(1000, 120000)(random)));
    const std::int64_t killed_at = now_ns();
    ::kill(pids[victim], SIGKILL);
    const bool ended = g.join(std::chrono::seconds(30));
    if (!ended) {
      ++t.hangs;
      g.stop();
      g.join(std::chrono::seconds(30));
    }
    io.stop();
    runner.join();
    const auto* seen = reinterpret_cast<const std::int64_t*>(outcome.data());
    const auto result = g.result();
    for (int r = 0; r < 3; ++r) {
      if (r == victim) continue;
      if (seen[r] == wrong_error) ++t.wrong_errors;
      if (seen[r] > finished) t.latency_ms.push_back(static_cast<double>(seen[r] - killed_at) / 1e6);
      if (ended && result && result->statuses.size() > static_cast<std::size_t>(r) && result->statuses[r] &&
          result->statuses[r]->signaled()) {
        ++t.ended_by_shutdown;
      }
    }
  }
  cohort::trim_shared_memory();
  for (pid_t p : std::vector<pid_t>(makers.begin() + 1, makers.end())) {
    if (exists(p)) ++t.orphans;
  }
  if (children() > children_before) ++t.orphans;
  if (files_of(makers) > 0) ++t.leaked_files;
  if (open_fds() > fds_before) ++t.leaked_fds;
  ++t.runs;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  const int runs = argc > 1 ? std::atoi(argv[1]) : 20;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::atoll(argv[2])) : std::random_device{}();
  const std::chrono::seconds grace(argc > 3 ? std::atoi(argv[3]) : 10);
  std::mt19937 random(seed);
  fmt::print("kill_pipeline: {} runs per strategy, seed {}\n", runs, seed);
  bool clean = true;
  // What a process keeps from its first run of ranks on (the socket its
  // ranks hand memory over on) is made before the descriptors are counted.
  cohort::spawn_and_join(nothing, std::tuple{}, 1);
  for (auto strategy : {cohort::sharing_strategy::file_descriptor, cohort::sharing_strategy::file_system}) {
    cohort::set_sharing_strategy(strategy);
    // The arena's first segment, kept for later values, is made before the
    // descriptors are counted.
    (void)cohort::storage::allocate_shared(64);
    tally t;
    for (int i = 0; i < runs; ++i) run_once(random, grace, t);
    fmt::print("{:16} runs {:4}  hangs {}  leaked: files {} descriptors {}  orphans {}  wrong errors {}  "
               "ended by the shutdown {}  kill -> peer_lost ms: p50 {:.1f} p99 {:.1f} max {:.1f} (n {})\n",
               cohort::to_string(strategy), t.runs, t.hangs, t.leaked_files, t.leaked_fds, t.orphans, t.wrong_errors,
               t.ended_by_shutdown,
               percentile(t.latency_ms, 0.5), percentile(t.latency_ms, 0.99),
               t.latency_ms.empty() ? 0.0 : *std::max_element(t.latency_ms.begin(), t.latency_ms.end()),
               t.latency_ms.size());
    clean = clean && t.hangs == 0 && t.leaked_files == 0 && t.leaked_fds == 0 && t.orphans == 0 && t.wrong_errors == 0;
  }
  return clean ? 0 : 1;
}
