#include "cohort/pool.hpp"
#include "cohort/tensor.hpp"

#include "support/harness.hpp"
#include "support/process_probe.hpp"

#include <asio/detached.hpp>
#include <asio/this_coro.hpp>

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>

using namespace cohort;

namespace {
// While set, every thread this process starts fails to start, as under a
// full pids cgroup (RLIMIT_NPROC does not hold root back).
std::atomic<bool> refuse_threads{false};
}  // namespace

// This program's pthread_create comes before libc's for every caller.
extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*fn)(void*), void* arg) {
  if (refuse_threads.load()) return EAGAIN;
  using real_create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<real_create>(::dlsym(RTLD_NEXT, "pthread_create"));
  return real(thread, attr, fn, arg);
}

namespace pool_tests {

// As torch's test_multiprocessing fill: each call writes into a shared buffer.
void fill(int, storage buffer) { std::memset(buffer.data(), 7, buffer.nbytes()); }
COHORT_ENTRYPOINT(fill);

long square(int, long x) { return x * x; }
COHORT_ENTRYPOINT(square);

long slow_square(int, long x) {
  ::usleep(20000);
  return x * x;
}
COHORT_ENTRYPOINT(slow_square);

// Counts itself in `taken` (a count in shared memory), then returns 30,000
// characters 2 s later: a result that travels inside the results queue's
// ring, not in a block of its own.
std::string slow_text(int, storage taken) {
  std::atomic_ref(*reinterpret_cast<std::int64_t*>(taken.data())).fetch_add(1);
  ::usleep(2000000);
  return std::string(30000, 'x');
}
COHORT_ENTRYPOINT(slow_text);

// Counts itself in `ran` (a count in shared memory). Item 0 returns a
// storage whose segment's file (file_system) it has removed, so that the
// parent cannot open it while this worker lives; the others take 100 ms.
storage unopenable_first(int, std::tuple<int, storage> item) {
  const auto& [index, ran] = item;
  std::atomic_ref(*reinterpret_cast<std::int64_t*>(ran.data())).fetch_add(1);
  if (index != 0) {
    ::usleep(100000);
    return storage();
  }
  set_sharing_strategy(sharing_strategy::file_system);
  storage s = storage::allocate_shared(16);
  const auto own = fmt::format("cohort_{}_", ::getpid());
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().starts_with(own)) std::filesystem::remove(entry.path());
  }
  return s;
}
COHORT_ENTRYPOINT(unopenable_first);

// Counts itself in `ran` (a count in shared memory), then squares `x`
// 20 ms later.
long counted_square(int, std::tuple<storage, long> item) {
  const auto& [ran, x] = item;
  std::atomic_ref(*reinterpret_cast<std::int64_t*>(ran.data())).fetch_add(1);
  ::usleep(20000);
  return x * x;
}
COHORT_ENTRYPOINT(counted_square);

int which_worker(int worker, int) { return worker; }
COHORT_ENTRYPOINT(which_worker);

int fail_on_three(int, int x) {
  if (x == 3) throw std::domain_error("three");
  return x;
}
COHORT_ENTRYPOINT(fail_on_three);

int throw_int_on_three(int, int x) {
  if (x == 3) throw 42;  // NOLINT(hicpp-exception-baseclass): what is tested
  return x;
}
COHORT_ENTRYPOINT(throw_int_on_three);

int nested_on_three(int, int x) {
  if (x == 3) {
    try {
      throw std::runtime_error("inner");
    } catch (...) {
      std::throw_with_nested(std::domain_error("three"));
    }
  }
  return x;
}
COHORT_ENTRYPOINT(nested_on_three);

void exit_zero_on_three(int, int x) {
  if (x == 3) ::_exit(0);
}
COHORT_ENTRYPOINT(exit_zero_on_three);

int terminate_on_three(int, int x) {
  if (x == 3) std::terminate();
  return x;
}
COHORT_ENTRYPOINT(terminate_on_three);

void die_on_three(int, int x) {
  if (x == 3) ::_exit(9);
}
COHORT_ENTRYPOINT(die_on_three);

int worker_pid(int, int) { return ::getpid(); }

// A process started with this variable set waits that many milliseconds
// before main: a pool's worker, before it reads its queues.
constexpr std::string_view worker_start_delay = "COHORT_TEST_START_DELAY_MS";
[[maybe_unused]] const bool start_delayed = [] {
  if (const char* ms = std::getenv(worker_start_delay.data())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  }
  return true;
}();
COHORT_ENTRYPOINT(worker_pid);

// Writes its worker's pid into slot `index` of `pids` (a shared array of
// std::int64_t), then never returns.
void sleep_forever(int, std::tuple<storage, int> item) {
  const auto& [pids, index] = item;
  std::atomic_ref(reinterpret_cast<std::int64_t*>(pids.data())[index]).store(::getpid());
  for (;;) ::pause();
}
COHORT_ENTRYPOINT(sleep_forever);

storage make_storage(int, int value) {
  storage s = storage::allocate_shared(16);
  std::memset(s.data(), value, 16);
  return s;
}
COHORT_ENTRYPOINT(make_storage);

// A tensor of 512 KiB: a segment of its own.
tensor make_large(int, int value) { return tensor::full({1 << 17}, value, dtype::float32, {.shared = true}); }
COHORT_ENTRYPOINT(make_large);

// How many mappings of cohort's segments the worker running it has.
int segment_mappings(int, int) {
  return test::mappings_naming("/memfd:cohort") + test::mappings_naming("/dev/shm/cohort");
}
COHORT_ENTRYPOINT(segment_mappings);

// Item 0 (no text) marks its storage once 300 ms have passed (item 1 is in
// the queue by then) and returns; the others write 0xAB over their storage,
// once their text, large enough to take a while, has been decoded.
void mark_or_scribble(int, std::tuple<std::string, storage> item) {
  const auto& [text, s] = item;
  if (text.empty()) {
    ::usleep(300000);
    std::atomic_ref(*reinterpret_cast<std::int64_t*>(s.data())).store(1);
    return;
  }
  std::memset(s.data(), 0xAB, s.nbytes());
}
COHORT_ENTRYPOINT(mark_or_scribble);

// Maps slow_square over `items` on `p` awaited, while a timer on the same
// io_context counts its ticks; returns the results and the ticks.
asio::awaitable<std::pair<std::vector<long>, int>> map_beside_a_timer(pool& p, std::vector<long> items) {
  int ticks = 0;
  bool done = false;
  auto executor = co_await asio::this_coro::executor;
  asio::co_spawn(executor, [&]() -> asio::awaitable<void> {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    while (!done) {
      timer.expires_after(std::chrono::milliseconds(2));
      co_await timer.async_wait(asio::use_awaitable);
      ++ticks;
    }
  }, asio::detached);
  auto results = co_await p.map(slow_square, items, asio::use_awaitable);
  done = true;
  co_return std::pair{std::move(results), ticks};
}

// `n` items of counted_square counting in `ran`.
std::vector<std::tuple<storage, long>> counted_items(const storage& ran, int n) {
  std::memset(ran.data(), 0, ran.nbytes());
  return std::vector<std::tuple<storage, long>>(n, std::tuple<storage, long>(ran, 3));
}

std::int64_t count_of(const storage& ran) {
  return std::atomic_ref(*reinterpret_cast<std::int64_t*>(ran.data())).load();
}

// Two items of sleep_forever writing into `pids`, which they clear: on a
// pool of two workers, each worker takes one (the first never lets go).
std::vector<std::tuple<storage, int>> forever_items(const storage& pids) {
  std::memset(pids.data(), 0, pids.nbytes());
  return {{pids, 0}, {pids, 1}};
}

// The pids sleep_forever wrote into `pids`, once both workers have (within 10 s).
std::vector<pid_t> stuck_workers(const storage& pids) {
  const auto* slots = reinterpret_cast<std::int64_t*>(pids.data());
  const auto both = [&] {
    return std::atomic_ref(slots[0]).load() != 0 && std::atomic_ref(slots[1]).load() != 0;
  };
  REQUIRE(test::within(std::chrono::seconds(10), both));
  return {static_cast<pid_t>(slots[0]), static_cast<pid_t>(slots[1])};
}

// Whether no process `pid` exists any more: ended and reaped.
bool reaped(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

// What a map's handler was given: the logic_error's text, or what else came.
template <class... Values>
auto said_into(std::promise<std::string>& said) {
  return [&said](std::exception_ptr e, Values...) {
    try {
      if (e) std::rethrow_exception(e);
      said.set_value("completed");
    } catch (const std::logic_error& error) {
      said.set_value(error.what());
    } catch (...) {
      said.set_value("another exception");
    }
  };
}

// The threads of this process.
long thread_count() { return std::distance(std::filesystem::directory_iterator("/proc/self/task"), {}); }

// Counts its live copies in `*alive`: held by a handler, it tells whether
// the handler has been destroyed.
struct tracked {
  explicit tracked(std::shared_ptr<int> count) : alive(std::move(count)) { ++*alive; }
  tracked(const tracked& other) : alive(other.alive) { ++*alive; }
  tracked(tracked&& other) noexcept : alive(other.alive) { ++*alive; }
  tracked& operator=(const tracked&) = delete;
  ~tracked() { --*alive; }
  std::shared_ptr<int> alive;
};

const start_method methods[] = {start_method::spawn, start_method::fork, start_method::forkserver};

// Maps slow_square over `items`, and cancels the map through `cancel`
// after `after`; what its handler gets.
std::future<std::exception_ptr> map_cancelled_after(pool& p, const std::vector<long>& items,
                                                    asio::cancellation_signal& cancel,
                                                    std::chrono::milliseconds after) {
  auto outcome = std::make_shared<std::promise<std::exception_ptr>>();
  auto done = outcome->get_future();
  auto op = p.map(slow_square, items, asio::experimental::deferred);
  std::move(op)(asio::bind_cancellation_slot(cancel.slot(), [outcome](std::exception_ptr e, std::vector<long>) {
    outcome->set_value(e);
  }));
  std::this_thread::sleep_for(after);
  cancel.emit(asio::cancellation_type::terminal);
  return done;
}

TEST_SUITE("pool") {
  TEST_CASE("a pool's workers fill shared buffers in place") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      const pool_options options{.method = method};
      pool p(2, options);
      std::vector<storage> buffers;
      for (int i = 0; i < 10; ++i) {
        buffers.push_back(storage::allocate(100));
        std::memset(buffers.back().data(), 0, 100);
      }
      p.map(fill, buffers);
      for (const auto& b : buffers) {
        CHECK(b.is_shared());
        CHECK(std::all_of(b.data(), b.data() + 100, [](std::byte x) { return x == std::byte{7}; }));
      }
    }
  }

  TEST_CASE("results come back in the items' order, from every worker") {
    pool p(3);
    std::vector<long> items(500);
    std::iota(items.begin(), items.end(), 0);
    const auto squares = p.map(square, items);
    REQUIRE(squares.size() == items.size());
    for (std::size_t i = 0; i < items.size(); ++i) CHECK(squares[i] == items[i] * items[i]);
    const auto workers = p.map(which_worker, std::vector<int>(300, 0));
    for (int w : workers) CHECK((w >= 0 && w < 3));
  }

  TEST_CASE("an exception in one item is thrown by map and the pool goes on") {
    pool p(2);
    try {
      p.map(fail_on_three, std::vector<int>{1, 2, 3, 4});
      FAIL("map returned");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("item 2") != std::string::npos);
      CHECK(std::string(e.what()).find("std::domain_error: three") != std::string::npos);
    }
    CHECK(p.map(square, std::vector<long>{5}) == std::vector<long>{25});
  }

  TEST_CASE("an exception not derived from std::exception fails its item, named by its type, and the pool goes on") {
    pool p(2);
    CHECK_THROWS_WITH_AS(p.map(throw_int_on_three, std::vector<int>{1, 2, 3, 4}),
                         doctest::Contains("item 2 raised int"), std::runtime_error);
    CHECK(p.map(square, std::vector<long>{5}) == std::vector<long>{25});
  }

  TEST_CASE("a nested exception fails its item with the type the item threw and its cause") {
    pool p(1);
    CHECK_THROWS_WITH_AS(p.map(nested_on_three, std::vector<int>{1, 2, 3, 4}),
                         doctest::Contains("item 2 raised std::domain_error: three; caused by std::runtime_error: inner"),
                         std::runtime_error);
  }

  TEST_CASE("a pipe in a pool's streams is refused, naming pool_options") {
    pool_options options;
    options.spawn.err = stdio::pipe();
    CHECK_THROWS_WITH_AS(pool(1, options), doctest::Contains("cohort::pool: pool_options::spawn.err is a pipe"),
                         std::invalid_argument);
  }

  TEST_CASE("a pool moved from has no workers and refuses maps") {
    pool p(1);
    pool q = std::move(p);
    CHECK(p.workers() == 0);  // NOLINT(bugprone-use-after-move): what is tested
    CHECK_THROWS_WITH_AS(p.map(square, std::vector<long>{5}), "cohort::pool: used after it was moved from",
                         std::logic_error);
    CHECK(q.map(square, std::vector<long>{6}) == std::vector<long>{36});
  }

  TEST_CASE("a child of the program's own fork refuses its parent's pool and leaves it alone as its copy goes") {
    pool_options options;
    options.method = start_method::fork;
    pool p(2, options);
    CHECK(p.map(square, std::vector<long>{1, 2}) == std::vector<long>{1, 4});
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::alarm(20);  // a copy's end that waited for the parent's workers would never return
      int code = 0;
      try {
        p.map(square, std::vector<long>{3});
        code = 1;  // it ran on the parent's workers
      } catch (const std::logic_error& e) {
        if (std::string(e.what()).find("a forked child makes a pool of its own") == std::string::npos) code = 2;
      } catch (...) {
        code = 3;
      }
      { pool gone = std::move(p); }
      ::_exit(code);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK_MESSAGE(WIFEXITED(status), "the child ended by signal ", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 0);
    // The parent's pool goes on, its queues open and its items its own.
    CHECK(p.map(square, std::vector<long>(10, 4)) == std::vector<long>(10, 16));
  }

  TEST_CASE("an item that calls std::terminate ends the pool with a trace that starts at the item's function") {
    pool p(2);
    try {
      p.map(terminate_on_three, std::vector<int>{1, 2, 3, 4});
      FAIL("no exception");
    } catch (const process_raised_error& e) {
      CHECK(e.message() == "std::terminate called without an exception");
      INFO(e.trace());
      // Neither the handler's frames above it nor the worker's loop below.
      CHECK(e.trace().rfind("#0 pool_tests::terminate_on_three(int, int)", 0) == 0);
      CHECK(e.trace().find("cohort::") == std::string::npos);
      CHECK(e.trace().find("libstdc++") == std::string::npos);
    }
    CHECK_THROWS_AS(p.map(square, std::vector<long>{5}), std::logic_error);
  }

  TEST_CASE("a worker that dies ends the pool with its exit") {
    pool p(2);
    CHECK_THROWS_AS(p.map(die_on_three, std::vector<int>{1, 2, 3, 4}), process_exited_error);
    CHECK_THROWS_AS(p.map(square, std::vector<long>{5}), std::logic_error);
  }

  TEST_CASE("a worker that exits with code 0 inside an item ends the pool too, not waits for the item") {
    pool p(2);
    try {
      p.map(exit_zero_on_three, std::vector<int>{1, 2, 3, 4});
      FAIL("no exception");
    } catch (const process_exited_error& e) {  // nothing was raised: the worker exited inside the item
      CHECK(e.exit_code() == 0);
      CHECK(std::string(e.what()).find("exited with code 0 before its function returned") != std::string::npos);
    }
    CHECK_THROWS_AS(p.map(square, std::vector<long>{5}), std::logic_error);
  }

  TEST_CASE("storages a worker returns stay valid in the parent") {
    pool p(2);
    const auto made = p.map(make_storage, std::vector<int>{1, 2, 3});
    for (int i = 0; i < 3; ++i) CHECK(std::to_integer<int>(made[i].data()[15]) == i + 1);
  }

  // Before, the worker's loop let the task queue's peer_lost escape: each
  // worker left behind printed "rank N raised cohort::peer_lost" and a trace.
  TEST_CASE("a worker whose parent died ends without a word on its stderr") {
    enum when { after_items, before_items, before_its_queues };
    for (const when death : {after_items, before_items, before_its_queues}) {
      CAPTURE(death);
      const auto err_path =
          std::filesystem::temp_directory_path() / fmt::format("cohort_pool_orphan_{}.err", ::getpid());
      std::filesystem::remove(err_path);
      int pids[2];
      REQUIRE(::pipe2(pids, O_CLOEXEC) == 0);
      const pid_t parent = ::fork();
      REQUIRE(parent >= 0);
      if (parent == 0) {
        ::alarm(20);
        ::close(pids[0]);
        try {
          pool_options options;
          options.spawn.parent_death_signal = 0;
          options.spawn.err = stdio::append(err_path);
          // Its workers start after this process has exited.
          if (death == before_its_queues) options.spawn.env.set(std::string(worker_start_delay), "500");
          pool p(2, options);
          if (death == after_items) (void)p.map(worker_pid, std::vector<int>(4, 0));
          // Its workers waiting for their first items, as a rule.
          if (death == before_items) std::this_thread::sleep_for(std::chrono::milliseconds(500));
          for (const auto& child : test::child_entries()) {
            if (::write(pids[1], &child.pid, sizeof child.pid) != sizeof child.pid) ::_exit(2);
          }
          ::_exit(0);  // the pool left as it is, its workers running
        } catch (...) {
          ::_exit(1);
        }
      }
      ::close(pids[1]);
      std::vector<pid_t> workers;
      pid_t pid = 0;
      while (::read(pids[0], &pid, sizeof pid) == sizeof pid) workers.push_back(pid);
      ::close(pids[0]);
      int status = 0;
      REQUIRE(::waitpid(parent, &status, 0) == parent);
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
      REQUIRE(workers.size() == 2);
      // They find their parent gone and end.
      const auto all_ended = [&] { return std::none_of(workers.begin(), workers.end(), test::alive); };
      CHECK(test::within(std::chrono::seconds(10), all_ended));
      // Reaped here where this process is the orphans' subreaper.
      for (const pid_t worker : workers) (void)::waitpid(worker, nullptr, WNOHANG);
      std::ifstream err(err_path);
      const std::string said((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
      CHECK_MESSAGE(said.empty(), said);
      std::filesystem::remove(err_path);
    }
  }

  TEST_CASE("a storage a worker returned is held by the parent alone, and outlives the pool") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      std::vector<storage> made;
      {
        const pool_options options{.method = method};
        pool p(2, options);
        made = p.map(make_storage, std::vector<int>{1, 2, 3});
        // The worker lets go right after sending; give it the moment.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (const auto& s : made) {
          while (detail::shared_holders(s) > 1 && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          CHECK(detail::shared_holders(s) == 1);
        }
      }
      for (int i = 0; i < 3; ++i) {
        CHECK(detail::shared_holders(made[i]) == 1);
        CHECK(std::to_integer<int>(made[i].data()[15]) == i + 1);
      }
    }
  }

  TEST_CASE("an idle worker gives back the memory of the results the parent dropped") {
    pool p(1);
    const auto mappings = [&p] { return p.map(segment_mappings, std::vector<int>{0}).at(0); };
    const int before = mappings();
    {
      const auto made = p.map(make_large, std::vector<int>(8, 1));
      REQUIRE(made.size() == 8);
      CHECK(mappings() >= before + 8);  // the worker made a segment for each
    }
    // Past the idle wait (100 ms) the worker finds only what it had; each
    // look is an item, which ends the wait, so the looks are spaced.
    int after = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    do {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      after = mappings();
    } while (after != before && std::chrono::steady_clock::now() < deadline);
    CHECK(after == before);
  }

  // Before, pool(n) took its options as a defaulted `{}`, which g++ 12
  // destroyed twice inside this co_await: free() aborted.
  TEST_CASE("a pool made with default options inside a co_await expression maps and ends") {
    const std::vector<long> items{1, 2, 3};
    asio::io_context io;
    const auto results = test::run(io, [&]() -> asio::awaitable<std::vector<long>> {
      co_return co_await pool(2).map(square, items, asio::use_awaitable);
    }());
    CHECK(results == std::vector<long>{1, 4, 9});
  }

  // Before, the thread's failure was thrown from the map's initiation:
  // awaited, the process ended in std::terminate; with a callback, the call
  // threw and the work it had counted on the io_context went, stopping it.
  TEST_CASE("a map whose thread cannot start fails through its handler, and the next map runs") {
    pool p(2);
    const std::vector<long> items{1, 2, 3};
    const std::string why = "cohort::pool::map: starting the thread that runs the map: ";
    asio::io_context io;
    std::string awaited_error;
    std::vector<long> after;
    const auto maps = [&]() -> asio::awaitable<void> {
      refuse_threads = true;
      try {
        (void)co_await p.map(square, items, asio::use_awaitable);
      } catch (const std::system_error& e) {
        awaited_error = e.what();
      }
      refuse_threads = false;
      after = co_await p.map(square, items, asio::use_awaitable);
    };
    asio::co_spawn(io, maps(), asio::detached);
    io.run();
    CHECK(awaited_error == why + std::strerror(EAGAIN));
    CHECK(after == std::vector<long>{1, 4, 9});

    // A callback: the error reaches it, and the io_context runs on to it.
    io.restart();
    std::string callback_error;
    bool called = false;
    refuse_threads = true;
    try {
      p.map(square, items, asio::bind_executor(io, [&](std::exception_ptr error, std::vector<long>) {
              called = true;
              try {
                if (error) std::rethrow_exception(error);
              } catch (const std::system_error& e) {
                callback_error = e.what();
              }
            }));
    } catch (...) {
      refuse_threads = false;
      FAIL("the map threw at its call");
    }
    refuse_threads = false;
    io.run();
    CHECK(called);
    CHECK(callback_error == why + std::strerror(EAGAIN));
    CHECK(p.map(square, items) == std::vector<long>{1, 4, 9});

    // A map waiting in line whose turn comes while no thread can start:
    // it fails so, and the line goes on (before, the line stayed taken,
    // and every later map waited for good).
    io.restart();
    const std::vector<long> slow_items(4, 3);
    std::string queued_error;
    std::vector<long> later;
    p.map(slow_square, slow_items, asio::bind_executor(io, [&](std::exception_ptr, std::vector<long>) {
      refuse_threads = false;
      p.map(square, items, asio::bind_executor(io, [&](std::exception_ptr, std::vector<long> r) { later = r; }));
    }));
    p.map(square, items, asio::bind_executor(io, [&](std::exception_ptr error, std::vector<long>) {
      try {
        if (error) std::rethrow_exception(error);
      } catch (const std::system_error& e) {
        queued_error = e.what();
      }
    }));
    refuse_threads = true;  // the slow map has its thread; the one behind it will have none
    io.run_for(std::chrono::seconds(20));
    refuse_threads = false;
    CHECK(queued_error == why + std::strerror(EAGAIN));
    CHECK(later == std::vector<long>{1, 4, 9});
  }

  TEST_CASE("an awaited map leaves its io_context free to run other work") {
    pool p(2);
    std::vector<long> items(10);
    std::iota(items.begin(), items.end(), 0);
    asio::io_context io;
    const auto [results, ticks] = test::run(io, map_beside_a_timer(p, items));
    REQUIRE(results.size() == items.size());
    for (std::size_t i = 0; i < items.size(); ++i) CHECK(results[i] == items[i] * items[i]);
    // 10 items of 20 ms on 2 workers take 100 ms: a blocked io_context would tick once at most.
    CHECK(ticks >= 10);
  }

  TEST_CASE("a map completes a callback on its executor, and a future with its values or its exception") {
    pool p(2);
    asio::io_context io;
    auto work = asio::make_work_guard(io);  // the map completes from another thread
    std::promise<std::thread::id> ran_on;
    std::vector<long> got;
    p.map(square, std::vector<long>{1, 2, 3}, asio::bind_executor(io, [&](std::exception_ptr e, std::vector<long> v) {
      CHECK_FALSE(e);
      got = std::move(v);
      ran_on.set_value(std::this_thread::get_id());
      work.reset();
    }));
    io.run_for(std::chrono::seconds(30));
    CHECK(got == std::vector<long>{1, 4, 9});
    CHECK(ran_on.get_future().get() == std::this_thread::get_id());  // io.run's thread, not the pool's

    auto values = p.map(square, std::vector<long>{4, 5}, asio::use_future);
    CHECK(values.get() == std::vector<long>{16, 25});
    auto failing = p.map(fail_on_three, std::vector<int>{1, 3}, asio::use_future);
    CHECK_THROWS_WITH_AS(failing.get(), doctest::Contains("std::domain_error: three"), std::runtime_error);
    auto nothing = p.map(fill, std::vector<storage>{storage::allocate(8)}, asio::use_future);
    nothing.get();
  }

  TEST_CASE("a map counts as work on its handler's io_context: run() returns once the handler has run") {
    // No work guard: the map's own keeps run() going, as an awaited pop's
    // does, and the handler's cancellation slot is let go of before run()
    // returns and the signal goes.
    pool p(1);
    bool ran = false;
    std::vector<long> got;
    {
      asio::io_context io;
      auto cancel = std::make_unique<asio::cancellation_signal>();
      const auto handler = [&](std::exception_ptr e, std::vector<long> v) {
        CHECK_FALSE(e);
        got = std::move(v);
        ran = true;
      };
      p.map(slow_square, std::vector<long>{2, 3},
            asio::bind_cancellation_slot(cancel->slot(), asio::bind_executor(io, handler)));
      io.run_for(std::chrono::seconds(30));
      CHECK(ran);
    }
    CHECK(got == std::vector<long>{4, 9});
    // The pool takes the next map as usual.
    CHECK(p.map(square, std::vector<long>{5}) == std::vector<long>{25});
  }

  TEST_CASE("a deferred map cancelled through its slot completes as aborted, and the next map gets only its own results") {
    asio::cancellation_signal cancel;
    pool p(2);
    std::vector<long> items(40, 3);
    auto done = map_cancelled_after(p, items, cancel, std::chrono::milliseconds(30));
    REQUIRE(done.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(test::aborted(done.get()));
    // Results of the cancelled items still arrive; none is taken for this map's.
    std::vector<long> next(20);
    std::iota(next.begin(), next.end(), 100);
    const auto squares = p.map(slow_square, next);
    for (std::size_t i = 0; i < next.size(); ++i) CHECK(squares[i] == next[i] * next[i]);
  }

  TEST_CASE("a cancelled map's items not yet taken do not run: the next map and the pool's end wait for none of them") {
    // 20 ms items on 2 workers: the 2000 queued would take 20 s to work through.
    std::vector<long> items(2000, 3);
    std::vector<long> next(2, 5);
    asio::cancellation_signal cancel, cancel_more;
    const auto started = std::chrono::steady_clock::now();
    {
      pool p(2);
      auto done = map_cancelled_after(p, items, cancel, std::chrono::milliseconds(50));
      REQUIRE(done.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
      CHECK(test::aborted(done.get()));
      const auto squares = p.map(slow_square, next);
      CHECK(squares == std::vector<long>{25, 25});
      CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(8));
      // A second cancelled map, left queued as the pool goes away.
      std::vector<long> more(2000, 4);
      (void)map_cancelled_after(p, more, cancel_more, std::chrono::milliseconds(50));
    }
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(12));
  }

  // Before, an item crossed as bytes alone, and only the map's encoded items
  // held its storages: they went as the cancelled map completed, while the
  // worker still decoded the item it had taken, and a storage the parent
  // made next could take the freed block, which the worker then wrote.
  TEST_CASE("a cancelled map's item in a worker's hand keeps its storages: storages made after the cancel stay untouched") {
    pool p(1);
    const storage marked = storage::allocate_shared(sizeof(std::int64_t));
    int overwritten = 0;
    for (int round = 0; round < 5; ++round) {
      std::memset(marked.data(), 0, marked.nbytes());
      asio::cancellation_signal cancel;
      std::promise<std::exception_ptr> outcome;
      auto done = outcome.get_future();
      {
        // The caller's copy of the written storage goes here: the map's
        // items alone hold it.
        std::vector<std::tuple<std::string, storage>> items;
        items.emplace_back(std::string(), marked);
        items.emplace_back(std::string(std::size_t{128} << 20, 'x'), storage::allocate_shared(64));
        p.map(mark_or_scribble, items,
              asio::bind_cancellation_slot(cancel.slot(), [&outcome](std::exception_ptr e) { outcome.set_value(e); }));
      }
      // Item 0 ends, and the worker takes item 1: its text takes a while to
      // decode, and the cancel comes meanwhile.
      REQUIRE(test::within(std::chrono::seconds(10), [&] { return count_of(marked) == 1; }));
      cancel.emit(asio::cancellation_type::terminal);
      REQUIRE(done.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
      CHECK(test::aborted(done.get()));
      // Storages of the written one's size, zeroed, made as the map's thread
      // lets go of its items and after: one could take a freed block.
      std::vector<storage> fresh;
      for (int i = 0; i < 12; ++i) {
        if (i % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        fresh.push_back(storage::allocate_shared(64));
        std::memset(fresh.back().data(), 0, 64);
      }
      // The next map's item runs once the item in hand has ended.
      CHECK(p.map(square, std::vector<long>{3}) == std::vector<long>{9});
      for (const auto& s : fresh) {
        if (std::to_integer<int>(s.data()[0]) == 0xAB) ++overwritten;
      }
    }
    CHECK(overwritten == 0);
  }

  TEST_CASE("a map that fails on a result it cannot receive leaves its items not yet taken unrun") {
    const storage ran = storage::allocate_shared(sizeof(std::int64_t));
    std::memset(ran.data(), 0, ran.nbytes());
    std::vector<std::tuple<int, storage>> items;
    for (int i = 0; i < 20; ++i) items.emplace_back(i, ran);
    pool p(1);
    CHECK_THROWS_AS((void)p.map(unopenable_first, items), shm_error);
    // The next map's item runs after the one in hand (item 1) at most: the
    // 18 others, 1.8 s of work, were taken back.
    const std::vector<long> next{6};
    CHECK(p.map(square, next) == std::vector<long>{36});
    CHECK(std::atomic_ref(*reinterpret_cast<std::int64_t*>(ran.data())).load() <= 2);
  }

  // Before, results nobody would read filled the queue, a worker blocked
  // putting its own, and the pool's end waited for that worker for good.
  TEST_CASE("a pool ends though the results of its cancelled map's items in hand fill the results queue") {
    asio::cancellation_signal cancel;
    const auto started = std::chrono::steady_clock::now();
    {
      pool p(8);
      // Each worker takes an item of 2 s; the cancel comes once all 8 run,
      // and their 8 results (240 kB) find no reader.
      const storage taken = storage::allocate_shared(sizeof(std::int64_t));
      std::memset(taken.data(), 0, sizeof(std::int64_t));
      const auto count = [&taken] { return std::atomic_ref(*reinterpret_cast<std::int64_t*>(taken.data())).load(); };
      std::promise<std::exception_ptr> outcome;
      auto done = outcome.get_future();
      p.map(slow_text, std::vector<storage>(100, taken),
            asio::bind_cancellation_slot(cancel.slot(), [&outcome](std::exception_ptr e, std::vector<std::string>) {
              outcome.set_value(e);
            }));
      REQUIRE(test::within(std::chrono::seconds(30), [&] { return count() >= 8; }));
      cancel.emit(asio::cancellation_type::terminal);
      REQUIRE(done.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
      CHECK(test::aborted(done.get()));
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the items in hand end
    }
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(40));
  }

  TEST_CASE("a map cancelled while it waits behind another completes at once as aborted") {
    pool p(1);
    // 100 items of 20 ms: the map ahead holds the pool for 2 s.
    std::thread ahead([&p] { p.map(slow_square, std::vector<long>(100, 1)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    asio::cancellation_signal cancel;
    auto done = map_cancelled_after(p, std::vector<long>{2}, cancel, std::chrono::milliseconds(50));
    const bool soon = done.wait_for(std::chrono::seconds(1)) == std::future_status::ready;
    CHECK(soon);
    ahead.join();
    CHECK(test::aborted(done.get()));
  }

  // Before, the thread that fails a cancelled waiting map ran a future's or
  // a callback's handler there and then, and cleared the slot first: it
  // destroyed the slot's handler while the signal, on this thread, still
  // ran it, a use after free that crashed now and then.
  TEST_CASE("maps cancelled while they wait complete as aborted, again and again, under a future or a callback") {
    pool p(1);
    // 1000 items of 20 ms: the map ahead holds the pool for 20 s, until cancelled.
    asio::cancellation_signal cancel_ahead;
    auto ahead = p.map(slow_square, std::vector<long>(1000, 1),
                       asio::bind_cancellation_slot(cancel_ahead.slot(), asio::use_future));
    const std::vector<long> items{2, 3};
    int futures_aborted = 0;
    for (int i = 0; i < 500; ++i) {
      // A signal of its own each time, gone once its map has completed.
      auto cancel = std::make_unique<asio::cancellation_signal>();
      auto done = p.map(square, items, asio::bind_cancellation_slot(cancel->slot(), asio::use_future));
      cancel->emit(asio::cancellation_type::terminal);
      REQUIRE(done.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
      try {
        (void)done.get();
      } catch (const std::system_error& e) {
        if (e.code() == std::error_code(asio::error::operation_aborted)) ++futures_aborted;
      }
    }
    CHECK(futures_aborted == 500);
    int callbacks_aborted = 0;
    for (int i = 0; i < 500; ++i) {
      auto cancel = std::make_unique<asio::cancellation_signal>();
      std::promise<std::exception_ptr> outcome;
      auto done = outcome.get_future();
      p.map(square, items, asio::bind_cancellation_slot(cancel->slot(), [&outcome](std::exception_ptr e, std::vector<long>) {
              outcome.set_value(e);
            }));
      cancel->emit(asio::cancellation_type::terminal);
      REQUIRE(done.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
      if (test::aborted(done.get())) ++callbacks_aborted;
    }
    CHECK(callbacks_aborted == 500);
    // The map ahead ran all along; cancelled, it ends too, and the pool goes on.
    REQUIRE(ahead.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
    cancel_ahead.emit(asio::cancellation_type::terminal);
    REQUIRE(ahead.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK_THROWS_AS((void)ahead.get(), std::system_error);
    CHECK(p.map(square, std::vector<long>{5}) == std::vector<long>{25});
  }

  // Before, the map's thread handed the handler to the destroyed
  // io_context's scheduler: a use after free, which crashed.
  TEST_CASE("destroying the io_context of a map in flight destroys its handler uncalled, and the pool goes on") {
    pool p(2);
    const storage ran = storage::allocate_shared(sizeof(std::int64_t));
    // 100 items of 20 ms on 2 workers: 1 s of work, the io_context goes after 100 ms.
    const auto items = counted_items(ran, 100);
    auto alive = std::make_shared<int>(0);
    bool called = false;
    auto io = std::make_unique<asio::io_context>();
    p.map(counted_square, items,
          asio::bind_executor(*io, [&called, held = tracked(alive)](std::exception_ptr, std::vector<long>) {
            called = true;
          }));
    CHECK(*alive == 1);
    io->run_for(std::chrono::milliseconds(100));
    io.reset();
    CHECK(*alive == 0);  // destroyed with the io_context, as asio destroys its own operations' handlers
    // The map was cancelled with it: the next map's items do not wait behind
    // its items not taken, which do not run.
    const std::vector<long> next{7};
    CHECK(p.map(square, next) == std::vector<long>{49});
    CHECK(count_of(ran) < 100);
    CHECK_FALSE(called);
  }

  TEST_CASE("destroying the io_context of a coroutine awaiting a map destroys the coroutine, and the pool goes on") {
    pool p(2);
    const storage ran = storage::allocate_shared(sizeof(std::int64_t));
    const auto items = counted_items(ran, 100);
    auto alive = std::make_shared<int>(0);
    bool resumed = false;
    auto io = std::make_unique<asio::io_context>();
    asio::co_spawn(*io, [&]() -> asio::awaitable<void> {
      const tracked local(alive);  // in the coroutine's frame
      (void)co_await p.map(counted_square, items, asio::use_awaitable);
      resumed = true;
    }, asio::detached);
    io->run_for(std::chrono::milliseconds(100));
    CHECK(*alive == 1);
    io.reset();
    CHECK(*alive == 0);
    const std::vector<long> next{8};
    CHECK(p.map(square, next) == std::vector<long>{64});
    CHECK_FALSE(resumed);
  }

  TEST_CASE("a map completes on a thread_pool's executor or a strand; ending the thread_pool first drops it") {
    pool p(2);
    asio::thread_pool threads(1);
    const std::vector<long> items{1, 2, 3};
    auto on_pool = p.map(square, items, asio::bind_executor(threads, asio::use_future));
    CHECK(on_pool.get() == std::vector<long>{1, 4, 9});
    auto strand = asio::make_strand(threads);
    std::promise<bool> in_strand;
    auto was_in_strand = in_strand.get_future();
    p.map(square, items, asio::bind_executor(strand, [&](std::exception_ptr e, std::vector<long> v) {
      CHECK_FALSE(e);
      CHECK(v == std::vector<long>{1, 4, 9});
      in_strand.set_value(strand.running_in_this_thread());
    }));
    REQUIRE(was_in_strand.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    CHECK(was_in_strand.get());

    const storage ran = storage::allocate_shared(sizeof(std::int64_t));
    const auto slow = counted_items(ran, 100);
    auto alive = std::make_shared<int>(0);
    bool called = false;
    {
      asio::thread_pool ending(1);
      p.map(counted_square, slow,
            asio::bind_executor(ending, [&called, held = tracked(alive)](std::exception_ptr, std::vector<long>) {
              called = true;
            }));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ending.stop();
    }
    CHECK(*alive == 0);
    const std::vector<long> next{9};
    CHECK(p.map(square, next) == std::vector<long>{81});
    CHECK_FALSE(called);
  }

  // Before, a strand made after the first map on its io_context shut down
  // before the pool's watch: a map ending in between had its handler
  // destroyed on the map's thread, while the strand's own were destroyed.
  TEST_CASE("a strand's map in flight as its io_context goes is destroyed on the thread destroying it") {
    pool p(2);
    auto io = std::make_unique<asio::io_context>();
    const std::vector<long> one{1};
    bool first_done = false;
    p.map(square, one, asio::bind_executor(*io, [&](std::exception_ptr, std::vector<long>) { first_done = true; }));
    io->run_for(std::chrono::seconds(30));
    REQUIRE(first_done);
    io->restart();
    // Queued on the strand, never run: its end holds the strand's shutdown
    // for 600 ms, while the map below ends.
    struct slow_end {
      bool live = true;
      slow_end() = default;
      slow_end(slow_end&& other) noexcept { other.live = false; }
      ~slow_end() {
        if (live) std::this_thread::sleep_for(std::chrono::milliseconds(600));
      }
    };
    const storage ran = storage::allocate_shared(sizeof(std::int64_t));
    const auto items = counted_items(ran, 20);  // 200 ms of work on 2 workers
    std::mutex mutex;
    std::optional<std::thread::id> ended_on;
    std::shared_ptr<void> marker(nullptr, [&](void*) {  // runs as the handler's last copy goes
      std::lock_guard lock(mutex);
      ended_on = std::this_thread::get_id();
    });
    bool called = false;
    {
      // Gone before the io_context: a strand must not outlive its service.
      auto strand = asio::make_strand(*io);
      asio::post(strand, [held = slow_end{}] {});
      auto handler = [&called, marker = std::move(marker)](std::exception_ptr, std::vector<long>) { called = true; };
      p.map(counted_square, items, asio::bind_executor(strand, std::move(handler)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    io.reset();
    std::lock_guard lock(mutex);
    REQUIRE(ended_on.has_value());
    CHECK(*ended_on == std::this_thread::get_id());
    CHECK_FALSE(called);
  }

  // Before, a map whose thread could not be started kept the turn: every
  // map made after it waited until the pool's end.
  TEST_CASE("a map whose thread cannot be started fails as it is made, and the maps after it run") {
    pool p(2);
    const std::vector<long> items{3};
    // Threads alive meanwhile take the stacks that ended threads left for
    // reuse, so that the map's thread needs a stack of its own.
    std::promise<void> release;
    const std::shared_future<void> released = release.get_future().share();
    std::vector<std::thread> holders;
    for (int i = 0; i < 16; ++i) holders.emplace_back([released] { released.wait(); });
    rlimit usual{};
    REQUIRE(::getrlimit(RLIMIT_AS, &usual) == 0);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    rlimit tight = usual;  // what the process maps now and 1 MiB more: no room for a thread's stack
    tight.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (1 << 20);
    REQUIRE(::setrlimit(RLIMIT_AS, &tight) == 0);
    bool threw = false;
    try {
      p.map(square, items, [](std::exception_ptr, std::vector<long>) {});
    } catch (const std::system_error&) {
      threw = true;
    }
    REQUIRE(::setrlimit(RLIMIT_AS, &usual) == 0);
    release.set_value();
    for (auto& holder : holders) holder.join();
    if (!threw) {
      // The thread took a stack an ended thread left for reuse: nothing to check.
      MESSAGE("a thread started within the limit (a stack reused): not checked");
      return;
    }
    auto next = p.map(square, items, asio::use_future);
    REQUIRE(next.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    CHECK(next.get() == std::vector<long>{9});
  }

  // Before, each map waited on a thread of its own for a lock taken in no
  // order: later maps overtook earlier ones, and 500 maps held 500 threads.
  TEST_CASE("maps run in the order they were made, and the maps waiting their turn hold no thread") {
    pool p(2);
    const long before = thread_count();
    constexpr int maps = 200;
    asio::io_context io;
    auto work = asio::make_work_guard(io);
    std::vector<int> order;
    for (int i = 0; i < maps; ++i) {
      const std::vector<long> items{i};
      p.map(square, items, asio::bind_executor(io, [&, i](std::exception_ptr e, std::vector<long> v) {
        CHECK_FALSE(e);
        CHECK(v == std::vector<long>{static_cast<long>(i) * i});
        order.push_back(i);
        if (order.size() == maps) work.reset();
      }));
    }
    const long issued = thread_count();
    io.run_for(std::chrono::seconds(60));
    // The handlers reach io, and run on its one thread, in the maps' order.
    std::vector<int> made(maps);
    std::iota(made.begin(), made.end(), 0);
    CHECK(order == made);
    CHECK(issued - before <= 10);
  }

  TEST_CASE("a blocking map waits its turn behind the asynchronous maps made before it") {
    pool p(1);
    const storage ran = storage::allocate_shared(sizeof(std::int64_t));
    const auto items = counted_items(ran, 10);
    std::vector<std::future<std::vector<long>>> earlier;
    for (int i = 0; i < 5; ++i) earlier.push_back(p.map(counted_square, items, asio::use_future));
    const std::vector<long> mine{4};
    CHECK(p.map(square, mine) == std::vector<long>{16});
    // Every earlier map had all its items worked through before this one ran.
    CHECK(count_of(ran) == 50);
    for (auto& map : earlier) CHECK(map.get() == std::vector<long>(10, 9));
  }

  TEST_CASE("maps waiting behind the one the pool's end cut short fail as that one does, not as a worker's death") {
    // At once, the maps' threads may not have begun yet; or once the first runs.
    for (const auto wait : {std::chrono::milliseconds(0), std::chrono::milliseconds(100)}) {
      CAPTURE(wait.count());
      std::vector<std::future<std::vector<long>>> maps;
      {
        pool p(1);
        for (int i = 0; i < 3; ++i) maps.push_back(p.map(slow_square, std::vector<long>(50, i), asio::use_future));
        std::this_thread::sleep_for(wait);
      }
      for (auto& m : maps) {
        CHECK_THROWS_WITH_AS(m.get(), doctest::Contains("the pool was destroyed before"), std::logic_error);
      }
    }
  }

  TEST_CASE("a handler that drops the pool's last reference ends the pool there, workers and all") {
    auto p = std::make_shared<pool>(2);
    std::promise<std::vector<int>> pids;
    auto seen = pids.get_future();
    const std::vector<int> items{0, 1, 2, 3};
    pool& held = *p;
    // The handler has no executor: it runs on the pool's thread, and holds
    // the only reference.
    held.map(worker_pid, items, [&pids, last = std::move(p)](std::exception_ptr e, std::vector<int> values) mutable {
      CHECK_FALSE(static_cast<bool>(e));
      last.reset();  // ~pool, on the pool's own thread
      pids.set_value(std::move(values));
    });
    REQUIRE(seen.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    const auto workers = seen.get();
    REQUIRE(workers.size() == 4);
    const auto ended = [&] { return std::none_of(workers.begin(), workers.end(), [](int pid) { return test::alive(pid); }); };
    CHECK(test::within(std::chrono::seconds(10), ended));
  }

  TEST_CASE("a map a handler starts while the pool is ending fails at once with std::logic_error") {
    std::promise<std::string> first, second;
    auto said = second.get_future();
    auto first_said = first.get_future();
    {
      pool p(1);
      const std::vector<long> items(50, 2);  // 1 s of work: the pool's end comes first
      p.map(slow_square, items, [&p, &first, &second](std::exception_ptr cut, std::vector<long>) {
        try {
          if (cut) std::rethrow_exception(cut);
          first.set_value("completed");
        } catch (const std::exception& error) {
          first.set_value(error.what());
        }
        const std::vector<long> more{3};
        p.map(square, more, [&second](std::exception_ptr e, std::vector<long>) {
          try {
            if (e) std::rethrow_exception(e);
            second.set_value("completed");
          } catch (const std::logic_error& error) {
            second.set_value(error.what());
          } catch (...) {
            second.set_value("another exception");
          }
        });
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }  // ~pool: the first map ends (its items taken back), and its handler starts the second
    REQUIRE(said.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(said.get() == "cohort::pool: map while the pool is ending");
    // The map the end cut short says so.
    REQUIRE(first_said.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(first_said.get() == "cohort::pool: the pool was destroyed before the map's items were all worked through");
  }

  TEST_CASE("terminate() ends workers stuck in their items: the running blocking map and the maps behind it fail as terminated") {
    std::optional<pool> p(std::in_place, 2);
    const storage pids = storage::allocate_shared(2 * sizeof(std::int64_t));
    const auto items = forever_items(pids);
    std::promise<std::string> blocking_said;
    auto blocking = blocking_said.get_future();
    std::thread mapper([&] {
      try {
        p->map(sleep_forever, items);
        blocking_said.set_value("completed");
      } catch (const std::logic_error& error) {
        blocking_said.set_value(error.what());
      } catch (...) {
        blocking_said.set_value("another exception");
      }
    });
    const auto workers = stuck_workers(pids);
    // Behind the blocking map: a future's and a callback's, waiting their turn.
    const std::vector<long> two{2};
    auto future = p->map(square, two, asio::use_future);
    std::promise<std::string> callback_said;
    auto callback = callback_said.get_future();
    p->map(square, two, said_into<std::vector<long>>(callback_said));

    std::thread terminator([&] { p->terminate(); });
    terminator.join();
    // Asynchronous maps have completed as terminate() returns.
    REQUIRE(future.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
    CHECK_THROWS_WITH_AS(future.get(), doctest::Contains("the pool was terminated"), std::logic_error);
    REQUIRE(callback.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
    CHECK(callback.get().find("the pool was terminated") != std::string::npos);
    REQUIRE(blocking.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(blocking.get().find("the pool was terminated") != std::string::npos);
    mapper.join();
    for (const pid_t worker : workers) CHECK(reaped(worker));

    // Later maps, blocking and asynchronous, are refused.
    CHECK_THROWS_WITH_AS(p->map(square, two), doctest::Contains("the pool was terminated"), std::logic_error);
    CHECK_THROWS_WITH_AS(p->map(square, two, asio::use_future).get(), doctest::Contains("the pool was terminated"),
                         std::logic_error);
    const auto before = std::chrono::steady_clock::now();
    p.reset();
    CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(5));
  }

  TEST_CASE("terminate() completes an awaited map in hand and a blocking map waiting behind it") {
    for (const auto method : methods) {
      CAPTURE(method);
      pool_options options;
      options.method = method;
      std::optional<pool> p(std::in_place, 2, options);
      const storage pids = storage::allocate_shared(2 * sizeof(std::int64_t));
      const auto items = forever_items(pids);
      asio::io_context io;
      std::promise<std::string> awaited_said;
      auto awaited = awaited_said.get_future();
      asio::co_spawn(io, [&]() -> asio::awaitable<void> {
        try {
          co_await p->map(sleep_forever, items, asio::use_awaitable);
          awaited_said.set_value("completed");
        } catch (const std::logic_error& error) {
          awaited_said.set_value(error.what());
        } catch (...) {
          awaited_said.set_value("another exception");
        }
      }, asio::detached);
      std::thread runner([&] { io.run(); });
      const auto workers = stuck_workers(pids);
      std::promise<std::string> blocking_said;
      auto blocking = blocking_said.get_future();
      std::thread mapper([&] {
        try {
          const std::vector<long> two{2};
          p->map(square, two);
          blocking_said.set_value("completed");
        } catch (const std::logic_error& error) {
          blocking_said.set_value(error.what());
        } catch (...) {
          blocking_said.set_value("another exception");
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the blocking map waits its turn, likely
      p->terminate();
      REQUIRE(awaited.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
      CHECK(awaited.get().find("the pool was terminated") != std::string::npos);
      REQUIRE(blocking.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
      CHECK(blocking.get().find("the pool was terminated") != std::string::npos);
      runner.join();
      mapper.join();
      for (const pid_t worker : workers) CHECK(reaped(worker));
      const auto before = std::chrono::steady_clock::now();
      p.reset();
      CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(5));
    }
  }

  TEST_CASE("terminate() on an idle pool ends its workers and its threads, and a second call changes nothing") {
    const std::vector<long> items{1, 2, 3};
    {
      // The threads a first pool starts for the whole process stay: the
      // launch threads, and the watcher of peers' deaths, which a map that
      // waits for its results starts.
      pool first(2);
      CHECK(first.map(slow_square, items) == std::vector<long>{1, 4, 9});
    }
    const auto children_before = test::children_of_self();
    const long threads_before = thread_count();
    // Watchers of the shared memory come and go on their own schedule: the
    // pool's threads are those that would stay.
    const auto threads_back = [&] { return thread_count() <= threads_before; };
    std::optional<pool> p(std::in_place, 2);
    CHECK(p->map(square, items) == std::vector<long>{1, 4, 9});
    std::vector<pid_t> workers;
    for (const pid_t child : test::children_of_self()) {
      if (std::find(children_before.begin(), children_before.end(), child) == children_before.end()) {
        workers.push_back(child);
      }
    }
    CHECK(workers.size() == 2);
    p->terminate();
    for (const pid_t worker : workers) CHECK(reaped(worker));
    CHECK(test::within(std::chrono::seconds(10), threads_back));
    p->terminate();
    CHECK_THROWS_WITH_AS(p->map(square, items), doctest::Contains("the pool was terminated"), std::logic_error);
    p.reset();
    CHECK(test::within(std::chrono::seconds(10), threads_back));
  }

  TEST_CASE("terminate() on a pool moved from does nothing") {
    pool p(1);
    pool q(std::move(p));
    p.terminate();  // NOLINT(bugprone-use-after-move): what is tested
    const std::vector<long> items{3};
    CHECK(q.map(square, items) == std::vector<long>{9});
  }
}

}  // namespace pool_tests
