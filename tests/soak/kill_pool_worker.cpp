// The pool's random-kill soak: a pool of four forked workers maps items whose
// results are 64 KiB storages the workers make (their memory goes with the
// worker that made it), and one worker is SIGKILLed at a random moment
// of the map, RUNS times; the group's shutdown then ends the others, their
// results in flight too. The map must end with the worker's death
// (process_exited_error), or with its results when it was done before the
// kill; anything else is a wrong error, of which it prints each kind once.
// Exits 1 when a map ended with a wrong error or did not end within 30 s.
//
//   kill_pool_worker [RUNS [SEED]]     (default 60 runs)
#include <cohort/cohort.hpp>

#include <fmt/format.h>

#include <asio/use_future.hpp>

#include <cxxabi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

namespace {

int worker_pid(int, int) {
  ::usleep(20000);  // long enough for the items to spread over the workers
  return ::getpid();
}
COHORT_ENTRYPOINT(worker_pid);

cohort::storage make_block(int, long value) {
  cohort::storage s = cohort::storage::allocate_shared(64 << 10);
  std::memset(s.data(), static_cast<int>(value), 16);
  return s;
}
COHORT_ENTRYPOINT(make_block);

}  // namespace

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  const int runs = argc > 1 ? std::atoi(argv[1]) : 60;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::atoll(argv[2])) : std::random_device{}();
  std::mt19937 random(seed);
  fmt::print("kill_pool_worker: {} runs, seed {}\n", runs, seed);
  int deaths = 0, finished = 0, wrong = 0;
  std::set<std::string> wrong_kinds;
  for (int i = 0; i < runs; ++i) {
    const cohort::pool_options options{.method = cohort::start_method::fork};
    cohort::pool p(4, options);
    const auto pids = p.map(worker_pid, std::vector<int>(8, 0));
    const std::vector<long> items(3000, 1);
    auto map = p.map(make_block, items, asio::use_future);
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 30000));
    ::kill(pids[0], SIGKILL);
    if (map.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      fmt::print("run {}: the map did not end within 30 s\n", i);
      std::fflush(stdout);
      std::_Exit(1);  // the pool's end would wait for it too
    }
    try {
      (void)map.get();
      ++finished;
    } catch (const cohort::process_exited_error&) {
      ++deaths;
    } catch (const std::exception& e) {
      ++wrong;
      int status = 0;
      char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
      const std::string kind = name != nullptr ? name : typeid(e).name();
      std::free(name);
      if (wrong_kinds.insert(kind).second) fmt::print("run {}: the map ended with {}: {}\n", i, kind, e.what());
    }
  }
  fmt::print("runs {}  the worker's death {}  finished before the kill {}  wrong errors {}\n", runs, deaths,
             finished, wrong);
  return wrong == 0 ? 0 : 1;
}
