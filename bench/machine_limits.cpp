// The machine's own limits, measured in one run: what the other benchmarks'
// cohort figures are held against. Nothing here uses cohort.
//
//   - pipeline: producer -> copying relay -> summer, three processes joined
//     by two single-producer single-consumer rings in shared memory, 64-byte
//     items (a small tensor's record): items/s end to end, quiet and with two
//     busy loops beside it; a stage that finds nothing to do either spins
//     on, or spins a little and then yields its CPU (three processes on two
//     cores: the one it waits for may be the one without a CPU)
//   - ping-pong: a futex word between two processes, one round trip
//   - a cache line handed between two processes on two CPUs, each spinning
//     until the other has written it: ns for one hand-over, one way (what a
//     value written by one process and next touched by another costs)
//   - exit: blocking waitid's wake after a child stamped the time and exited
//   - fork+exit+wait and posix_spawn(/bin/true)+wait of one child
//   - launcher: a minimal posix_spawn launcher (this program, re-executed)
//     starting K /bin/true and waiting for them, timed from outside, start
//     to exit, K = 1, 8, 32, 128
//   - files: 4 processes writing 64 MiB each straight to their own files
//
//   machine_limits [rounds]     (default 5; each figure: the median of the rounds, and their spread)
//   machine_limits --launch K   (the minimal launcher itself)
//   machine_limits --ring N     (one yielding pipeline of N items; prints its items/s, or 0 for a wrong sum)
//   machine_limits --line       (the hand-over of a cache line; prints its ns, or 0 where only one CPU is allowed)
#include "arguments.hpp"
#include "load.hpp"
#include "stats.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace bench = cohort::bench;
using bench::clock;
using bench::median;
using bench::percentile;

// Memory every process of a measurement shares (fork keeps it).
template <class T>
T* shared() {
  void* p = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return new (p) T();
}

template <class T>
void release(T* p) {
  p->~T();
  ::munmap(p, sizeof(T));
}

void wait_all(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

double now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

inline void relax() { __builtin_ia32_pause(); }

// --- pipeline -------------------------------------------------------------

// How a stage waits on a ring it can do nothing with.
enum class waiting {
  spin,   // pause and look again, however long it takes
  yield,  // the same, but every 64th look hands the CPU over (sched_yield)
};

inline void wait_a_little(waiting how, unsigned& looks) {
  if (how == waiting::yield && ++looks % 64 == 0) ::sched_yield();
  else relax();
}

struct item {
  std::uint64_t value;
  std::uint8_t payload[56];
};

constexpr std::size_t ring_slots = 4096;

struct alignas(64) ring {
  alignas(64) std::atomic<std::uint64_t> head{0};  // next to write
  alignas(64) std::atomic<std::uint64_t> tail{0};  // next to read
  alignas(64) item slots[ring_slots];

  void push(const item& x, waiting how) {
    const auto h = head.load(std::memory_order_relaxed);
    for (unsigned looks = 0; h - tail.load(std::memory_order_acquire) == ring_slots;) wait_a_little(how, looks);
    slots[h % ring_slots] = x;
    head.store(h + 1, std::memory_order_release);
  }
  item pop(waiting how) {
    const auto t = tail.load(std::memory_order_relaxed);
    for (unsigned looks = 0; head.load(std::memory_order_acquire) == t;) wait_a_little(how, looks);
    item x = slots[t % ring_slots];
    tail.store(t + 1, std::memory_order_release);
    return x;
  }
};

struct pipeline_memory {
  ring first, second;
  std::atomic<int> go{0};
  std::atomic<std::uint64_t> sum{0};
};

// Items per second from the stages' start (all three wait on one flag) to
// the reaping of the last to end.
double pipeline(std::uint64_t items, waiting how) {
  auto* m = shared<pipeline_memory>();
  std::vector<pid_t> pids;
  const auto stage = [&](auto body) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      while (m->go.load(std::memory_order_acquire) == 0) relax();
      body();
      ::_exit(0);
    }
    pids.push_back(pid);
  };
  stage([&] {
    item x{};
    for (std::uint64_t i = 0; i < items; ++i) {
      x.value = i;
      m->first.push(x, how);
    }
  });
  stage([&] {
    for (std::uint64_t i = 0; i < items; ++i) m->second.push(m->first.pop(how), how);
  });
  stage([&] {
    std::uint64_t sum = 0;
    for (std::uint64_t i = 0; i < items; ++i) sum += m->second.pop(how).value;
    m->sum.store(sum);
  });
  const auto start = clock::now();
  m->go.store(1, std::memory_order_release);
  wait_all(pids);
  const double rate = static_cast<double>(items) / bench::seconds_since(start);
  const bool right = m->sum.load() == items * (items - 1) / 2;
  release(m);
  return right ? rate : 0;
}

// --- futex ping-pong ------------------------------------------------------

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

struct pingpong_memory {
  alignas(64) std::atomic<std::uint32_t> word{0};  // 2i+1: the ball is with the ponger, 2i+2: back
};

// Round trips in µs: the pinger passes the ball and sleeps on the word until
// it comes back; the ponger sleeps until it has it, and passes it back.
std::vector<double> pingpong(int trips) {
  auto* m = shared<pingpong_memory>();
  const auto n = static_cast<std::uint32_t>(trips);
  const pid_t ponger = ::fork();
  if (ponger == 0) {
    for (std::uint32_t i = 0; i < n; ++i) {
      while (m->word.load(std::memory_order_acquire) == 2 * i) futex(&m->word, FUTEX_WAIT, 2 * i);
      m->word.store(2 * i + 2, std::memory_order_release);
      futex(&m->word, FUTEX_WAKE, 1);
    }
    ::_exit(0);
  }
  std::vector<double> us;
  us.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const double start = now_ns();
    m->word.store(2 * i + 1, std::memory_order_release);
    futex(&m->word, FUTEX_WAKE, 1);
    while (m->word.load(std::memory_order_acquire) == 2 * i + 1) futex(&m->word, FUTEX_WAIT, 2 * i + 1);
    us.push_back((now_ns() - start) / 1e3);
  }
  wait_all({ponger});
  release(m);
  return us;
}

// --- a cache line between two CPUs -----------------------------------------

struct handover_memory {
  alignas(64) std::atomic<std::uint64_t> ball{0};  // 2i+1: the answerer's turn, 2i+2: back
};

// Waits until `ball` holds `value` as a yielding ring stage waits: a
// partner without a CPU gets one.
void spin_until_ball(const std::atomic<std::uint64_t>& ball, std::uint64_t value) {
  for (unsigned looks = 0; ball.load(std::memory_order_acquire) != value;) wait_a_little(waiting::yield, looks);
}

// ns for one hand-over of a cache line from one process to another, one
// way: the median over `batches` batches of `trips` round trips (two
// hand-overs each). 0 where this process may only run on one CPU: the two
// could not both spin.
double line_handover_ns(int batches, std::uint64_t trips) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return 0;
  auto* m = shared<handover_memory>();
  const std::uint64_t total = trips * static_cast<std::uint64_t>(batches);
  const pid_t answerer = ::fork();
  if (answerer == 0) {
    for (std::uint64_t i = 0; i < total; ++i) {
      spin_until_ball(m->ball, 2 * i + 1);
      m->ball.store(2 * i + 2, std::memory_order_release);
    }
    ::_exit(0);
  }
  std::vector<double> ns;
  for (std::uint64_t i = 0; i < total;) {
    const double start = now_ns();
    for (const std::uint64_t end = i + trips; i < end; ++i) {
      m->ball.store(2 * i + 1, std::memory_order_release);
      spin_until_ball(m->ball, 2 * i + 2);
    }
    ns.push_back((now_ns() - start) / (2.0 * static_cast<double>(trips)));
  }
  wait_all({answerer});
  release(m);
  return median(ns);
}

// --- process start and exit -----------------------------------------------

struct stamp_memory {
  std::atomic<double> exited_ns{0};
};

// µs from a child's last instruction before _exit to its parent's return
// from a blocking waitid.
std::vector<double> exit_wakes(int children) {
  auto* m = shared<stamp_memory>();
  std::vector<double> us;
  for (int i = 0; i < children; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      m->exited_ns.store(now_ns());
      ::_exit(0);
    }
    siginfo_t info{};
    ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED);
    us.push_back((now_ns() - m->exited_ns.load()) / 1e3);
  }
  release(m);
  return us;
}

std::vector<double> fork_exit_wait(int children) {
  std::vector<double> us;
  for (int i = 0; i < children; ++i) {
    const double start = now_ns();
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    wait_all({pid});
    us.push_back((now_ns() - start) / 1e3);
  }
  return us;
}

pid_t spawn_quietly(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    fmt::print(stderr, "machine_limits: posix_spawn {}: {}\n", args[0], std::strerror(rc));
    std::exit(1);
  }
  return pid;
}

std::vector<double> spawn_true_wait(int children) {
  std::vector<double> us;
  for (int i = 0; i < children; ++i) {
    const double start = now_ns();
    wait_all({spawn_quietly({"/bin/true"})});
    us.push_back((now_ns() - start) / 1e3);
  }
  return us;
}

// The minimal launcher: K children of /bin/true at once, then their exits.
int launch(int k) {
  std::vector<pid_t> pids;
  for (int i = 0; i < k; ++i) pids.push_back(spawn_quietly({"/bin/true"}));
  wait_all(pids);
  return 0;
}

// ms from starting `machine_limits --launch K` to its exit.
double launcher_ms(const std::string& self, int k) {
  const double start = now_ns();
  wait_all({spawn_quietly({self, "--launch", std::to_string(k)})});
  return (now_ns() - start) / 1e6;
}

// --- files ----------------------------------------------------------------

// MB/s of `writers` processes each writing `bytes` to its own file in 64 KiB writes.
double files(int writers, std::size_t bytes) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("cohort-limits-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids;
  const auto start = clock::now();
  for (int w = 0; w < writers; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const auto path = dir / std::to_string(w);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      std::vector<char> block(64 * 1024, 'x');
      for (std::size_t done = 0; fd >= 0 && done < bytes; done += block.size()) {
        if (::write(fd, block.data(), block.size()) < 0) ::_exit(1);
      }
      ::_exit(fd >= 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  wait_all(pids);
  const double rate = static_cast<double>(writers) * static_cast<double>(bytes) / 1e6 / bench::seconds_since(start);
  std::filesystem::remove_all(dir);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  bench::line_buffered_stdout();
  if (argc == 3 && std::string(argv[1]) == "--launch") return launch(std::atoi(argv[2]));
  if (argc == 3 && std::string(argv[1]) == "--ring") {
    fmt::print("{:.0f}\n", pipeline(std::max(2ULL, std::strtoull(argv[2], nullptr, 10)), waiting::yield));
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--line") {
    fmt::print("{:.1f}\n", line_handover_ns(10, 20'000));
    return 0;
  }
  std::vector<int> counts{5};
  const char* const usage = "machine_limits [rounds = 5] | --launch K | --ring N | --line";
  if (const auto rc = bench::read_counts(argc, argv, usage, counts)) return *rc;
  const int rounds = counts[0];
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  const std::vector<int> launcher_ks{1, 8, 32, 128};

  std::vector<double> spin_rate, spin_loaded, yield_rate, yield_loaded, ping_p50, ping_p99, line_ns, exit_p50, fork_p50,
      spawn_p50, file_rate;
  std::vector<std::vector<double>> launched(launcher_ks.size());
  // Every measurement once per round, in turn: drift hits them alike.
  for (int round = 0; round < rounds; ++round) {
    spin_rate.push_back(pipeline(2'000'000, waiting::spin) / 1e6);
    yield_rate.push_back(pipeline(20'000'000, waiting::yield) / 1e6);
    {
      const bench::busy_loops load(2);
      spin_loaded.push_back(pipeline(500'000, waiting::spin) / 1e6);
      yield_loaded.push_back(pipeline(5'000'000, waiting::yield) / 1e6);
    }
    const auto trips = pingpong(20'000);
    ping_p50.push_back(percentile(trips, 50));
    ping_p99.push_back(percentile(trips, 99));
    line_ns.push_back(line_handover_ns(10, 20'000));
    exit_p50.push_back(median(exit_wakes(200)));
    fork_p50.push_back(median(fork_exit_wait(200)));
    spawn_p50.push_back(median(spawn_true_wait(100)));
    for (std::size_t i = 0; i < launcher_ks.size(); ++i) {
      std::vector<double> ms;
      for (int j = 0; j < 10; ++j) ms.push_back(launcher_ms(self, launcher_ks[i]));
      launched[i].push_back(median(ms));
    }
    file_rate.push_back(files(4, 64u << 20));
  }
  fmt::print("The machine's limits, median of {} rounds (spread across rounds)\n", rounds);
  // A space always parts the label from its figure, however long the
  // label: bench/repeat finds a row's numbers as words of their own.
  const auto row = [](const std::string& label, const std::vector<double>& figures, const char* format,
                      const char* unit) { fmt::print("  {:<58} {}\n", label, bench::spread_text(figures, format, unit)); };
  row("raw ring pipeline, 3 processes, 64-byte items, yielding", yield_rate, "{:.2f}", "M items/s");
  row("  the same, two busy loops beside it", yield_loaded, "{:.2f}", "M items/s");
  row("raw ring pipeline, spinning only", spin_rate, "{:.2f}", "M items/s");
  row("  the same, two busy loops beside it", spin_loaded, "{:.2f}", "M items/s");
  row("futex ping-pong between 2 processes, round trip, p50", ping_p50, "{:.2f}", "us");
  row("futex ping-pong between 2 processes, round trip, p99", ping_p99, "{:.2f}", "us");
  if (line_ns.front() > 0) row("a cache line handed between 2 processes on 2 CPUs, one way", line_ns, "{:.0f}", "ns");
  else fmt::print("  {:<58} {}\n", "a cache line handed between 2 processes on 2 CPUs", "not measured: one CPU allowed");
  row("exit to blocking waitid's wake, p50", exit_p50, "{:.1f}", "us");
  row("fork + _exit + wait, p50", fork_p50, "{:.1f}", "us");
  row("posix_spawn /bin/true + wait, p50", spawn_p50, "{:.1f}", "us");
  for (std::size_t i = 0; i < launcher_ks.size(); ++i) {
    row(fmt::format("minimal posix_spawn launcher, K = {}, start to exit", launcher_ks[i]), launched[i], "{:.2f}", "ms");
  }
  row("4 writers straight to files, 64 MiB each", file_rate, "{:.0f}", "MB/s");
  return 0;
}
