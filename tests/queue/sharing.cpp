// torch's test/test_multiprocessing.py on the CPU, ported: tensors shared
// with children, sent through queues and pools, inherited over fork, and
// pipelines that lose a process to SIGKILL. Every behaviour runs under both
// sharing strategies, many times, each time under a leak check.
#include "cohort/tensor.hpp"

#include "cohort/event.hpp"
#include "cohort/group.hpp"
#include "cohort/pool.hpp"
#include "cohort/queue.hpp"
#include "cohort/spawn_and_join.hpp"

#include "os/process_identity.hpp"
#include "queue/peers.hpp"
#include "shm/segment.hpp"
#include "shm/segment_name.hpp"

#include "support/harness.hpp"
#include "support/join_by.hpp"
#include "support/process_probe.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <doctest/doctest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace cohort;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A value whose read kills its process: a receiver killed in the middle
// of a value's decode, after the handles before it were taken. In the
// process `spared` names (the test's own, which drops what is left in its
// queues) the read fails instead.
struct dies_in_decode {
  static inline pid_t spared = 0;
};
template <>
struct cohort::detail::handle_codec<dies_in_decode> {
  static std::string signature() { return "dies_in_decode"; }
  static std::size_t size_bound(const dies_in_decode&) noexcept { return 1; }
  static void write(std::vector<std::byte>& out, const dies_in_decode&) { out.push_back(std::byte{1}); }
  [[noreturn]] static dies_in_decode read(reader&) {
    if (::getpid() == dies_in_decode::spared) throw decode_error("dies_in_decode: read in the spared process");
    ::raise(SIGKILL);
    std::abort();
  }
};

// A kill inside a pop's take, between its claim and its move of the
// head: the take calls sched_getcpu there, which this program defines.
std::atomic<bool> die_at_next_cpu_query{false};
extern "C" int sched_getcpu() noexcept {
  if (die_at_next_cpu_query.load()) ::raise(SIGKILL);
  unsigned cpu = 0;
  return ::syscall(SYS_getcpu, &cpu, nullptr, nullptr) == 0 ? static_cast<int>(cpu) : -1;
}

// A value whose read pops from another queue (`from`, set in the process
// that reads it), as a codec of the program's own may.
struct pops_in_decode {
  static inline std::optional<cohort::queue<int>> from;
};
template <>
struct cohort::detail::handle_codec<pops_in_decode> {
  static std::string signature() { return "pops_in_decode"; }
  static std::size_t size_bound(const pops_in_decode&) noexcept { return 1; }
  static void write(std::vector<std::byte>& out, const pops_in_decode&) { out.push_back(std::byte{1}); }
  static pops_in_decode read(reader& in) {
    (void)in.next();
    if (pops_in_decode::from) (void)pops_in_decode::from->try_pop();
    return {};
  }
};
// A value whose read is refused.
struct refused_in_decode {};
template <>
struct cohort::detail::handle_codec<refused_in_decode> {
  static std::string signature() { return "refused_in_decode"; }
  static std::size_t size_bound(const refused_in_decode&) noexcept { return 1; }
  static void write(std::vector<std::byte>& out, const refused_in_decode&) { out.push_back(std::byte{1}); }
  [[noreturn]] static refused_in_decode read(reader&) { throw decode_error("refused_in_decode: refused"); }
};

namespace sharing_tests {

constexpr int repetitions = 30;

const sharing_strategy strategies[] = {sharing_strategy::file_descriptor, sharing_strategy::file_system};
const start_method methods[] = {start_method::fork, start_method::spawn, start_method::forkserver};

// This process's open descriptors, with what each names.
std::map<int, std::string> open_descriptors() {
  std::map<int, std::string> fds;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    fds[std::stoi(e.path().filename().string())] = fs::read_symlink(e.path(), ec).string();
  }
  return fds;
}

// The /dev/shm files of named segments that a repetition may have left:
// those of this process, of `children`, and of any process that has ended
// (made since `since`: older litter of other programs is none of this
// test's business).
std::vector<std::string> stray_segments(const std::vector<pid_t>& children, std::time_t since) {
  std::vector<std::string> stray;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const auto name = e.path().filename().string();
    int maker = 0;
    if (std::sscanf(name.c_str(), "cohort_%d_", &maker) != 1) continue;
    const bool ours = maker == ::getpid() || std::find(children.begin(), children.end(), maker) != children.end();
    struct stat st {};
    const bool dead = ::kill(maker, 0) == -1 && errno == ESRCH && ::stat(e.path().c_str(), &st) == 0 &&
                      st.st_ctim.tv_sec >= since;
    if (ours || dead) stray.push_back(name);
  }
  return stray;
}

// One repetition's leak check, made first and destroyed last: once the
// repetition's values are gone and this process has let go of what it
// keeps for reuse, nothing of the repetition is left in /dev/shm and this
// process holds no more descriptors than before.
struct leak_check {
  std::map<int, std::string> fds_before = open_descriptors();
  std::time_t since = std::time(nullptr) - 1;  // file times come from a coarser clock
  std::vector<pid_t> children;                 // the ranks' pids, where the repetition knows them

  leak_check() = default;
  leak_check(const leak_check&) = delete;
  leak_check& operator=(const leak_check&) = delete;
  ~leak_check() {
    trim_shared_memory();
    auto stray = stray_segments(children, since);
    // A group of another test program may be between reaping its rank and
    // sweeping that rank's files: what is left for good is still there later.
    for (int i = 0; i < 25 && !stray.empty(); ++i) {
      std::this_thread::sleep_for(10ms);
      trim_shared_memory();
      stray = stray_segments(children, since);
    }
    CHECK_MESSAGE(stray.empty(), fmt::format("left in /dev/shm: {}", fmt::join(stray, ", ")));
    const auto descriptors = [] {
      auto fds = open_descriptors();
      // The death notice's, made at the first sleeping wait and kept for
      // the process's life (as the arena's first segment is).
      fds.erase(detail::death_notice::of_this_process().descriptor());
      return fds;
    };
    auto fds = descriptors();
    // The keeper's watcher thread may be between taking a segment it let
    // go of off its list and closing it: what is kept for good is still
    // there later.
    for (int i = 0; i < 25 && fds.size() > fds_before.size(); ++i) {
      std::this_thread::sleep_for(10ms);
      trim_shared_memory();
      fds = descriptors();
    }
    std::vector<std::string> kept;
    for (const auto& [fd, target] : fds) {
      if (auto it = fds_before.find(fd); it == fds_before.end() || it->second != target) {
        kept.push_back(fmt::format("{} -> {}", fd, target));
      }
    }
    CHECK_MESSAGE(fds.size() <= fds_before.size(), fmt::format("descriptors kept: {}", fmt::join(kept, ", ")));
  }
};

// Sets the strategy for one test; file_descriptor again at its end.
struct strategy_scope {
  explicit strategy_scope(sharing_strategy s) { set_sharing_strategy(s); }
  ~strategy_scope() { set_sharing_strategy(sharing_strategy::file_descriptor); }
  strategy_scope(const strategy_scope&) = delete;
  strategy_scope& operator=(const strategy_scope&) = delete;
};

void nothing(int) {}
COHORT_ENTRYPOINT(nothing);

// Starts what a process keeps from its first run of ranks on (its private
// error directory, the forkserver), so that no repetition counts it as kept.
void warm_up() {
  static const bool done = [] {
    spawn_and_join(nothing, std::tuple{}, 1, test::join_by(start_method::forkserver));
    return true;
  }();
  (void)done;
}

// Runs body(check, repetition) `times` times under each strategy, each
// time under a fresh leak_check.
template <class Body>
void repeat_under_each_strategy(int times, Body body) {
  warm_up();
  for (auto strategy : strategies) {
    const strategy_scope scope(strategy);
    for (int i = 0; i < times; ++i) {
      CAPTURE(to_string(strategy));
      CAPTURE(i);
      leak_check check;
      body(check, i);
    }
  }
}

// 0, 1, ... 24 as float32, 5 x 5, in private memory.
tensor counting_5x5() {
  std::vector<float> values(25);
  for (int i = 0; i < 25; ++i) values[i] = static_cast<float>(i);
  return tensor::from_data<float>(values, {5, 5});
}

// /dev/shm files of segments this process made.
std::vector<std::string> own_named_segments() {
  std::vector<std::string> found;
  const auto prefix = fmt::format("cohort_{}_", ::getpid());
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().starts_with(prefix)) found.push_back(e.path().filename().string());
  }
  return found;
}

// As torch's simple_fill: fills row 0 of the tensor it was given and row 1
// of the one it receives, says so, and stays until the parent has looked.
void fill_rows(int, tensor given, queue<tensor> q, event filled, event looked) {
  given.select(0, 0).fill_(4);
  tensor received = q.get(10s).value();
  received.select(0, 1).fill_(7);
  filled.set();
  looked.wait_for(10s);
}
COHORT_ENTRYPOINT(fill_rows);

// As torch's send_tensor: sends one tensor of ones twice and stays until
// the parent has both.
void send_twice(int, queue<tensor> q, event received, int type) {
  const tensor t = tensor::full({5, 5}, 1, static_cast<dtype>(type));
  q.put(t);
  q.put(t);
  received.wait_for(10s);
}
COHORT_ENTRYPOINT(send_twice);

using views = std::tuple<storage, tensor, tensor, tensor, tensor>;

// Receives a storage, a 5 x 5 tensor over it, its row 2, its column 1 and
// its transpose; writes 100 through the row. Returns whether all are one
// storage, the views' offsets and strides, and what the column, the
// transpose and the raw storage then hold where the row crosses them.
std::vector<std::int64_t> inspect_views(int, queue<views> q) {
  auto [s, x, row, column, transposed] = q.get(10s).value();
  const bool one = s.same(x.storage()) && same_storage(x, row) && same_storage(x, column) &&
                   same_storage(x, transposed);
  std::vector<std::int64_t> seen{one,
                                 row.storage_offset(),
                                 row.strides()[0],
                                 column.storage_offset(),
                                 column.strides()[0],
                                 transposed.strides()[0],
                                 transposed.strides()[1]};
  row.fill_(100);
  float raw = 0;
  std::memcpy(&raw, s.data() + (2 * 5 + 1) * sizeof(float), sizeof raw);
  for (float v : {column.at<float>({2}), transposed.at<float>({1, 2}), raw, column.at<float>({3})}) {
    seen.push_back(static_cast<std::int64_t>(v));
  }
  return seen;
}
COHORT_ENTRYPOINT(inspect_views);

// As torch's simple_pool_fill: fills the buffer with 4 and returns a new
// tensor of 5s.
tensor pool_fill(int, tensor buffer) {
  buffer.fill_(4);
  return tensor::full(buffer.shape(), 5, buffer.dtype());
}
COHORT_ENTRYPOINT(pool_fill);

// Made shared before a fork, for the forked ranks to see.
tensor inherited;

// Returns the element [4][4] it found, then adds 3 + rank to its row.
std::int64_t add_to_inherited_row(int rank) {
  const float found = inherited.at<float>({4, 4});
  for (int j = 0; j < 5; ++j) inherited.at<float>({rank, j}) += static_cast<float>(3 + rank);
  return static_cast<std::int64_t>(found);
}
COHORT_ENTRYPOINT(add_to_inherited_row);

// Sends back every tensor it receives, then empty ones of its own.
void echo_with_empties(int, queue<tensor> in, queue<tensor> out, int n, event received) {
  for (int i = 0; i < n; ++i) out.put(in.get(10s).value());
  out.put(tensor::empty({0}, dtype::int64));
  out.put(tensor::zeros({2, 0}, dtype::bfloat16, {.shared = true}));
  received.wait_for(10s);
}
COHORT_ENTRYPOINT(echo_with_empties);

// Under a limit of 64 descriptors, receives `n` tensors, keeps them all,
// and returns the sum of their first elements; -1 when the limit cannot be
// set.
std::int64_t sum_under_fd_limit(int, queue<tensor> q, int n) {
  rlimit limit{64, 64};
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  std::vector<tensor> kept;
  std::int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    kept.push_back(q.get(10s).value());
    sum += kept.back().at<std::int32_t>({0});
  }
  return sum;
}
COHORT_ENTRYPOINT(sum_under_fd_limit);

// Under a limit of 64 descriptors, receives `n` tensors that each have a
// segment of their own, value i in the i-th, keeping them all or dropping
// each as it comes. Returns how many held their value, then how many more
// descriptors than at its start it held once it had dropped them all; -1s
// when the limit cannot be set.
std::vector<std::int64_t> receive_own_segments_under_fd_limit(int, queue<tensor> q, int n, bool keep) {
  rlimit limit{64, 64};
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return {-1, -1};
  const auto before = static_cast<std::int64_t>(open_descriptors().size());
  std::vector<tensor> kept;
  std::int64_t right = 0;
  for (int i = 0; i < n; ++i) {
    const tensor t = q.get(10s).value();
    right += t.at<float>({t.numel() - 1}) == static_cast<float>(i) ? 1 : 0;
    if (keep) kept.push_back(t);
  }
  kept.clear();
  return {right, static_cast<std::int64_t>(open_descriptors().size()) - before};
}
COHORT_ENTRYPOINT(receive_own_segments_under_fd_limit);

// How a stage of the pipeline ended: items it passed on (the consumer:
// received), the pid and rank that the peer_lost ending its wait named (0
// and -1 when none did), and whether every item came in order with the
// values the stages before it wrote.
using stage_outcome = std::tuple<int, int, int, bool>;

// The pipeline producer -> relay -> consumer over `first` and `second`:
// rank 0 puts tensors of `items` values i, rank 1 adds 1000 to each in
// place and passes it on, rank 2 receives. Rank `victim` kills itself with
// SIGKILL after `kill_after` items, once the consumer has had its first
// (so that every segment is mapped everywhere: a memfd is opened through
// a process that holds it, which must then be alive).
//
// A stage that sees peer_lost while putting takes back its values stuck
// in that queue: nobody is left to receive them, and the producer, whose
// memory they are, would otherwise wait 30 s for them at its end.
stage_outcome pipeline_stage(int rank, queue<tensor> first, queue<tensor> second, event first_arrived,
                             int victim, int kill_after, int items) {
  int done = 0;
  bool in_order = true;
  auto die_if_victim = [&] {
    if (rank == victim && done == kill_after) {
      first_arrived.wait_for(10s);
      ::raise(SIGKILL);
    }
  };
  std::optional<peer_lost> lost;
  queue<tensor>* stuck = nullptr;
  try {
    if (rank == 0) {
      stuck = &first;
      while (done < items) {
        first.put(tensor::full({8}, done, dtype::int64));
        ++done;
        die_if_victim();
      }
    } else if (rank == 1) {
      for (;;) {
        tensor t = first.get().value();
        in_order = in_order && t.at<std::int64_t>({0}) == done && t.at<std::int64_t>({7}) == done;
        t.fill_(static_cast<double>(done + 1000));
        stuck = &second;
        second.put(t);
        stuck = nullptr;
        ++done;
        die_if_victim();
      }
    } else {
      for (;;) {
        const tensor t = second.get().value();
        in_order = in_order && t.at<std::int64_t>({0}) == done + 1000 && t.at<std::int64_t>({7}) == done + 1000;
        if (done == 0) first_arrived.set();
        ++done;
        die_if_victim();
      }
    }
  } catch (const peer_lost& e) {
    lost = e;
  }
  if (!lost) return {done, 0, -1, in_order};
  if (stuck != nullptr) {
    while (stuck->try_pop()) {
    }
  }
  return {done, lost->pid(), lost->rank(), in_order};
}
COHORT_ENTRYPOINT(pipeline_stage);

void put_one_and_leave(int, queue<int> q) { q.put(7); }
COHORT_ENTRYPOINT(put_one_and_leave);

void get_one_and_leave(int, queue<int> q) { (void)q.get(); }
COHORT_ENTRYPOINT(get_one_and_leave);

// Pushes n tensors of its own (i at every element, in a segment each when
// `large`), then returns one more (7 + rank); nobody pops while it runs.
tensor push_then_return(int rank, queue<tensor> q, int n, bool large) {
  for (int i = 0; i < n; ++i) q.put(tensor::full({large ? 100000 : 64}, i, dtype::float32, {.shared = true}));
  return tensor::full({1000}, 7 + rank, dtype::float32, {.shared = true});
}
COHORT_ENTRYPOINT(push_then_return);

// Pushes one shared tensor (rank + 1 at every element), then ends by
// exit(0) (how 0) or by an exception (how 1) instead of returning.
void push_then_leave(int rank, queue<tensor> q, int how) {
  q.put(tensor::full({64}, rank + 1, dtype::float32, {.shared = true}));
  if (how == 0) std::exit(0);
  throw std::runtime_error("after the push");
}
COHORT_ENTRYPOINT(push_then_leave);

// Rank 0 pushes 0..n-1 and returns; rank 1 waits until rank 0 has ended,
// then pops the n values and returns their sum (first elements).
int push_or_pop_after_end(int rank, queue<tensor> q, queue<int> pids, int n) {
  if (rank == 0) {
    for (int i = 0; i < n; ++i) q.put(tensor::full({64}, i, dtype::int32, {.shared = true}));
    pids.put(static_cast<int>(::getpid()));
    return 0;
  }
  const auto pid = pids.get(10s);
  if (!pid) return -1;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, *pid, 0));
  if (pidfd < 0 && errno != ESRCH) return -2;  // ESRCH: ended and reaped already
  if (pidfd >= 0) {
    pollfd ended{pidfd, POLLIN, 0};
    const int ready = ::poll(&ended, 1, 10000);
    ::close(pidfd);
    if (ready != 1) return -3;
  }
  int sum = 0;
  for (int i = 0; i < n; ++i) sum += q.get(10s).value().at<std::int32_t>({0});
  return sum;
}
COHORT_ENTRYPOINT(push_or_pop_after_end);

// Under `strategy`, pushes a shared tensor (42 at every element) and
// returns another (43): a rank of a rank.
tensor push_and_return_as_grandchild(int, queue<tensor> q, int strategy) {
  set_sharing_strategy(static_cast<sharing_strategy>(strategy));
  q.put(tensor::full({64}, 42, dtype::float32, {.shared = true}));
  return tensor::full({64}, 43, dtype::float32, {.shared = true});
}
COHORT_ENTRYPOINT(push_and_return_as_grandchild);

// Starts push_and_return_as_grandchild by `method` and returns what it
// returned when `give_back`, else an empty tensor; `q` is held here only
// as the argument, dropped as it returns.
tensor start_grandchild(int, queue<tensor> q, int strategy, int method, bool give_back) {
  set_sharing_strategy(static_cast<sharing_strategy>(strategy));
  auto returned = spawn_and_join(push_and_return_as_grandchild, std::tuple{q, strategy}, 1,
                                 test::join_by(static_cast<start_method>(method)));
  return give_back ? returned.at(0) : tensor();
}
COHORT_ENTRYPOINT(start_grandchild);

// The first element of the tensor popped within 5 s; -1 when none came.
float pop_first_element(int, queue<tensor> q) {
  const auto t = q.get(5s);
  return t ? t->at<float>({0}) : -1.0f;
}
COHORT_ENTRYPOINT(pop_first_element);

// What push_through_forked_child leaves to the child it forks: the child
// sends a tensor of its parent's, and the parent writes no handle of it.
// Optional: a queue made at every start of this program would hold shared
// memory in each process that runs it.
std::optional<queue<tensor>> left_to_child;
tensor made_before_the_fork;

void push_made_before_the_fork(int) { left_to_child->put(made_before_the_fork); }
COHORT_ENTRYPOINT(push_made_before_the_fork);

// Makes a tensor, forks a rank of its own that pushes it, and returns once
// that rank has ended: it sends nothing itself.
void push_through_forked_child(int, queue<tensor> q) {
  left_to_child.emplace(q);
  made_before_the_fork = tensor::full({64}, 5, dtype::int32, {.shared = true});
  join_options options;
  options.method = start_method::fork;
  (void)spawn_and_join(push_made_before_the_fork, std::tuple{}, 1, options);
}
COHORT_ENTRYPOINT(push_through_forked_child);

// Pushes `n` tensors of a segment each (i at every element), under its
// full descriptor limit: its keeper's may be lower.
void push_large(int, queue<tensor> q, int n) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  for (int i = 0; i < n; ++i) q.put(tensor::full({100000}, i, dtype::float32, {.shared = true}));
}
COHORT_ENTRYPOINT(push_large);

// Pushes a shared tensor (rank + 1 at every element), then opens
// descriptors until none is left under a limit of 64, and returns.
void push_then_use_up_descriptors(int rank, queue<tensor> q) {
  q.put(tensor::full({64}, rank + 1, dtype::float32, {.shared = true}));
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = 64;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  while (::open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) {
  }
}
COHORT_ENTRYPOINT(push_then_use_up_descriptors);

// Lowers this process's descriptor limit to leave `room` descriptors free:
// as many numbers below it as no descriptor has.
void leave_descriptors_free(int room) {
  const auto open = open_descriptors();
  int below = 0;  // the limit
  for (int taken = 0; below - taken < room || open.contains(below); ++below) taken += open.contains(below) ? 1 : 0;
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = static_cast<rlim_t>(below);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &limit) == 0);
}

// A queue a rank keeps past its end, as a worker that caches what it was
// handed in a global would: a fork rank's end runs no destructor.
std::optional<queue<tensor>> kept_past_end;

void keep_queue(int, queue<tensor> q) { kept_past_end.emplace(q); }
COHORT_ENTRYPOINT(keep_queue);

// Keeps a queue popped from `handed`, of which it is then the only holder.
void keep_popped_queue(int rank, queue<queue<tensor>> handed) { keep_queue(rank, handed.get(10s).value()); }
COHORT_ENTRYPOINT(keep_popped_queue);

// Sends a queue of its own, and stays until told to end.
void send_own_queue(int, queue<queue<int>> out, event done) {
  const queue<int> made(4);
  if (!out.put(made, 10s)) throw std::runtime_error("the queue was not taken within 10 s");
  if (!done.wait_for(10s)) throw std::runtime_error("not told to end within 10 s");
}
COHORT_ENTRYPOINT(send_own_queue);

// Pops one value once told to.
void pop_one_when_told(int, queue<tensor> q, event go) {
  if (!go.wait_for(10s)) throw std::runtime_error("not told within 10 s");
  (void)q.get(10s).value();
}
COHORT_ENTRYPOINT(pop_one_when_told);

// Pushes tensors of its own under file_system that nobody will receive;
// returns its pid.
int push_unreceived(int, queue<tensor> q, int n) {
  set_sharing_strategy(sharing_strategy::file_system);
  for (int i = 0; i < n; ++i) q.put(tensor::full({256}, i, dtype::float32, {.shared = true}));
  return static_cast<int>(::getpid());
}
COHORT_ENTRYPOINT(push_unreceived);

// The nonces of the files leave_stamped_files makes.
constexpr std::uint64_t foreign_nonce = 0x0123456789abcdefULL, own_nonce = foreign_nonce + 1,
                        fifo_nonce = foreign_nonce + 2;

// Leaves three files under names of segments this rank made: one stamped
// as another pid namespace's segment (`other`, where a process has this
// rank's pid), one stamped as its own, and a FIFO. Returns its pid.
int leave_stamped_files(int, std::uint64_t other) {
  const pid_t self = ::getpid();
  for (const auto& [nonce, pid_namespace] : {std::pair{foreign_nonce, other}, {own_nonce, os::pid_namespace()}}) {
    const auto name = shm::segment_name(self, nonce);
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("shm_open " + name);
    const shm::segment_stamp stamp{shm::segment_magic, nonce, shm::header_size, pid_namespace, 1, {}};
    const bool written =
        ::ftruncate(fd, shm::header_size) == 0 && ::pwrite(fd, &stamp, sizeof stamp, 0) == sizeof stamp;
    ::close(fd);
    if (!written) throw std::runtime_error("writing " + name);
  }
  const auto fifo = "/dev/shm" + shm::segment_name(self, fifo_nonce);
  if (::mkfifo(fifo.c_str(), 0600) != 0) throw std::runtime_error("mkfifo " + fifo);
  return static_cast<int>(self);
}
COHORT_ENTRYPOINT(leave_stamped_files);

void pop_one_then_die(int, queue<tensor> q) {
  (void)q.get();
  ::raise(SIGKILL);
}
COHORT_ENTRYPOINT(pop_one_then_die);

using dying_value = std::tuple<tensor, std::vector<std::uint8_t>, dies_in_decode, tensor>;

void pop_and_die_decoding(int, queue<dying_value> q) { (void)q.get(); }
COHORT_ENTRYPOINT(pop_and_die_decoding);

using nested_value = std::tuple<tensor, pops_in_decode, tensor, refused_in_decode>;

// Pops a nested_value, whose decode pops from `inner` and then fails: the
// exception ends the rank at once, with what it had decoded let go of.
void pop_nested_then_fail(int, queue<nested_value> q, queue<int> inner) {
  pops_in_decode::from = inner;
  (void)q.get();
}
COHORT_ENTRYPOINT(pop_nested_then_fail);

void pop_killed_in_its_take(int, queue<tensor> q) {
  die_at_next_cpu_query = true;
  (void)q.try_pop();
}
COHORT_ENTRYPOINT(pop_killed_in_its_take);

// After a double release of its block, the next allocations of its size
// would take it: checks that 64 of them do not, and that `held` (made of
// sevens) still holds what it held.
void check_block_kept(const tensor& held) {
  std::vector<tensor> later;
  for (int i = 0; i < 64; ++i) later.push_back(tensor::full({5}, 9, dtype::int64, {.shared = true}));
  CHECK(held == tensor::full({5}, 7, dtype::int64));
  for (const auto& t : later) CHECK(t.raw_data() != held.raw_data());
}

// The files of named segments `maker` made that are still in /dev/shm.
std::vector<std::string> files_of(pid_t maker) {
  const auto prefix = fmt::format("cohort_{}_", maker);
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    if (e.path().filename().string().starts_with(prefix)) found.push_back(e.path().filename().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Waits up to 120 s for `child`, a plain fork of this process that ends by
// exit(), and checks that it exited with 0. Its exit() runs the destructors
// of whatever this program holds: a thread pool that an earlier test
// started (asio's system executor's) hangs there, its threads not forked,
// so the wait has a bound; a child still running then is killed.
void check_exits_with_zero(pid_t child) {
  int status = 0;
  const bool ended = test::within(120s, [&] { return ::waitpid(child, &status, WNOHANG) == child; }, 5ms);
  if (!ended) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  REQUIRE_MESSAGE(ended, "the forked process did not end within 120 s");
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// How many memfd segments this process holds open.
int cohort_memfds() {
  int n = 0;
  for (const auto& [fd, target] : open_descriptors()) n += target.starts_with("/memfd:cohort") ? 1 : 0;
  return n;
}

// A tensor of 512 KiB: a segment of its own, not an arena block.
tensor large_shared(int value) { return tensor::full({1 << 17}, value, dtype::float32, {.shared = true}); }

// Pops a tensor that both values in `q` name (a segment of its own), drops
// it while the second is still in the queue, and returns how many more
// memfd segments it then holds open than before the pop; takes the second
// after.
int memfds_after_a_drop(int, queue<tensor> q) {
  const int before = cohort_memfds();
  (void)q.get().value();
  const int held = cohort_memfds() - before;
  (void)q.get().value();
  return held;
}
COHORT_ENTRYPOINT(memfds_after_a_drop);

// Sends a tensor of a segment of its own and drops its copy; once `go`
// says the receiver has dropped its own, idles a moment and returns how
// many more memfd segments it holds open than before the send. With
// `trimming`, it trims its shared memory over and over until `go` comes.
int memfds_after_the_receiver_dropped(int, queue<tensor> out, queue<int> go, bool trimming) {
  const int before = cohort_memfds();
  {
    const tensor t = large_shared(3);
    out.put(t);
  }
  if (trimming) {
    while (!go.try_pop()) (void)trim_shared_memory();
  } else {
    (void)go.get().value();
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return cohort_memfds() - before;
}
COHORT_ENTRYPOINT(memfds_after_the_receiver_dropped);

// How many mappings of cohort segments this process has, of either
// strategy's (memfds, files in /dev/shm).
int cohort_mappings() { return test::mappings_naming("/memfd:cohort") + test::mappings_naming("/dev/shm/cohort"); }

// Pops a tensor whose sender has let go of it and drops it (its segment
// then dead), pops a second, and waits on an empty queue, blocking until a
// thread of its own puts a value there 20 ms later, or `awaited` (a pop
// raced against a timer); returns how many more segment mappings it then
// has than before the first pop (1: the second's alone).
int mappings_after_a_wait(int, queue<tensor> q, queue<tensor> empty, bool awaited) {
  const int before = cohort_mappings();
  (void)q.get().value();
  const tensor second = q.get().value();
  if (awaited) {
    using namespace asio::experimental::awaitable_operators;
    asio::io_context io;
    auto race = [&]() -> asio::awaitable<void> {
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(20));
      (void)co_await (empty.pop() || t.async_wait(asio::use_awaitable));
    };
    test::run(io, race());
  } else {
    std::thread later([&empty] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      empty.put(tensor());
    });
    (void)empty.get();  // untimed: a timed wait leaves the dead segment to the next receive
    later.join();
  }
  return cohort_mappings() - before;
}
COHORT_ENTRYPOINT(mappings_after_a_wait);

void hold_and_die(int, queue<storage>) { ::raise(SIGKILL); }
COHORT_ENTRYPOINT(hold_and_die);

void hold_a_while(int, queue<storage>) { ::usleep(300000); }
COHORT_ENTRYPOINT(hold_a_while);

// Makes a queue, lets `hold` have processes hold it, puts a storage of
// 1 MiB into it and drops it (this process's last hold); returns how many
// then hold the storage: 1 when the queue dropped the value left in it.
template <class Hold>
std::uint32_t holders_after_dropping(Hold hold) {
  std::optional<storage> s;
  {
    queue<storage> q(8);
    hold(q);
    s = storage::allocate_shared(1 << 20);
    REQUIRE(q.put(*s, 1s));
  }
  return detail::shared_holders(*s);
}

// Pops a tensor whose sender has let go of it (its segment then dead once
// dropped here) and drops it; returns how many more segment mappings it
// then has than before the pop.
int mappings_after_a_drop(int, queue<tensor> q) {
  const int before = cohort_mappings();
  (void)q.get().value();
  return cohort_mappings() - before;
}
COHORT_ENTRYPOINT(mappings_after_a_drop);

// Under `strategy`, says its pid, pushes a tensor of its own (large: a segment of its own)
// and one from its arena, and is killed before anyone pops them.
void push_then_die(int, queue<int> pid, queue<tensor> q, int strategy) {
  set_sharing_strategy(static_cast<sharing_strategy>(strategy));
  pid.put(::getpid());
  q.put(large_shared(7));
  q.put(tensor::full({4}, 8, dtype::int32, {.shared = true}));
  ::raise(SIGKILL);
}
COHORT_ENTRYPOINT(push_then_die);

// Says its pid, then sends `n` tensors of its own, each in a segment of
// its own, and waits to be killed.
void make_and_wait(int, queue<int> pid, queue<tensor> out, int n) {
  pid.put(::getpid());
  // 1 MiB private: each moves into a segment of its own as it is pushed.
  for (int i = 0; i < n; ++i) out.put(tensor::full({1 << 18}, i, dtype::float32));
  ::pause();
}
COHORT_ENTRYPOINT(make_and_wait);

// Passes `n` tensors on from `in` to `out`, keeping none, and lets go of
// what it keeps for reuse (trim); then waits for `done`.
void relay_and_wait(int, queue<tensor> in, queue<tensor> out, int n, event relayed, event done) {
  for (int i = 0; i < n; ++i) out.put(in.get().value());
  trim_shared_memory();
  relayed.set();
  done.wait_for(30s);
}
COHORT_ENTRYPOINT(relay_and_wait);

// A shared tensor of its own, returned.
tensor make_shared_row(int rank) { return tensor::full({16}, rank + 3, dtype::float32, {.shared = true}); }
COHORT_ENTRYPOINT(make_shared_row);

// Pops from `q` a value whose memory went with its sender, rank 0 of a
// group: the pop must end with peer_lost naming it.
template <class T>
void check_sender_lost(queue<T>& q, pid_t sender) {
  try {
    (void)q.get(1s);
    FAIL("a value whose memory went with its sender was received");
  } catch (const peer_lost& e) {
    CHECK(e.pid() == sender);
    CHECK(e.rank() == 0);
    CHECK(std::string(e.what()).find(fmt::format("pid {}, rank 0", sender)) != std::string::npos);
  }
}

// Under `strategy`, says its pid, pushes a string too large for the ring
// (it travels in a shared block of its own) and is killed before anyone
// pops it.
void push_large_then_die(int, queue<int> pid, queue<std::string> q, int strategy) {
  set_sharing_strategy(static_cast<sharing_strategy>(strategy));
  pid.put(::getpid());
  q.put(std::string(std::size_t{1} << 20, 'x'));
  ::raise(SIGKILL);
}
COHORT_ENTRYPOINT(push_large_then_die);

// Under `strategy`, says its pid, pushes a tensor of its own followed by
// `kept` (made by the parent) and is killed before anyone pops them.
void push_own_and_kept_then_die(int, queue<int> pid, queue<std::tuple<tensor, tensor>> q, tensor kept, int strategy) {
  set_sharing_strategy(static_cast<sharing_strategy>(strategy));
  pid.put(::getpid());
  const std::tuple<tensor, tensor> both{tensor::full({4}, 8, dtype::int32, {.shared = true}), kept};
  q.put(both);
  ::raise(SIGKILL);
}
COHORT_ENTRYPOINT(push_own_and_kept_then_die);

// Frees its arena's first block 1000 times; returns what trim_shared_memory()
// then says it let go of, the descriptors it kept, and what a second trim
// lets go of.
std::vector<int> free_first_block_then_trim(int) {
  const strategy_scope scope(sharing_strategy::file_descriptor);
  const auto before = open_descriptors().size();
  for (int i = 0; i < 1000; ++i) {
    const storage s = storage::allocate_shared(3);
  }
  const int first = trim_shared_memory();
  const auto kept = static_cast<int>(open_descriptors().size() - before);
  return {first, kept, trim_shared_memory()};
}
COHORT_ENTRYPOINT(free_first_block_then_trim);

// How a pipeline run ended, as the process that ran it saw it: per rank,
// its pid, its shell exit code (128 + the signal that killed it) and what it
// returned ({-1, 0, -1, false} for nothing); the ranks that failed.
using pipeline_report =
    std::tuple<std::vector<int>, std::vector<int>, std::vector<stage_outcome>, std::vector<int>>;

// Runs the pipeline's three stages as a group of forked ranks, with a
// grace long enough that the survivors of the kill end on their own.
pipeline_report run_pipeline(int victim, int kill_after) {
  constexpr int items = 64;
  queue<tensor> first(4), second(4);
  event first_arrived;
  const group_spec spec{
      .name = "pipeline",
      .entry = call(start_method::fork, pipeline_stage, first, second, first_arrived, victim, kill_after, items),
      .nprocs = 3,
      .shutdown = {.grace = 20s, .term_grace = 1s, .kill_wait = 5s}};
  asio::io_context io;
  std::vector<pid_t> pids;
  const run_result result = test::run(io, [&]() -> asio::awaitable<run_result> {
    group g = co_await start_processes(spec);
    pids = g.pids();
    co_return co_await g.wait();
  }());
  pipeline_report report;
  auto& [ranks, codes, outcomes, failed] = report;
  for (std::size_t r = 0; r < pids.size(); ++r) {
    ranks.push_back(pids[r]);
    codes.push_back(result.statuses.at(r) ? result.statuses[r]->shell_code() : -1);
    outcomes.push_back(result.return_values.at(r) ? result.return_values[r]->as<stage_outcome>()
                                                  : stage_outcome{-1, 0, -1, false});
  }
  for (const auto& f : result.failures) failed.push_back(f.rank);
  return report;
}

// run_pipeline in a rank of its own, which then owns the queues and the event.
pipeline_report run_pipeline_in_rank(int, int victim, int kill_after) { return run_pipeline(victim, kill_after); }
COHORT_ENTRYPOINT(run_pipeline_in_rank);

// Ten runs of the pipeline under each strategy, every stage the victim in
// turn, each killed after a random number of items; run by this process or
// by a rank of its own.
void pipeline_repetitions(bool in_own_rank) {
  const auto seed = std::random_device{}();
  CAPTURE(seed);
  std::mt19937 random(seed);
  const int first_victim = std::uniform_int_distribution(0, 2)(random);
  repeat_under_each_strategy(10, [&](leak_check& check, int i) {
    const int victim = (first_victim + i) % 3;
    const int kill_after = std::uniform_int_distribution(1, 32)(random);
    CAPTURE(victim);
    CAPTURE(kill_after);
    const auto [pids, codes, outcomes, failed] =
        in_own_rank
            ? spawn_and_join(run_pipeline_in_rank, std::tuple{victim, kill_after}, 1, test::join_by(start_method::fork))
                  .at(0)
            : run_pipeline(victim, kill_after);
    check.children.assign(pids.begin(), pids.end());
    REQUIRE(pids.size() == 3);
    CHECK(codes[victim] == 128 + SIGKILL);
    REQUIRE(failed.size() == 1);
    CHECK(failed[0] == victim);
    for (int r = 0; r < 3; ++r) {
      if (r == victim) continue;
      CAPTURE(r);
      CHECK(codes[r] == 0);
      CHECK(std::get<3>(outcomes[r]));  // every item in order, with the values written before
    }
    // Items each survivor passed on, and whom the peer_lost ending its wait
    // named: the stage before it or after it.
    auto items = [&](int r) { return std::get<0>(outcomes[r]); };
    auto lost = [&](int r) { return std::pair{std::get<1>(outcomes[r]), std::get<2>(outcomes[r])}; };
    auto stage = [&](int r) { return std::pair{pids[r], r}; };
    if (victim == 0) {  // the producer: the relay's get, then the consumer's
      CHECK(lost(1) == stage(0));
      CHECK(lost(2) == stage(1));
      CHECK(items(1) == kill_after);
      CHECK(items(2) == kill_after);
    } else if (victim == 1) {  // the relay: the consumer's get, the producer's put into a full queue
      CHECK(lost(2) == stage(1));
      CHECK(lost(0) == stage(1));
      CHECK(items(2) == kill_after);
      CHECK(items(0) == kill_after + 4);  // and the first queue full
    } else {  // the consumer: the relay's put, then the producer's
      CHECK(lost(1) == stage(2));
      CHECK(lost(0) == stage(1));
      CHECK(items(1) == kill_after + 4);  // and the second queue full
      CHECK(items(0) == kill_after + 9);  // and the first full behind one in the relay's hands
    }
  });
}


// How a process a rank forks (no rank: the group knows it only as a
// descendant) leaves the named segment it made.
enum class left_by : int {
  killed = 0,     // it lingers, holding it, until the group's end kills it
  exit = 1,       // it calls exit() while a storage it leaked holds it
  in_flight = 2,  // it puts a storage of it into a queue and exits
};

// Forks such a process, which makes a shared storage of 64 bytes, each 5,
// under file_system; returns its pid once it has (and, unless it lingers,
// once it has ended).
int fork_a_segment_maker(int, queue<storage> q, int how) {
  set_sharing_strategy(sharing_strategy::file_system);
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    auto* leaked = new storage(storage::allocate_shared(64));
    std::memset(leaked->data(), 5, 64);
    if (how == static_cast<int>(left_by::in_flight)) q.put(*leaked);
    (void)!::write(ready[1], "x", 1);
    if (how == static_cast<int>(left_by::killed)) {
      for (;;) ::pause();
    }
    std::exit(0);
  }
  char byte = 0;
  (void)!::read(ready[0], &byte, 1);
  if (how != static_cast<int>(left_by::killed)) ::waitpid(pid, nullptr, 0);
  return pid;
}
COHORT_ENTRYPOINT(fork_a_segment_maker);

TEST_SUITE("sharing") {
  TEST_CASE("a child fills tensors the parent shares and the parent sees the values") {
    repeat_under_each_strategy(repetitions, [](leak_check&, int i) {
      const auto method = methods[i % 3];
      CAPTURE(to_string(method));
      tensor given = tensor::zeros({5, 5}, dtype::float32);  // moved into shared memory when passed
      const tensor sent = tensor::zeros({5, 5}, dtype::float32, {.shared = true});
      queue<tensor> q(2);
      event filled, looked;
      REQUIRE(q.put(sent, 1s));
      auto ranks = std::async(std::launch::async, [&] {
        spawn_and_join(fill_rows, std::tuple{given, q, filled, looked}, 1, test::join_by(method));
      });
      // Looked at while the child is still there, as torch does.
      const bool was_filled = filled.wait_for(10s);
      CHECK(was_filled);
      CHECK(given.is_shared());
      CHECK(given.select(0, 0) == tensor::full({5}, 4, dtype::float32));
      CHECK(given.slice(0, 1, 5) == tensor::zeros({4, 5}, dtype::float32));
      CHECK(sent.select(0, 1) == tensor::full({5}, 7, dtype::float32));
      CHECK(sent.select(0, 0) == tensor::zeros({5}, dtype::float32));
      CHECK(sent.slice(0, 2, 5) == tensor::zeros({3, 5}, dtype::float32));
      looked.set();
      ranks.get();
    });
  }

  TEST_CASE("tensors a child sends arrive with its values, and one tensor sent twice is one storage") {
    const dtype types[] = {dtype::float32, dtype::float64, dtype::int64, dtype::int32,
                           dtype::uint8,   dtype::float16, dtype::bfloat16, dtype::boolean};
    repeat_under_each_strategy(repetitions, [&](leak_check&, int i) {
      const auto method = methods[i % 3];
      const auto type = types[i % std::size(types)];
      CAPTURE(to_string(method));
      CAPTURE(to_string(type));
      queue<tensor> q(4);
      event received;
      auto ranks = std::async(std::launch::async, [&] {
        spawn_and_join(send_twice, std::tuple{q, received, static_cast<int>(type)}, 1, test::join_by(method));
      });
      {
        auto t1 = q.get(10s);
        auto t2 = q.get(10s);
        REQUIRE(t1);
        REQUIRE(t2);
        CHECK(*t1 == tensor::full({5, 5}, 1, type));
        CHECK(t1->is_shared());
        CHECK(same_storage(*t1, *t2));
        CHECK(t1->raw_data() == t2->raw_data());
      }
      // torch lets go of them first, so that the child can free them.
      received.set();
      ranks.get();
    });
  }

  TEST_CASE("a storage, a tensor over it and views of it arrive as views of one storage") {
    repeat_under_each_strategy(repetitions, [](leak_check&, int) {
      tensor x = counting_5x5();
      queue<views> q(2);
      REQUIRE(q.put({x.storage(), x, x.select(0, 2), x.select(1, 1), x.transpose(0, 1)}, 1s));
      const auto seen = spawn_and_join(inspect_views, std::tuple{q}, 1, test::join_by(start_method::fork)).at(0);
      INFO("seen: ", fmt::format("{}", fmt::join(seen, ", ")));
      // One storage; row 2 at offset 10, stride 1; column 1 at offset 1,
      // stride 5; the transpose's strides 1, 5; then 100 where row 2 meets
      // column 1, and column 1's row 3 untouched.
      CHECK(seen == std::vector<std::int64_t>{1, 10, 1, 1, 5, 1, 5, 100, 100, 100, 16});
      CHECK(x.select(0, 2) == tensor::full({5}, 100, dtype::float32));
      for (int r : {0, 1, 3, 4}) {
        for (int c = 0; c < 5; ++c) CHECK(x.at<float>({r, c}) == static_cast<float>(5 * r + c));
      }
      // torch's own form: through a queue in one process, a vector of them.
      queue<std::vector<tensor>> local(2);
      REQUIRE(local.put({x, x.select(0, 2), x.select(1, 1)}, 1s));
      const auto back = local.get(1s).value();
      REQUIRE(back.size() == 3);
      for (const auto& t : back) CHECK(same_storage(t, x));
      CHECK(back[0].raw_data() == x.raw_data());
      CHECK(back[1].storage_offset() == 10);
      CHECK(back[2].strides()[0] == 5);
    });
  }

  TEST_CASE("a pool's workers fill the tensors mapped over and return tensors of their own") {
    repeat_under_each_strategy(repetitions, [](leak_check&, int) {
      std::vector<tensor> buffers;
      for (int i = 0; i < 4; ++i) buffers.push_back(tensor::zeros({2, 2}, dtype::float32));
      const pool_options forked{.method = start_method::fork};
      pool p(2, forked);
      const auto results = p.map(pool_fill, buffers);
      REQUIRE(results.size() == buffers.size());
      for (const auto& r : results) CHECK(r == tensor::full({2, 2}, 5, dtype::float32));
      for (const auto& b : buffers) {
        CHECK(b.is_shared());
        CHECK(b == tensor::full({2, 2}, 4, dtype::float32));
      }
    });
  }

  TEST_CASE("a private tensor lent through DLPack is not sent until the borrower lets go, and a shared one is") {
    queue<tensor> q(4);
    tensor t = counting_5x5();
    DLManagedTensor* lent = t.to_dlpack();
    const void* where = lent->dl_tensor.data;
    CHECK_THROWS_WITH_AS(q.put(t), doctest::Contains("lent through DLPack"), std::logic_error);
    CHECK_THROWS_AS(t.share_memory(), std::logic_error);
    CHECK_FALSE(t.is_shared());
    CHECK(t.raw_data() == where);  // the borrower's bytes did not move
    CHECK(t.storage().use_count() == 2);  // the tensor's and the borrower's; the refused push kept none
    CHECK(q.size() == 0);
    lent->deleter(lent);
    q.put(t);
    CHECK(t.is_shared());
    CHECK(q.get().value() == counting_5x5());
    // Bytes already shared stay where they are: lending them stops nothing.
    DLManagedTensor* shared = t.to_dlpack();
    q.put(t);
    CHECK(shared->dl_tensor.data == t.raw_data());
    CHECK(q.get().value().raw_data() == t.raw_data());
    shared->deleter(shared);
  }

  TEST_CASE("a push that fails holds nothing of its value: full, timed out, or closed") {
    repeat_under_each_strategy(1, [](leak_check&, int) {
      queue<tensor> q(1);
      q.put(tensor::zeros({1}, dtype::int8));
      const tensor big = tensor::zeros({1 << 16}, dtype::float32, {.shared = true});
      CHECK_FALSE(q.try_push(big));
      CHECK(big.storage().use_count() == 1);
      CHECK_FALSE(q.put(big, 1ms));
      CHECK(big.storage().use_count() == 1);
      q.close();
      CHECK_THROWS_AS(q.put(big), queue_closed);
      CHECK(big.storage().use_count() == 1);
    });
  }

  TEST_CASE("share_memory moves a private tensor into shared memory in place, under its views") {
    repeat_under_each_strategy(repetitions, [](leak_check&, int) {
      tensor t = counting_5x5();
      const tensor row = t.select(0, 1);
      const tensor copy = t;
      CHECK_FALSE(t.is_shared());
      CHECK_FALSE(row.is_shared());
      t.share_memory();
      CHECK(t.is_shared());
      CHECK(row.is_shared());
      CHECK(copy.is_shared());
      CHECK(row.raw_data() == t.raw_data() + 5 * sizeof(float));
      CHECK(t == counting_5x5());
      t.at<float>({1, 3}) = -2;
      CHECK(row.at<float>({3}) == -2);
      CHECK(copy.at<float>({1, 3}) == -2);
      const auto* where = t.raw_data();
      t.share_memory();  // already shared: nothing moves
      CHECK(t.raw_data() == where);
      CHECK(own_named_segments().empty() == (get_sharing_strategy() == sharing_strategy::file_descriptor));
      CHECK(tensor::zeros({3}, dtype::int8, {.shared = true}).is_shared());
      CHECK_FALSE(t.clone().is_shared());
    });
  }

  TEST_CASE("forked ranks see and write a shared tensor made before the fork") {
    repeat_under_each_strategy(repetitions, [](leak_check&, int) {
      inherited = tensor::zeros({5, 5}, dtype::float32, {.shared = true});
      inherited.at<float>({4, 4}) = 2;
      const auto found = spawn_and_join(add_to_inherited_row, std::tuple{}, 2, test::join_by(start_method::fork));
      REQUIRE(found.size() == 2);
      CHECK(found[0] == 2);
      CHECK(found[1] == 2);
      CHECK(inherited.select(0, 0) == tensor::full({5}, 3, dtype::float32));
      CHECK(inherited.select(0, 1) == tensor::full({5}, 4, dtype::float32));
      CHECK(inherited.slice(0, 2, 4) == tensor::zeros({2, 5}, dtype::float32));
      CHECK(inherited.at<float>({4, 4}) == 2);
      inherited = tensor();
    });
  }

  TEST_CASE("empty tensors cross a queue both ways and arrive empty with their shape and dtype") {
    repeat_under_each_strategy(repetitions, [](leak_check&, int) {
      const tensor x = tensor::zeros({4, 5}, dtype::int16, {.shared = true});
      // The last is an empty view inside a shared storage: rows 1..3, no columns.
      const std::vector<tensor> sent{tensor::empty({0}, dtype::float32), tensor::zeros({2, 0}, dtype::int16),
                                     tensor(), x.slice(0, 1, 4).slice(1, 2, 2)};
      REQUIRE(sent[3].storage_offset() == 5);
      queue<tensor> in(8), out(8);
      for (const auto& t : sent) REQUIRE(in.put(t, 1s));
      event received;
      auto ranks = std::async(std::launch::async, [&] {
        spawn_and_join(echo_with_empties, std::tuple{in, out, static_cast<int>(sent.size()), received}, 1,
                       test::join_by(start_method::fork));
      });
      std::vector<tensor> back;
      for (std::size_t i = 0; i < sent.size() + 2; ++i) {
        auto t = out.get(10s);
        REQUIRE(t);
        back.push_back(std::move(*t));
      }
      received.set();
      ranks.get();
      const std::vector<std::vector<std::int64_t>> shapes{{0}, {2, 0}, {0}, {3, 0}, {0}, {2, 0}};
      const std::vector<dtype> types{dtype::float32, dtype::int16, dtype::float32, dtype::int16, dtype::int64,
                                     dtype::bfloat16};
      for (std::size_t i = 0; i < back.size(); ++i) {
        CAPTURE(i);
        CHECK(back[i].numel() == 0);
        CHECK(back[i].dtype() == types[i]);
        CHECK(std::vector(back[i].shape().begin(), back[i].shape().end()) == shapes[i]);
      }
      // The empty view of a shared tensor came back over its storage.
      CHECK(same_storage(back[3], x));
      CHECK(back[3].storage_offset() == 5);
    });
  }

  // g++ 12 cannot compile a std::initializer_list inside co_await: shapes
  // and indices in braces are int_lists, which a constructor builds.
  TEST_CASE("tensors made with braced shapes and read at braced indices inside co_await cross as made") {
    asio::io_context io;
    queue<tensor> q(8);
    queue<float> elements(2);
    const std::vector<float> values{0, 1, 2, 3, 4, 5};
    const tensor counting = tensor::from_data<float>(values, {6});
    test::run(io, [&]() -> asio::awaitable<void> {
      co_await q.push(tensor::zeros({2, 3}, dtype::float32));
      co_await q.push(tensor::full({4}, 1.5, dtype::float64));
      co_await q.push(tensor::from_data(std::span(values), {2, 3}));
      co_await q.push(counting.reshape({3, 2}));
      co_await q.push(tensor::full({}, 7, dtype::int64));
      // Seven sizes: more than an int_list holds without allocating.
      co_await q.push(tensor::empty({1, 2, 1, 2, 1, 2, 1}, dtype::uint8));
      co_await elements.push(counting.reshape({2, 3}).at<float>({1, -1}));
    }());
    const std::vector<std::vector<std::int64_t>> shapes{{2, 3}, {4}, {2, 3}, {3, 2}, {}, {1, 2, 1, 2, 1, 2, 1}};
    std::vector<tensor> back;
    while (auto t = q.try_pop()) back.push_back(std::move(*t));
    REQUIRE(back.size() == shapes.size());
    for (std::size_t i = 0; i < back.size(); ++i) {
      CAPTURE(i);
      CHECK(std::vector(back[i].shape().begin(), back[i].shape().end()) == shapes[i]);
    }
    CHECK(back[0] == tensor::zeros(shapes[0], dtype::float32));
    CHECK(back[1] == tensor::full(shapes[1], 1.5, dtype::float64));
    CHECK(back[2].at<float>({1, 0}) == 3);
    CHECK(back[3].at<float>({2, 1}) == 5);
    CHECK(back[4].item<std::int64_t>() == 7);
    CHECK(back[5].dtype() == dtype::uint8);
    CHECK(elements.try_pop() == 5.0f);
  }

  TEST_CASE("2000 tensors cross into a rank limited to 64 descriptors") {
    // Spawned: a forked rank would inherit the mapping instead of opening it.
    repeat_under_each_strategy(repetitions, [](leak_check&, int) {
      constexpr int n = 2000;
      queue<tensor> q(n);
      for (int i = 0; i < n; ++i) {
        REQUIRE(q.put(tensor::full({4}, i, dtype::int32, {.shared = i % 2 == 0}), 1s));
      }
      CHECK(spawn_and_join(sum_under_fd_limit, std::tuple{q, n}, 1).at(0) == std::int64_t{n} * (n - 1) / 2);
    });
  }

  // Before, a receiver kept a descriptor for every segment it had mapped
  // while that segment's maker held blocks of it: the 61st such tensor was
  // "opening segment /proc/<pid>/fd/<n>: Too many open files".
  TEST_CASE("a rank limited to 64 descriptors receives 100 tensors of segments of their own, kept or dropped") {
    for (const bool keep : {true, false}) {
      repeat_under_each_strategy(2, [keep](leak_check&, int) {
        CAPTURE(keep);
        constexpr int n = 100;
        queue<tensor> q(n);
        std::vector<tensor> sent;  // held here, so that the receiver's mappings stay of use
        for (int i = 0; i < n; ++i) {
          sent.push_back(tensor::full({(1 << 16) + 16}, i, dtype::float32, {.shared = true}));
          REQUIRE(q.put(sent.back(), 1s));
        }
        const auto& spawned = test::join_by(start_method::spawn);
        const auto seen = spawn_and_join(receive_own_segments_under_fd_limit, std::tuple{q, n, keep}, 1, spawned).at(0);
        REQUIRE(seen.size() == 2);
        CHECK(seen[0] == n);
        // What it may keep for good: the death notice's epoll descriptor and
        // a pidfd of this process, its producer.
        CHECK(seen[1] <= 2);
      });
    }
  }

  // Before, a receiver looked at the counts of values sent and received
  // over the segment each time it dropped one, and kept its descriptor
  // while any were in flight: in a pipeline, always, and the look pulled
  // the sender's count from its cache with every tensor.
  TEST_CASE("a rank that passes nothing on closes a sender's segment once it drops it, values of it in flight or not") {
    repeat_under_each_strategy(1, [](leak_check&, int) {
      queue<tensor> q(2);
      const tensor big = large_shared(3);
      REQUIRE(q.put(big, 1s));
      REQUIRE(q.put(big, 1s));
      join_options options;
      options.method = start_method::spawn;
      CHECK(spawn_and_join(memfds_after_a_drop, std::tuple{q}, 1, options).at(0) == 0);
    });
  }

  // A receive that finds a segment no process uses any more leaves it for
  // the next wait to unmap, as freeing its memory is slow (about 150 ms a
  // GiB): the wait must not leave it mapped.
  TEST_CASE("a segment found dead by a receive is unmapped by the receiver's next wait, blocking or awaited") {
    repeat_under_each_strategy(2, [](leak_check&, int i) {
      queue<tensor> q(2), empty(1);
      REQUIRE(q.put(large_shared(1), 1s));  // the sender's copy goes here: the receiver's is the last
      const tensor second = large_shared(2);
      REQUIRE(q.put(second, 1s));
      join_options options;
      options.method = start_method::spawn;
      const auto args = std::tuple{q, empty, i == 1};
      CHECK(spawn_and_join(mappings_after_a_wait, args, 1, options).at(0) == 1);
    });
  }

  // Before, the mapping stayed until the process's next receive or wait:
  // a process that received a batch of large tensors and then went quiet
  // kept all their memory after dropping them.
  TEST_CASE("a received segment no process uses any more is unmapped as its last storage is dropped") {
    repeat_under_each_strategy(2, [](leak_check&, int) {
      queue<tensor> q(1);
      REQUIRE(q.put(large_shared(1), 1s));  // the sender's copy goes here: the receiver's is the last
      join_options options;
      options.method = start_method::spawn;
      CHECK(spawn_and_join(mappings_after_a_drop, std::tuple{q}, 1, options).at(0) == 0);
    });
  }

  TEST_CASE("when one stage of a pipeline is SIGKILLed the others end their waits with peer_lost") {
    // The queues and the event belong to a rank that runs the pipeline:
    // what the victim held of them goes with that rank (see the next test).
    pipeline_repetitions(true);
  }

  // A rank killed outright never gives back its holds on this process's
  // segments (the queues, and under fork every shared storage this process
  // had): once every other process that mapped them has ended, trimming
  // lets them go anyway, and under file_system their files leave /dev/shm.
  TEST_CASE("a pipeline run by this process leaves nothing behind once a stage was SIGKILLed") {
    pipeline_repetitions(false);
  }

  TEST_CASE("a process that ends after a rank holding its queues was SIGKILLed leaves no file in /dev/shm") {
    // A process of no group (no sweep follows it): a plain fork of this one
    // runs the pipeline under file_system and exits without trimming.
    const pid_t supervisor = ::fork();
    REQUIRE(supervisor >= 0);
    if (supervisor == 0) {
      set_sharing_strategy(sharing_strategy::file_system);
      const auto codes = std::get<1>(run_pipeline(1, 3));
      std::exit(codes.size() == 3 && codes[1] == 128 + SIGKILL ? 0 : 1);
    }
    check_exits_with_zero(supervisor);
    const auto left = files_of(supervisor);
    CHECK_MESSAGE(left.empty(), fmt::format("left in /dev/shm: {}", fmt::join(left, ", ")));
  }

  // A race: before 351d22d, such a wait looked for the peers before trying
  // again, and ended with peer_lost in about a fifth of these tries.
  TEST_CASE("a wait woken by a departing peer's last value or room takes it rather than ending with peer_lost") {
    int lost_with_value = 0;
    int lost_with_room = 0;
    for (int i = 0; i < 100; ++i) {
      queue<int> q(1);
      auto ranks = std::async(std::launch::async, [&] {
        std::this_thread::sleep_for(5ms);  // for the get below to be asleep
        spawn_and_join(put_one_and_leave, std::tuple{q}, 1, test::join_by(start_method::fork));
      });
      try {
        const auto got = q.get(5s);
        CHECK(got == 7);
      } catch (const peer_lost&) {
        ++lost_with_value;
      }
      ranks.get();
    }
    for (int i = 0; i < 100; ++i) {
      queue<int> q(1);
      REQUIRE(q.put(1, 1s));
      auto ranks = std::async(std::launch::async, [&] {
        std::this_thread::sleep_for(5ms);  // for the put below to be asleep
        spawn_and_join(get_one_and_leave, std::tuple{q}, 1, test::join_by(start_method::fork));
      });
      try {
        const bool put = q.put(2, 5s);
        CHECK(put);
      } catch (const peer_lost&) {
        ++lost_with_room;
      }
      ranks.get();
    }
    CHECK(lost_with_value == 0);
    CHECK(lost_with_room == 0);
  }

  TEST_CASE("a queue dropped with a tensor never popped lets go of the tensor's file in /dev/shm") {
    const strategy_scope scope(sharing_strategy::file_system);
    trim_shared_memory();
    const auto before = files_of(::getpid());
    {
      queue<tensor> q(4);
      const tensor t = large_shared(1);
      REQUIRE(q.put(t, 1s));
    }
    trim_shared_memory();
    CHECK(files_of(::getpid()) == before);
  }

  // Before, such a try put the value in a block of shared memory of its
  // own first, and let go of it once refused: a file made and removed, and
  // the value copied, at every try.
  TEST_CASE("a try_push refused by a full queue puts a value too large for the ring nowhere; one taken goes out of line") {
    const strategy_scope scope(sharing_strategy::file_system);
    queue<std::string> q(1);
    REQUIRE(q.try_push("first"));
    const std::string big(4 << 20, 'x');
    const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    REQUIRE(watch >= 0);
    REQUIRE(::inotify_add_watch(watch, "/dev/shm", IN_CREATE) >= 0);
    // The files of this process's segments made since the last call.
    const auto made = [watch, prefix = fmt::format("cohort_{}_", ::getpid())] {
      int n = 0;
      alignas(inotify_event) char buffer[4096];
      for (ssize_t got; (got = ::read(watch, buffer, sizeof buffer)) > 0;) {
        for (ssize_t at = 0; at < got;) {
          const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
          if (event->len > 0 && std::string_view(event->name).starts_with(prefix)) ++n;
          at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        }
      }
      return n;
    };
    for (int i = 0; i < 3; ++i) CHECK_FALSE(q.try_push(big));
    CHECK(made() == 0);
    CHECK(q.try_pop() == "first");
    REQUIRE(q.try_push(big));
    CHECK(made() == 1);  // what the refused tries would have shown
    CHECK(q.try_pop() == big);
    ::close(watch);
  }

  // exit() destroys no local of main(): before, the queue held there kept
  // the values left in it, and their files kept their names for good.
  TEST_CASE("a process that calls exit() holding the only hold on a queue with values in it leaves no file in /dev/shm") {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      set_sharing_strategy(sharing_strategy::file_system);
      queue<tensor> q(8);
      const bool pushed = q.try_push(tensor::full({4}, 1, dtype::float32)) && q.try_push(large_shared(2));
      std::exit(pushed ? 0 : 1);
    }
    check_exits_with_zero(child);
    const auto left = files_of(child);
    for (const auto& name : left) fs::remove(fs::path("/dev/shm") / name);
    CHECK_MESSAGE(left.empty(), fmt::format("left in /dev/shm: {}", fmt::join(left, ", ")));
  }

  TEST_CASE("a queue dropped with a tensor never popped closes the tensor's memfd") {
    const strategy_scope scope(sharing_strategy::file_descriptor);
    trim_shared_memory();
    const int before = cohort_memfds();
    {
      const tensor t = large_shared(1);
      queue<tensor> q(4);
      REQUIRE(q.put(t, 1s));
    }
    trim_shared_memory();
    CHECK(cohort_memfds() == before);
  }

  TEST_CASE("a rank whose values nobody receives ends at once and leaves no file in /dev/shm") {
    for (const auto method : {start_method::fork, start_method::spawn}) {
      CAPTURE(to_string(method));
      pid_t rank = 0;
      {
        queue<tensor> q(8);
        const auto started = std::chrono::steady_clock::now();
        rank = spawn_and_join(push_unreceived, std::tuple{q, 4}, 1, test::join_by(method)).at(0);
        CHECK(std::chrono::steady_clock::now() - started < 5s);
        CHECK(q.size() == 4);
      }
      CHECK(files_of(rank).empty());
    }
  }

  // /dev/shm may be shared by pid namespaces (containers run with the
  // host's IPC): there a rank's pid may name another namespace's process,
  // whose files are not the rank's. Before, they were removed by name.
  TEST_CASE("a group's end removes its ranks' files, not those another pid namespace's process of the same pid made") {
    if (os::pid_namespace() == 0) {
      MESSAGE("this process's pid namespace is unknown: not checked");
      return;
    }
    const auto args = std::tuple{os::pid_namespace() + 1};
    const pid_t rank = spawn_and_join(leave_stamped_files, args, 1, test::join_by(start_method::fork)).at(0);
    const auto left = files_of(rank);
    for (const auto& name : left) fs::remove(fs::path("/dev/shm") / name);
    CHECK(left == std::vector{shm::segment_name(rank, foreign_nonce).substr(1)});
  }

  TEST_CASE("values left in a queue whose consumer was SIGKILLed leave no file in /dev/shm once it is dropped") {
    const strategy_scope scope(sharing_strategy::file_system);
    trim_shared_memory();
    const auto before = files_of(::getpid());
    {
      queue<tensor> q(8);
      for (int i = 0; i < 4; ++i) REQUIRE(q.put(large_shared(i), 1s));
      CHECK_THROWS(spawn_and_join(pop_one_then_die, std::tuple{q}, 1));
      CHECK(q.size() == 3);
    }
    trim_shared_memory();
    CHECK(files_of(::getpid()) == before);
  }

  // Before, a value popped by a consumer killed before its decode ended
  // counted as in flight for good: the segments its tensors named stayed,
  // files and all. Now the pop's claim notes how far the decode got, and
  // the queue's last holder lets go of the rest. A value too large for the
  // ring (in a block of its own) too.
  TEST_CASE("a value whose consumer was SIGKILLed while it decoded it leaves no file in /dev/shm") {
    dies_in_decode::spared = ::getpid();
    const strategy_scope scope(sharing_strategy::file_system);
    for (const std::size_t padding : {std::size_t{0}, std::size_t{100'000}}) {
      CAPTURE(padding);
      trim_shared_memory();
      const auto before = files_of(::getpid());
      {
        queue<dying_value> q(8);
        const dying_value value{large_shared(1), std::vector<std::uint8_t>(padding, 7), {}, large_shared(2)};
        REQUIRE(q.put(value, 1s));
        CHECK_THROWS_AS(spawn_and_join(pop_and_die_decoding, std::tuple{q}, 1), process_exited_error);
        CHECK(q.size() == 0);
      }
      trim_shared_memory();
      CHECK(files_of(::getpid()) == before);
    }
  }

  // Before, the claim of a pop killed between its claim and its move of
  // the head stayed on the record the next pop then took, and was let go
  // of again for the ended claimant: the block went back to the arena
  // under a tensor still in use, and the next allocation took it.
  TEST_CASE("a pop killed between its claim and its move of the head leaves the value to the next pop, held once") {
    queue<tensor> q(8);
    REQUIRE(q.put(tensor::full({5}, 7, dtype::int64, {.shared = true}), 1s));
    CHECK_THROWS_AS(spawn_and_join(pop_killed_in_its_take, std::tuple{q}, 1), process_exited_error);
    REQUIRE(q.size() == 1);  // the head never moved
    const tensor kept = q.get(1s).value();
    q = queue<tensor>(8);  // its last holder here: it lets go for the ended claimant
    check_block_kept(kept);
  }

  // Before, the inner pop's claim ended by clearing this thread's note
  // of the outer decode: the second tensor was taken unnoted, let go of
  // by the failed decode, and let go of again for the ended claimant.
  TEST_CASE("a decode that pops from another queue keeps noting how far it got") {
    queue<nested_value> q(8);
    queue<int> inner(8);
    REQUIRE(inner.put(1, 1s));
    const tensor second = tensor::full({5}, 7, dtype::int64, {.shared = true});
    const nested_value value{tensor::full({5}, 3, dtype::int64, {.shared = true}), {}, second, {}};
    REQUIRE(q.put(value, 1s));
    CHECK_THROWS(spawn_and_join(pop_nested_then_fail, std::tuple{q, inner}, 1));
    q = queue<nested_value>(8);  // its last holder here: it lets go for the ended claimant
    check_block_kept(second);
  }

  // The lines of a record claimed by a consumer killed in its decode come
  // back to the pushes once the ring is full.
  TEST_CASE("a push into a ring full but for a record a SIGKILLed consumer claimed goes through") {
    dies_in_decode::spared = ::getpid();
    // A ring of 64 KiB; values of 15,000 bytes (under a quarter of it,
    // so in the ring): the claimed one and three more fill it.
    queue<dying_value> q(4);
    const dying_value dies{large_shared(1), std::vector<std::uint8_t>(15'000, 7), {}, large_shared(2)};
    REQUIRE(q.put(dies, 1s));
    CHECK_THROWS_AS(spawn_and_join(pop_and_die_decoding, std::tuple{q}, 1), process_exited_error);
    const dying_value filler{tensor(), std::vector<std::uint8_t>(15'000, 1), {}, tensor()};
    int pushed = 0;
    while (pushed < 4 && q.put(filler, 2s)) ++pushed;
    CHECK(pushed == 4);
  }

  // A queue's table records 128 holding processes. Before, the slots of
  // processes killed holding it were never taken again, and one process
  // past 128 (killed, or all alive at once) stopped every later drain.
  TEST_CASE("a queue held by more processes than its table's slots, killed one by one, still drops what is left") {
    const auto held = holders_after_dropping([](queue<storage>& q) {
      for (int i = 0; i < 130; ++i) {
        CHECK_THROWS(spawn_and_join(hold_and_die, std::tuple{q}, 1, test::join_by(start_method::fork)));
      }
    });
    CHECK(held == 1);
  }

  TEST_CASE("a queue held by more processes at once than its table's slots still drops what is left") {
    const auto held = holders_after_dropping([](queue<storage>& q) {
      spawn_and_join(hold_a_while, std::tuple{q}, 130, test::join_by(start_method::fork));
    });
    CHECK(held == 1);
  }

  // Before, the pops below said only "shm_error: the processes holding a
  // segment have exited or let it go" (file_descriptor) or "opening
  // segment /dev/shm/...: No such file or directory" (file_system).
  TEST_CASE("a value whose sender was SIGKILLed before it was popped is peer_lost naming the sender") {
    for (const auto strategy : strategies) {
      for (const auto method : {start_method::spawn, start_method::forkserver}) {
        const strategy_scope scope(strategy);
        CAPTURE(to_string(strategy));
        CAPTURE(to_string(method));
        queue<int> pid(1);
        queue<tensor> q(4);
        CHECK_THROWS(
            spawn_and_join(push_then_die, std::tuple{pid, q, static_cast<int>(strategy)}, 1, test::join_by(method)));
        const auto sender = pid.get(1s);
        REQUIRE(sender);
        REQUIRE(q.size() == 2);
        // The memfds went with the sender, the only process holding them;
        // the files went with the group's sweep of what its ranks left.
        for (int i = 0; i < 2; ++i) check_sender_lost(q, *sender);
        CHECK(q.size() == 0);
        // The queue goes on.
        REQUIRE(q.put(tensor::full({2}, 5, dtype::int32, {.shared = true}), 1s));
        CHECK(q.get(1s).value().at<std::int32_t>({1}) == 5);
        CHECK(files_of(*sender).empty());
      }
    }
  }

  // Before, the pop threw the shm_error of the block's segment, not peer_lost.
  TEST_CASE("a rank returns shared memory of its own to a process that holds no queue") {
    for (const auto method : {start_method::spawn, start_method::fork, start_method::forkserver}) {
      CAPTURE(to_string(method));
      const auto rows = spawn_and_join(make_shared_row, std::tuple{}, 2, test::join_by(method));
      REQUIRE(rows.size() == 2);
      for (int rank = 0; rank < 2; ++rank) {
        CHECK(rows[static_cast<std::size_t>(rank)].is_shared());
        CHECK(rows[static_cast<std::size_t>(rank)].at<float>({15}) == static_cast<float>(rank + 3));
      }
    }
  }

  TEST_CASE("values a live rank passed on arrive though their maker was SIGKILLed, more than it keeps mapped") {
    const strategy_scope scope(sharing_strategy::file_descriptor);
    constexpr int n = 40;  // well past the 16 segments a process keeps for reuse
    queue<int> pid(1);
    queue<tensor> made(n), passed(n);
    event relayed, done;
    std::thread maker([&] { CHECK_THROWS(spawn_and_join(make_and_wait, std::tuple{pid, made, n}, 1)); });
    std::thread relay([&] { spawn_and_join(relay_and_wait, std::tuple{made, passed, n, relayed, done}, 1); });
    // What each pop gave: its first element, or what it threw. The threads
    // are joined before anything is checked.
    std::vector<std::string> got;
    const auto maker_pid = pid.get(10s);
    if (maker_pid && relayed.wait_for(30s)) {
      ::kill(*maker_pid, SIGKILL);
      maker.join();  // reaped, and what its group left swept
      for (int i = 0; i < n; ++i) {
        try {
          const auto t = passed.get(5s);
          got.push_back(t ? fmt::format("{}", t->at<float>({0})) : "nothing");
        } catch (const std::exception& e) {
          got.push_back(e.what());
        }
      }
    } else if (maker_pid) {
      ::kill(*maker_pid, SIGKILL);
    }
    done.set();
    if (maker.joinable()) maker.join();
    relay.join();
    REQUIRE(got.size() == static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) CHECK(got[static_cast<std::size_t>(i)] == std::to_string(i));
  }

  TEST_CASE("a value too large for the ring whose sender was SIGKILLed before it was popped is peer_lost") {
    for (const auto strategy : strategies) {
      const strategy_scope scope(strategy);
      CAPTURE(to_string(strategy));
      queue<int> pid(1);
      queue<std::string> q(4);
      CHECK_THROWS(spawn_and_join(push_large_then_die, std::tuple{pid, q, static_cast<int>(strategy)}, 1,
                                  test::join_by(start_method::forkserver)));
      const auto sender = pid.get(1s);
      REQUIRE(sender);
      REQUIRE(q.size() == 1);
      check_sender_lost(q, *sender);
      CHECK(q.size() == 0);
      const std::string large(std::size_t{1} << 20, 'y');
      REQUIRE(q.put(large, 1s));
      CHECK(q.get(1s).value() == large);
    }
  }

  // Before, the pop's failure on the first tensor left the queue's
  // reference on the second: its message never counted received, so the
  // parent's segment stayed held for good (and a rank making it waited at
  // its end for a receiver that had come and gone).
  TEST_CASE("a value whose first tensor went with its SIGKILLed sender lets go of the tensor after it") {
    for (const auto strategy : strategies) {
      const strategy_scope scope(strategy);
      CAPTURE(to_string(strategy));
      const tensor kept = tensor::full({16}, 3, dtype::int32, {.shared = true});
      queue<int> pid(1);
      queue<std::tuple<tensor, tensor>> q(4);
      CHECK_THROWS(spawn_and_join(push_own_and_kept_then_die, std::tuple{pid, q, kept, static_cast<int>(strategy)}, 1,
                                  test::join_by(start_method::forkserver)));
      const auto sender = pid.get(1s);
      REQUIRE(sender);
      REQUIRE(q.size() == 1);
      check_sender_lost(q, *sender);
      CHECK(detail::only_ended_processes_share(kept.storage()));
      CHECK(kept.at<std::int32_t>({15}) == 3);
    }
  }

  // Before, under file_descriptor, the rank stayed 30 s after returning
  // while the values it had pushed were unreceived, and then both they and
  // its returned tensor were lost ("the processes holding a segment have
  // exited"); under file_system the returned tensor's file was swept with
  // the rank ("went with its maker").
  TEST_CASE("tensors a rank returned and pushed arrive after it ended, and it ends at once") {
    for (const auto method : methods) {
      for (const bool large : {false, true}) {
        CAPTURE(to_string(method));
        CAPTURE(large);
        repeat_under_each_strategy(2, [&](leak_check&, int) {
          queue<tensor> q(8);
          const auto started = std::chrono::steady_clock::now();
          const auto returned = spawn_and_join(push_then_return, std::tuple{q, 3, large}, 2, test::join_by(method));
          CHECK(std::chrono::steady_clock::now() - started < 10s);
          REQUIRE(returned.size() == 2);
          for (int r = 0; r < 2; ++r) CHECK(returned[static_cast<std::size_t>(r)] == tensor::full({1000}, 7 + r, dtype::float32));
          std::map<int, int> seen;
          for (int i = 0; i < 6; ++i) {
            const tensor t = q.get(5s).value();
            CHECK(t.numel() == (large ? 100000 : 64));
            ++seen[static_cast<int>(t.at<float>({t.numel() - 1}))];
          }
          CHECK(seen == std::map<int, int>{{0, 2}, {1, 2}, {2, 2}});
        });
      }
    }
  }

  TEST_CASE("a tensor a rank pushed arrives after the rank ended by exit() or by an exception") {
    for (const auto method : methods) {
      for (const int how : {0, 1}) {
        CAPTURE(to_string(method));
        CAPTURE(how);
        queue<tensor> q(4);
        if (how == 0) {
          spawn_and_join(push_then_leave, std::tuple{q, how}, 1, test::join_by(method));
        } else {
          CHECK_THROWS_WITH(spawn_and_join(push_then_leave, std::tuple{q, how}, 1, test::join_by(method)),
                            doctest::Contains("after the push"));
        }
        const auto t = q.get(5s);
        REQUIRE(t.has_value());
        CHECK(*t == tensor::full({64}, 1, dtype::float32));
      }
    }
  }

  // A rank that sends nothing itself still hands its memory over as it
  // ends when a child it forked sent a value that names it.
  TEST_CASE("a tensor a rank's forked child pushed arrives after both ended") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(2, [&](leak_check&, int) {
        queue<tensor> q(8);
        const auto started = std::chrono::steady_clock::now();
        (void)spawn_and_join(push_through_forked_child, std::tuple{q}, 1, test::join_by(method));
        CHECK(std::chrono::steady_clock::now() - started < 10s);
        CHECK(q.get(5s).value() == tensor::full({64}, 5, dtype::int32));
      });
    }
  }

  // Before, a rank that had used up its descriptors could not make the
  // socket its hand-over needs: a fork rank waited 30 s for receivers while
  // the only one was blocked in the join, and its values were lost then.
  TEST_CASE("a rank that uses up its descriptors after pushing hands its values over and ends at once") {
    warm_up();
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      const leak_check check;
      queue<tensor> q(4);
      const auto started = std::chrono::steady_clock::now();
      (void)spawn_and_join(push_then_use_up_descriptors, std::tuple{q}, 2, test::join_by(method));
      CHECK(std::chrono::steady_clock::now() - started < 10s);
      std::map<int, int> seen;
      for (int i = 0; i < 2; ++i) {
        const tensor t = q.get(5s).value();
        ++seen[static_cast<int>(t.at<float>({0}))];
      }
      CHECK(seen == std::map<int, int>{{1, 1}, {2, 1}});
    }
  }

  // Before, a keeper out of descriptors took what a rank handed over as far
  // as its limit let it, and the kernel dropped the rest: their values
  // popped as peer_lost, "the sender ... exited".
  TEST_CASE("a keeper short of descriptors gives up those of values it received and takes all a rank hands over") {
    const int code = test::exit_code_in_child([] {
      queue<tensor> q(64);
      (void)spawn_and_join(push_large, std::tuple{q, 30}, 1, test::join_by(start_method::fork));
      std::vector<tensor> held;  // their segments keep descriptors here, which can be given up
      for (int i = 0; i < 30; ++i) held.push_back(q.get(5s).value());
      leave_descriptors_free(30);
      (void)spawn_and_join(push_large, std::tuple{q, 40}, 1, test::join_by(start_method::fork));
      int right = 0;
      for (int i = 0; i < 40; ++i) {
        try {
          const tensor t = q.get(5s).value();
          right += t.at<float>({99999}) == static_cast<float>(i) ? 1 : 0;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "value %d: %s\n", i, e.what());
        }
      }
      return right == 40 ? 0 : 1;
    });
    CHECK(code == 0);
  }

  // Before, the values whose descriptors did not fit popped as peer_lost,
  // "the sender ... exited": the keeper's limit went unnamed. Then, a
  // hand-over whose descriptors never found room stayed at the head of the
  // keeper's socket for good: every hand-over behind it waited too, its
  // senders blocked once the socket's queue was full, and their values
  // popped as "waits for descriptors".
  TEST_CASE("a hand-over too large for a keeper's room: what fits comes, the rest is an shm_error naming RLIMIT_NOFILE, and those behind it come whole") {
    const int code = test::exit_code_in_child([] {
      queue<tensor> q(64);
      leave_descriptors_free(20);
      (void)spawn_and_join(push_large, std::tuple{q, 40}, 1, test::join_by(start_method::fork));
      int right = 0;
      int named = 0;
      for (int i = 0; i < 40; ++i) {
        try {
          const tensor t = q.get(5s).value();
          right += t.at<float>({99999}) == static_cast<float>(i) ? 1 : 0;
        } catch (const shm_error& e) {
          named += std::string_view(e.what()).find("RLIMIT_NOFILE") != std::string_view::npos ? 1 : 0;
        }
      }
      if (right + named != 40 || right == 0) return 1;
      for (int round = 0; round < 12; ++round) {  // more than a socket's queue holds (10 here)
        const auto started = std::chrono::steady_clock::now();
        (void)spawn_and_join(push_large, std::tuple{q, 1}, 1, test::join_by(start_method::fork));
        if (std::chrono::steady_clock::now() - started > 5s) return 2;
        try {
          if (q.get(5s).value().at<float>({99999}) != 0.0f) return 3;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "round %d: %s\n", round, e.what());
          return 4;
        }
      }
      return 0;
    });
    CHECK(code == 0);
  }

  // Before, an empty message from any user to the keeper's socket (its name
  // is listed in /proc/net/unix) was taken for one of 253 descriptors, and
  // held the head of the socket where fewer were free.
  TEST_CASE("a message to a keeper from another user is dropped, and what ranks hand over behind it comes") {
    if (::geteuid() != 0) {
      MESSAGE("not root: no other user to send from, not checked");
      return;
    }
    const int code = test::exit_code_in_child([] {
      queue<tensor> q(64);
      (void)spawn_and_join(push_large, std::tuple{q, 1}, 1, test::join_by(start_method::fork));  // the keeper's socket
      if (q.get(5s).value().at<float>({99999}) != 0.0f) return 1;
      // The keeper's name, from the sockets' list.
      std::string name;
      std::ifstream unix_sockets("/proc/net/unix");
      const std::string prefix = fmt::format("@cohort-keeper-{}-", ::getpid());
      for (std::string line; std::getline(unix_sockets, line);) {
        if (const auto at = line.find(prefix); at != std::string::npos) name = line.substr(at + 1);
      }
      if (name.empty()) return 2;
      const pid_t other = ::fork();
      if (other == 0) {
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(1);
        const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::memcpy(a.sun_path + 1, name.data(), name.size());
        const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
        ::_exit(::sendto(s, "", 0, 0, reinterpret_cast<const sockaddr*>(&a), length) == 0 ? 0 : 1);
      }
      int status = 0;
      if (::waitpid(other, &status, 0) != other || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 3;
      leave_descriptors_free(100);
      for (int round = 0; round < 3; ++round) {
        (void)spawn_and_join(push_large, std::tuple{q, 2}, 1, test::join_by(start_method::fork));
        for (int i = 0; i < 2; ++i) {
          try {
            if (q.get(5s).value().at<float>({99999}) != static_cast<float>(i)) return 4;
          } catch (const std::exception& e) {
            std::fprintf(stderr, "round %d: %s\n", round, e.what());
            return 5;
          }
        }
      }
      return 0;
    });
    CHECK(code == 0);
  }

  TEST_CASE("values a rank pushed that nobody pops are let go once the queue is dropped, after the rank ended") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(2, [&](leak_check&, int) {
        queue<tensor> q(8);
        (void)spawn_and_join(push_then_return, std::tuple{q, 4, true}, 1, test::join_by(method));
        CHECK(q.size() == 4);
      });
    }
  }

  // Before, a fork rank's end let go of its hold on the queue's memory but
  // left its place in the queue's table of holders, which then counted a
  // hold that was gone: the values left were never dropped, and the memory
  // they named stayed (files in /dev/shm for good, memfds held open here).
  TEST_CASE("values left in a queue a rank kept past its end are let go once the queue is dropped") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(1, [&](leak_check&, int) {
        queue<tensor> q(8);
        (void)spawn_and_join(keep_queue, std::tuple{q}, 1, test::join_by(method));
        for (int i = 0; i < 4; ++i) REQUIRE(q.put(large_shared(i), 1s));
      });
    }
  }

  TEST_CASE("values left in a queue whose last holder was a rank that kept it are let go as the rank ends") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(1, [&](leak_check&, int) {
        queue<queue<tensor>> handed(1);
        {
          queue<tensor> q(8);
          for (int i = 0; i < 4; ++i) REQUIRE(q.put(large_shared(i), 1s));
          REQUIRE(handed.put(q, 1s));
        }
        (void)spawn_and_join(keep_popped_queue, std::tuple{handed}, 1, test::join_by(method));
        CHECK(handed.size() == 0);
      });
    }
  }

  // Before, a fork rank that was the queue's last holder kept the
  // storages it inherited over the queue's memory (the caller's queue, the
  // call's arguments) and so never found itself the last; and a spawn or
  // forkserver rank could find the memory its arguments name freed before
  // it decoded them, the caller's being its only hold until then.
  TEST_CASE("values left in a queue given to a group's ranks are let go as they end, the caller's dropped at start") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(1, [&](leak_check&, int) {
        event go;
        asio::io_context io;
        const auto ok = test::run(io, [&]() -> asio::awaitable<bool> {
          std::optional<group> g;
          {
            queue<tensor> q(8);
            for (int i = 0; i < 4; ++i) REQUIRE(q.put(large_shared(i), 1s));
            group_spec spec;
            spec.entry = call(method, pop_one_when_told, q, go);
            spec.nprocs = 2;
            g.emplace(co_await start_processes(spec));
          }
          go.set();
          const auto r = co_await g->wait();
          co_return r.ok();
        }());
        CHECK(ok);
      });
    }
  }

  // Before, the end of the last storage over a queue received here (whose
  // end now hands its hold on to another) kept the segment's descriptor.
  TEST_CASE("a queue received from a live process and dropped leaves none of its descriptors here") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      queue<queue<int>> out(1);
      event done;
      asio::io_context io;
      const auto held = test::run(io, [&]() -> asio::awaitable<std::pair<int, int>> {
        group_spec spec;
        spec.entry = call(method, send_own_queue, out, done);
        spec.nprocs = 1;
        group g = co_await start_processes(spec);
        const int before = cohort_memfds();
        int holding = 0;
        {
          const auto received = out.get(10s);
          REQUIRE(received.has_value());
          holding = cohort_memfds() - before;
        }
        const int after = cohort_memfds() - before;
        done.set();
        const auto r = co_await g.wait();
        CHECK(r.ok());
        co_return std::pair{holding, after};
      }());
      CHECK(held.first == 1);
      CHECK(held.second == 0);
    }
  }

  // Before, a trim that ran as the watcher looked hid the lingering
  // segment from it: the watcher ended, and the segment stayed until the
  // next trim or large allocation.
  TEST_CASE("a sender that idles after its last large send lets go of the segment once the receiver drops it") {
    for (const auto method : methods) {
      for (const bool trimming : {false, true}) {
        CAPTURE(to_string(method));
        CAPTURE(trimming);
        queue<tensor> out(2);
        queue<int> go(1);
        queue<int> held(1);
        asio::io_context io;
        const auto answer = test::run(io, [&]() -> asio::awaitable<int> {
          group_spec spec;
          spec.entry = call(method, memfds_after_the_receiver_dropped, out, go, trimming);
          spec.nprocs = 1;
          group g = co_await start_processes(spec);
          {
            const auto t = out.get(10s);
            REQUIRE(t.has_value());
            CHECK(t->at<float>({7}) == 3.0f);
            // Held while the sender trims: past several of its watcher's looks.
            if (trimming) std::this_thread::sleep_for(700ms);
          }
          go.put(1);
          const auto r = co_await g.wait();
          REQUIRE(r.ok());
          co_return r.return_values.at(0)->as<int>();
        }());
        CHECK(answer == 0);
      }
    }
  }

  TEST_CASE("a rank pops the values a sibling pushed before it ended") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(2, [&](leak_check&, int) {
        queue<tensor> q(8);
        queue<int> pids(1);
        const auto sums = spawn_and_join(push_or_pop_after_end, std::tuple{q, pids, 5}, 2, test::join_by(method));
        REQUIRE(sums.size() == 2);
        CHECK(sums[1] == 0 + 1 + 2 + 3 + 4);
      });
    }
  }

  // Before, the middle rank of nested groups let go of what its own rank
  // handed over once it held no queue object, before it ended, so nothing
  // reached the top (peer_lost: "the sender ... exited before it was
  // received"); under file_system it handed over only what it made itself,
  // and its group had swept its rank's names ("went with its maker").
  TEST_CASE("a tensor a rank's own rank pushed is popped here after both ended") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(1, [&](leak_check&, int) {
        queue<tensor> q(8);
        const int strategy = static_cast<int>(get_sharing_strategy());
        const auto started = std::chrono::steady_clock::now();
        (void)spawn_and_join(start_grandchild, std::tuple{q, strategy, static_cast<int>(method), false}, 1,
                             test::join_by(method));
        CHECK(std::chrono::steady_clock::now() - started < 10s);
        const auto t = q.get(5s);
        REQUIRE(t.has_value());
        CHECK(*t == tensor::full({64}, 42, dtype::float32));
      });
    }
  }

  // Before, under file_system the middle rank did not hand over the
  // returned tensor's file, which its group had swept: "reading the rank's
  // result: ... went with its maker".
  TEST_CASE("a rank returns the tensor its own rank returned") {
    for (const auto method : methods) {
      CAPTURE(to_string(method));
      repeat_under_each_strategy(1, [&](leak_check&, int) {
        queue<tensor> q(8);
        const int strategy = static_cast<int>(get_sharing_strategy());
        const auto returned =
            spawn_and_join(start_grandchild, std::tuple{q, strategy, static_cast<int>(method), true}, 1,
                           test::join_by(method));
        REQUIRE(returned.size() == 1);
        CHECK(returned[0] == tensor::full({64}, 43, dtype::float32));
        CHECK(q.get(5s).has_value());  // what was pushed, not left to the leak check
      });
    }
  }

  // Before, a handle named only the grandchild's keeper, the middle rank:
  // once it had ended, a rank of another group found nothing there.
  TEST_CASE("a rank pops a tensor that a rank of an ended sibling pushed") {
    for (const auto method : methods) {
      for (const auto consumer_method : methods) {
        CAPTURE(to_string(method));
        CAPTURE(to_string(consumer_method));
        repeat_under_each_strategy(1, [&](leak_check&, int) {
          queue<tensor> q(8);
          const int strategy = static_cast<int>(get_sharing_strategy());
          (void)spawn_and_join(start_grandchild, std::tuple{q, strategy, static_cast<int>(method), false}, 1,
                               test::join_by(method));
          const auto popped = spawn_and_join(pop_first_element, std::tuple{q}, 1, test::join_by(consumer_method));
          REQUIRE(popped.size() == 1);
          CHECK(popped[0] == 42.0f);
        });
      }
    }
  }

  // Before 351d22d, freeing an arena's first block (where a segment of one
  // block keeps its only one) put the whole arena on the lingering list,
  // once per free: the list grew without bound, and a free arena needed a
  // second trim.
  TEST_CASE("one trim lets go of a free arena, however often its first block was freed") {
    // In a process of its own, whose arena nothing else holds.
    const auto seen = spawn_and_join(free_first_block_then_trim, std::tuple{}, 1).at(0);
    REQUIRE(seen.size() == 3);
    CHECK(seen[0] == 1);  // the arena went
    CHECK(seen[1] == 0);  // with its descriptor
    CHECK(seen[2] == 0);  // and nothing was left for a second trim
  }

  TEST_CASE("a segment a rank's own child made leaves /dev/shm with the group once nothing can reach it") {
    for (const auto how : {left_by::killed, left_by::exit}) {
      CAPTURE(static_cast<int>(how));
      queue<storage> q;
      const auto pids = spawn_and_join(fork_a_segment_maker, std::tuple{q, static_cast<int>(how)}, 1,
                                       test::join_by(start_method::fork));
      REQUIRE(pids.size() == 1);
      REQUIRE(pids[0] > 0);
      const auto left = files_of(pids[0]);
      CHECK_MESSAGE(left.empty(), fmt::format("left in /dev/shm: {}", fmt::join(left, ", ")));
      for (const auto& name : left) fs::remove(fs::path("/dev/shm") / name);
    }
  }

  TEST_CASE("a segment whose maker ended stays in /dev/shm while a value in a queue names it") {
    queue<storage> q;
    const auto pids = spawn_and_join(fork_a_segment_maker, std::tuple{q, static_cast<int>(left_by::in_flight)}, 1,
                                     test::join_by(start_method::fork));
    REQUIRE(pids.size() == 1);
    REQUIRE(pids[0] > 0);
    CHECK(files_of(pids[0]).size() == 1);
    const auto got = q.get(5s);
    REQUIRE(got.has_value());
    CHECK(got->nbytes() == 64);
    CHECK(std::to_integer<int>(got->data()[63]) == 5);
  }
}

}  // namespace sharing_tests
