#include "cohort/queue.hpp"

#include "cohort/event.hpp"
#include "cohort/spawn_and_join.hpp"
#include "queue/peers.hpp"
#include "os/futex.hpp"
#include "os/process_identity.hpp"

#include "support/harness.hpp"
#include "support/join_by.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/parallel_group.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_future.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/single_threaded.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;

// A value whose handle counts, as a device tensor's does, each message it
// is written for, and sets what undoes the count if that message is not
// sent after all.
struct counted_send {
  static inline int in_flight = 0;
};
template <>
struct cohort::detail::handle_codec<counted_send> {
  static std::string signature() { return "counted_send"; }
  static std::size_t size_bound(const counted_send&) noexcept { return 1; }
  static void write(std::vector<std::byte>& out, const counted_send&) {
    out.push_back(std::byte{1});
    if (current_handles == nullptr || !current_handles->message) return;
    ++counted_send::in_flight;
    current_handles->if_unsent.emplace_back([] { --counted_send::in_flight; });
  }
  static counted_send read(reader& in) {
    (void)in.next();
    --counted_send::in_flight;  // received
    return {};
  }
};

namespace queue_tests {

const sharing_strategy strategies[] = {sharing_strategy::file_descriptor, sharing_strategy::file_system};
const start_method methods[] = {start_method::spawn, start_method::fork, start_method::forkserver};

// Pops `n` storages, adds `rank + 1` to the first byte of each, and pushes
// them back.
void add_rank(int rank, queue<storage> in, queue<storage> out, int n) {
  for (int i = 0; i < n; ++i) {
    storage s = in.get().value();
    s.data()[0] = std::byte(std::to_integer<int>(s.data()[0]) + rank + 1);
    out.put(s);
  }
}
COHORT_ENTRYPOINT(add_rank);

void push_one_and_leave(int, queue<int> q) { q.put(7); }
COHORT_ENTRYPOINT(push_one_and_leave);

void pop_one_and_leave(int, queue<int> q) { (void)q.get(); }
COHORT_ENTRYPOINT(pop_one_and_leave);

// Under 64 descriptors, pops `n` storages and returns the sum of their first bytes.
int sum_under_fd_limit(int, queue<storage> q, int n) {
  rlimit limit{64, 64};
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  int sum = 0;
  for (int i = 0; i < n; ++i) sum += std::to_integer<int>(q.get().value().data()[0]);
  return sum;
}
COHORT_ENTRYPOINT(sum_under_fd_limit);

// Ranks below `producers` push (rank, i) for i < each, with a string of a
// length that varies with i, then (rank, -1); the others pop until they
// take a -1 and return the (producer, i) they took, in order. A string of
// the wrong length comes back as (producer, -2). A rank counts as a
// producer or consumer of `q` only once it has pushed or popped (see
// peer_lost): each first tries one push or pop, and none goes on until all
// have (through `ready` and `go`), or a rank slow to start could find the
// other side's ranks so far all done and exited, and end with peer_lost.
std::vector<std::pair<int, int>> producer_or_consumer(int rank, queue<std::tuple<int, int, std::string>> q, int producers,
                                                      int each, queue<int> ready, event go) {
  const auto length = [](int i) { return static_cast<std::size_t>(i * 37 % 700); };
  const auto value = [&](int i) { return std::tuple<int, int, std::string>{rank, i, std::string(length(i), 'v')}; };
  std::vector<std::pair<int, int>> taken;
  int from = 0;
  std::optional<std::tuple<int, int, std::string>> first;
  if (rank < producers) {
    if (q.try_push(value(0))) from = 1;
  } else {
    first = q.try_pop();
  }
  ready.put(rank);
  if (rank == 0) {
    for (std::size_t r = 0; r < ready.capacity(); ++r) (void)ready.get();
    go.set();
  }
  go.wait_for();
  if (rank < producers) {
    for (int i = from; i < each; ++i) q.put(value(i));
    const std::tuple<int, int, std::string> last{rank, -1, ""};
    q.put(last);
    return taken;
  }
  for (;;) {
    auto [producer, i, text] = first ? *std::exchange(first, std::nullopt) : q.get().value();
    if (i < 0) return taken;
    taken.emplace_back(producer, text.size() == length(i) ? i : -2);
  }
}
COHORT_ENTRYPOINT(producer_or_consumer);

void set_after_wait(int, event go, event done) {
  go.wait_for();
  done.set();
}
COHORT_ENTRYPOINT(set_after_wait);

// The threads of this process now.
std::ptrdiff_t threads_now() { return std::distance(std::filesystem::directory_iterator("/proc/self/task"), {}); }

// The waits counted asleep on one side (`which`: first for pops, second
// for pushes) when a count is first seen above 0, within 10 s; 0 if none.
// One read: a wait that sleeps in slices stops counting between them, so
// a second read may find it between two.
std::uint32_t first_counted_asleep(const detail::queue_core& core,
                                   std::uint32_t std::pair<std::uint32_t, std::uint32_t>::*which) {
  for (int i = 0; i < 10000; ++i) {
    if (const auto n = detail::queue_sleepers(core).*which; n > 0) return n;
    std::this_thread::sleep_for(1ms);
  }
  return 0;
}

// In a rank of its own, started single-threaded: arms this process's death
// notice with a child that ends 300 ms later, and sleeps on the notice's
// epoch (only its watcher moves it, and only its wake ends the sleep before
// 20 s). Returns bits: 1 libc still counted the rank single-threaded after
// the watcher started, 2 the watcher was there beside the rank's thread,
// 4 the sleep was woken with the epoch moved; -1 when the rank did not
// start single-threaded, -2 when its ids could not be changed. With
// `mixed_ids`, the rank (root) first takes another real user id than its
// effective one: a bare thread would keep ids libc's setuid could not
// change, so the notice falls back to a std::thread.
int watch_a_death(int, bool mixed_ids) {
  if (!__libc_single_threaded) return -1;
  if (mixed_ids && ::setresuid(65534, 0, 0) != 0) return -2;
  const pid_t child = ::fork();
  if (child == 0) {
    ::usleep(300'000);
    ::_exit(0);
  }
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
  auto& notice = detail::death_notice::of_this_process();
  const auto seen = notice.epoch().load(std::memory_order_acquire);
  notice.arm(pidfd);
  int result = __libc_single_threaded ? 1 : 0;
  const auto tasks = std::distance(std::filesystem::directory_iterator("/proc/self/task"), {});
  if (tasks == 2) result |= 2;
  std::error_code ec;
  auto woke = os::futex_result::interrupted;
  while (woke == os::futex_result::interrupted && notice.epoch().load(std::memory_order_acquire) == seen) {
    woke = os::futex_wait(notice.epoch(), seen, 20s, ec);
  }
  if (woke != os::futex_result::timed_out && notice.epoch().load(std::memory_order_acquire) != seen) result |= 4;
  ::waitpid(child, nullptr, 0);
  ::close(pidfd);
  return result;
}
COHORT_ENTRYPOINT(watch_a_death);

// On `q`, of capacity 1 and empty: get(`get_timeout`) waits for the value
// another thread puts 150 ms later, and put(`put_timeout`) on the full queue
// for the room another thread makes 150 ms later. Leaves `q` holding 2.
template <class GetTimeout, class PutTimeout>
void check_waits_for_the_other_side(queue<int>& q, GetTimeout get_timeout, PutTimeout put_timeout) {
  std::thread pusher([&] {
    std::this_thread::sleep_for(150ms);
    q.put(7);
  });
  CHECK(q.get(get_timeout) == 7);
  pusher.join();
  q.put(1);
  std::thread popper([&] {
    std::this_thread::sleep_for(150ms);
    CHECK(q.get() == 1);
  });
  CHECK(q.put(2, put_timeout));
  popper.join();
}

// RssAnon in /proc/self/status: this process's anonymous memory in RAM, in KiB.
long anonymous_kib() {
  const auto kib = test::status_field(::getpid(), "RssAnon");
  return kib ? std::stol(*kib) : -1;
}

TEST_SUITE("queue") {
  // Before, what a handle counted for a message stayed counted when the push
  // failed: a device tensor's note and event slot then waited for good for
  // a receiver that would never come.
  TEST_CASE("a failed push undoes what its handles counted for the message; one that succeeds keeps it") {
    counted_send::in_flight = 0;
    queue<counted_send> q(1);
    REQUIRE(q.put(counted_send{}, 1s));
    CHECK(counted_send::in_flight == 1);
    CHECK_FALSE(q.try_push(counted_send{}));  // full
    CHECK_FALSE(q.put(counted_send{}, 10ms));  // timed out
    CHECK(counted_send::in_flight == 1);
    asio::io_context io;
    asio::cancellation_signal cancel;
    const counted_send value;
    bool aborted = false;
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      try {
        co_await q.push(value, asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
      } catch (const std::system_error& e) {
        aborted = e.code() == asio::error::operation_aborted;
      }
    }, asio::detached);
    io.run_for(20ms);
    cancel.emit(asio::cancellation_type::terminal);
    io.run();
    CHECK(aborted);
    CHECK(counted_send::in_flight == 1);
    CHECK(q.get(1s).has_value());
    CHECK(counted_send::in_flight == 0);
    q.close();
    CHECK_THROWS_AS(q.put(counted_send{}), queue_closed);
    CHECK(counted_send::in_flight == 0);
  }

  TEST_CASE("a capacity of 0 or over 2^24 is refused, saying why; 1 is taken") {
    CHECK_THROWS_WITH_AS(queue<int>(0), doctest::Contains("bounded"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(queue<int>((std::size_t{1} << 24) + 1), doctest::Contains("2^24"), std::invalid_argument);
    CHECK(queue<int>(1).capacity() == 1);
  }

  // Before, asio's bare "epoll: Too many open files" (or its eventfd's),
  // naming neither the wait nor the limit.
  TEST_CASE("an awaited pop or event wait with no descriptor left for the reactor names itself and the limit") {
    queue<int> q(2);
    event e;
    asio::io_context io;  // fresh: no reactor yet
    std::string pop_error, wait_error;
    const auto waits = [&]() -> asio::awaitable<void> {
      try {
        (void)co_await q.pop();
      } catch (const std::system_error& error) {
        pop_error = error.what();
      }
      try {
        co_await e.wait();
      } catch (const std::system_error& error) {
        wait_error = error.what();
      }
    };
    {
      const test::descriptors_left none(0);
      asio::co_spawn(io, waits(), asio::detached);
      io.run();
    }
    const auto expected = [](const std::string& what) {
      return what + ": bringing up asio's reactor for the io_context (open file limit RLIMIT_NOFILE is ";
    };
    CHECK(pop_error.starts_with(expected("cohort::queue::pop")));
    CHECK(wait_error.starts_with(expected("cohort::event::wait")));
    CHECK(pop_error.ends_with(std::string("): ") + std::strerror(EMFILE)));
    CHECK(wait_error.ends_with(std::string("): ") + std::strerror(EMFILE)));
  }

  TEST_CASE("values come out in the order they went in") {
    queue<std::tuple<int, std::string, std::vector<double>>> q(8);
    for (int i = 0; i < 5; ++i) REQUIRE(q.try_push({i, std::string(i, 'x'), std::vector<double>(i, 0.5)}));
    CHECK(q.size() == 5);
    for (int i = 0; i < 5; ++i) {
      auto [n, s, v] = q.try_pop().value();
      CHECK(n == i);
      CHECK(s == std::string(i, 'x'));
      CHECK(v == std::vector<double>(i, 0.5));
    }
    CHECK_FALSE(q.try_pop());
  }

  TEST_CASE("a full queue refuses try_push and an empty one try_pop, across many wraps of the ring") {
    queue<std::string> q(3);
    for (int round = 0; round < 2000; ++round) {
      const std::string big(round % 700, char('a' + round % 26));
      REQUIRE(q.try_push(big));
      REQUIRE(q.try_push("x"));
      REQUIRE(q.try_push(""));
      CHECK_FALSE(q.try_push("one too many"));
      CHECK(q.try_pop() == big);
      CHECK(q.try_pop() == "x");
      CHECK(q.try_pop() == "");
      CHECK_FALSE(q.try_pop());
    }
  }

  TEST_CASE("a record whose end names handles outside its value, or out of order, is refused") {
    detail::queue_record r;
    detail::fill_record(r, std::string(200, 'a'));
    REQUIRE(detail::read_record<std::string>(r.bytes) == std::string(200, 'a'));
    const auto with_end = [&](std::vector<std::uint32_t> places) {
      auto bytes = r.bytes;
      bytes.resize(bytes.size() - 4);  // no handles: the count alone
      const auto count = static_cast<std::uint32_t>(places.size());
      places.push_back(count);
      const auto* raw = reinterpret_cast<const std::byte*>(places.data());
      bytes.insert(bytes.end(), raw, raw + places.size() * 4);
      return bytes;
    };
    CHECK_THROWS_AS(detail::read_record<std::string>(with_end({190})), decode_error);     // past the value's end
    CHECK_THROWS_AS(detail::read_record<std::string>(with_end({100, 60})), decode_error); // overlapping
    auto huge = r.bytes;
    const std::uint32_t count = 0xffffffffU;
    std::memcpy(huge.data() + huge.size() - 4, &count, 4);
    CHECK_THROWS_AS(detail::read_record<std::string>(huge), decode_error);
    CHECK_THROWS_AS(detail::read_record<std::string>(std::vector<std::byte>(3)), decode_error);
  }

  TEST_CASE("counts and places that wrap past 2^32 keep the values in order, the size right and the capacity whole") {
    // Head and tail hold how many values and cache lines each side has
    // moved, mod 2^32: a queue that lives long wraps them.
    const auto core = detail::make_queue_core(3, type_signature<std::string>());
    detail::queue_skip_ahead(*core, 0xffffffffU - 4, 0xffffffffU - 40);
    detail::queue_record r;
    std::vector<std::byte> out;
    for (int round = 0; round < 600; ++round) {
      const std::string values[] = {std::string(round * 7 % 900, char('a' + round % 26)), "x", ""};
      for (const auto& v : values) {
        detail::fill_record(r, v);
        REQUIRE(detail::queue_try_push(*core, r));
      }
      CHECK(detail::queue_size(*core) == 3);
      detail::fill_record(r, std::string("one too many"));
      CHECK_FALSE(detail::queue_try_push(*core, r));
      for (const auto& v : values) {
        REQUIRE(detail::queue_try_pop(*core, out));
        CHECK(detail::read_record<std::string>(out) == v);
      }
      CHECK(detail::queue_size(*core) == 0);
      CHECK_FALSE(detail::queue_try_pop(*core, out));
    }
    detail::fill_record(r, std::string("left"));
    REQUIRE(detail::queue_try_push(*core, r));
    CHECK_THROWS_AS(detail::queue_skip_ahead(*core, 0, 0), std::logic_error);
  }

  TEST_CASE("values from three producer ranks reach three consumer ranks once each, in each producer's order") {
    // Pushes and pops take locks of their own: producers and consumers in
    // other processes run through a small queue at once, its ring wrapping.
    constexpr int producers = 3, consumers = 3, each = 2000;
    queue<std::tuple<int, int, std::string>> q(4);
    const auto args = std::tuple{q, producers, each, queue<int>(producers + consumers), event()};
    const auto taken = spawn_and_join(producer_or_consumer, args, producers + consumers);
    std::vector<std::vector<int>> seen(producers);
    for (int c = producers; c < producers + consumers; ++c) {
      std::vector<int> last(producers, -1);
      for (const auto& [producer, i] : taken.at(static_cast<std::size_t>(c))) {
        REQUIRE(producer >= 0);
        REQUIRE(producer < producers);
        CHECK(i > last[static_cast<std::size_t>(producer)]);  // -2: its string arrived with the wrong length
        last[static_cast<std::size_t>(producer)] = i;
        seen[static_cast<std::size_t>(producer)].push_back(i);
      }
    }
    for (auto& values : seen) {
      std::sort(values.begin(), values.end());
      std::vector<int> all(each);
      std::iota(all.begin(), all.end(), 0);
      CHECK(values == all);
    }
    CHECK(q.size() == 0);
  }

  TEST_CASE("a closed queue refuses pushes and is drained before pops are refused") {
    queue<int> q(4);
    q.put(1);
    q.close();
    CHECK(q.closed());
    CHECK_THROWS_AS(q.put(2), queue_closed);
    CHECK(q.get() == 1);
    CHECK_THROWS_AS(q.get(), queue_closed);
  }

  TEST_CASE("a value larger than a quarter of the ring travels in a block of its own") {
    queue<std::vector<std::byte>> q(2);
    std::vector<std::byte> big(3 << 20);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = std::byte(i * 7);
    for (int i = 0; i < 5; ++i) {
      REQUIRE(q.try_push(big));
      CHECK(q.try_pop() == big);
    }
  }

  // Before, the thread's buffers for encoding a value and for copying one
  // out of its block kept their size: 128 MiB here, for good.
  TEST_CASE("a thread keeps no buffer as large as the largest value it pushed and popped") {
    queue<std::string> q(2);
    const long before = anonymous_kib();
    REQUIRE(before > 0);
    {
      const std::string big(64 << 20, 'x');  // past glibc's largest mmap threshold: freed to the system
      REQUIRE(q.try_push(big));
      CHECK(q.try_pop() == big);
    }
    REQUIRE(q.try_push("small"));
    CHECK(q.try_pop() == "small");
    CHECK(anonymous_kib() - before < 16 * 1024);
  }

  TEST_CASE("a push counts the get it wakes as no longer asleep at once") {
    // A wait still counted asleep would make every push until it woke up
    // a system call of its own.
    const auto core = detail::make_queue_core(4, type_signature<int>());
    std::optional<int> got;
    std::thread getter([&] {
      std::vector<std::byte> out;
      if (detail::queue_get(*core, out, std::nullopt)) got = detail::read_record<int>(out);
    });
    REQUIRE(first_counted_asleep(*core, &std::pair<std::uint32_t, std::uint32_t>::first) == 1);
    detail::queue_record r;
    detail::fill_record(r, 5);
    REQUIRE(detail::queue_try_push(*core, r));
    CHECK(detail::queue_sleepers(*core).first == 0);
    getter.join();
    CHECK(got == 5);
  }

  TEST_CASE("gets and puts blocked on a small queue move every value and leave no wait counted asleep") {
    const auto core = detail::make_queue_core(2, type_signature<int>());
    constexpr int threads = 3, each = 3000;
    std::atomic<long> sum{0};
    std::vector<std::thread> all;
    for (int t = 0; t < threads; ++t) {
      all.emplace_back([&] {
        std::vector<std::byte> out;
        for (int i = 0; i < each; ++i) {
          REQUIRE(detail::queue_get(*core, out, std::nullopt));
          sum += detail::read_record<int>(out);
        }
      });
      all.emplace_back([&, t] {
        detail::queue_record r;
        for (int i = 0; i < each; ++i) {
          detail::fill_record(r, t * each + i);
          REQUIRE(detail::queue_put(*core, r, std::nullopt));
        }
      });
    }
    for (auto& t : all) t.join();
    constexpr long n = threads * each;
    CHECK(sum == n * (n - 1) / 2);
    CHECK(detail::queue_size(*core) == 0);
    CHECK(detail::queue_sleepers(*core) == std::pair<std::uint32_t, std::uint32_t>{0, 0});
  }

  TEST_CASE("a put asleep on a full queue finds the room one pop leaves, though pops wake it only at half") {
    const auto core = detail::make_queue_core(8, type_signature<int>());
    detail::queue_record r;
    for (int i = 0; i < 8; ++i) {
      detail::fill_record(r, i);
      REQUIRE(detail::queue_try_push(*core, r));
    }
    std::optional<bool> put;
    std::thread producer([&] {
      detail::queue_record last;
      detail::fill_record(last, 8);
      put = detail::queue_put(*core, last, 10s);
    });
    REQUIRE(first_counted_asleep(*core, &std::pair<std::uint32_t, std::uint32_t>::second) == 1);
    std::vector<std::byte> out;
    REQUIRE(detail::queue_try_pop(*core, out));  // 7 left: above half, so no wake
    const auto popped = std::chrono::steady_clock::now();
    CHECK(detail::read_record<int>(out) == 0);
    producer.join();
    CHECK(put == true);
    // Found by a look while asleep, not by the last attempt at the put's
    // 10 s deadline: a bound that only catches the look being gone.
    CHECK(std::chrono::steady_clock::now() - popped < 5s);
    for (int i = 1; i <= 8; ++i) {
      REQUIRE(detail::queue_try_pop(*core, out));
      CHECK(detail::read_record<int>(out) == i);
    }
    CHECK(detail::queue_sleepers(*core) == std::pair<std::uint32_t, std::uint32_t>{0, 0});
  }

  TEST_CASE("a blocking get times out on an empty queue and put on a full one") {
    queue<int> q(1);
    const auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(q.get(30ms));
    CHECK(std::chrono::steady_clock::now() - start >= 30ms);
    q.put(1);
    CHECK_FALSE(q.put(2, 30ms));
  }

  TEST_CASE("a timeout too long for the clock to add waits as long as it takes, and a negative one not at all") {
    queue<int> q(1);
    check_waits_for_the_other_side(q, std::chrono::nanoseconds::max(), std::chrono::nanoseconds::max());
    CHECK(q.get() == 2);
    const auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(q.get(std::chrono::nanoseconds::min()));
    CHECK(std::chrono::steady_clock::now() - start < 5s);
  }

  TEST_CASE("a queue moved from is still the queue") {
    queue<int> a(4);
    queue<int> b = std::move(a);
    a.put(1);  // NOLINT(bugprone-use-after-move): what is tested
    CHECK(b.size() == 1);
    CHECK(b.get() == 1);
    queue<int> c(2);
    c = std::move(b);
    b.close();  // NOLINT(bugprone-use-after-move)
    CHECK(c.closed());
  }

  // Before, values under a quarter of the ring stayed in it whatever their
  // number: a queue of capacity 16 was full after 8 strings of 8000 bytes,
  // and a rank that put 16 before anyone popped blocked for good.
  TEST_CASE("a queue takes its capacity in values whatever their sizes: those the ring's bytes cannot hold go out of line") {
    for (const std::size_t capacity : {std::size_t{1}, std::size_t{16}, std::size_t{120}, std::size_t{1024}}) {
      for (const std::size_t size : {std::size_t{0}, std::size_t{100}, std::size_t{1000}, std::size_t{8000},
                                     std::size_t{16000}, std::size_t{30000}}) {
        CAPTURE(capacity);
        CAPTURE(size);
        queue<std::string> q(capacity);
        std::size_t taken = 0;
        // Each value says which it is in its first bytes.
        const auto value = [size](std::size_t i) {
          std::string v(size, static_cast<char>('a' + i % 26));
          if (size >= 8) std::memcpy(v.data(), &i, sizeof i);
          return v;
        };
        while (taken < capacity + 2 && q.try_push(value(taken))) ++taken;
        CHECK(taken == capacity);
        CHECK(q.size() == capacity);
        CHECK_FALSE(q.put(value(taken), 10ms));  // full by its count: the put ends at its timeout
        for (std::size_t i = 0; i < capacity; ++i) CHECK(q.get(1s) == value(i));
        CHECK(q.size() == 0);
      }
    }
  }

  // Before, the room kept for the values still to come was reckoned when a
  // record of more than two lines went in, from the lines the records
  // before it took: once those of one line were popped, each gave back one
  // line where a value still to come may need two. Capacity 512 held 387
  // values so, and 1000 held 599; and where the ring holds exactly two
  // lines a value (capacities of 512 and more, powers of two), a record of
  // two lines that skips the ring's last line made it one short.
  TEST_CASE("a queue takes its capacity in values whatever was popped before") {
    const std::string one_line = "a";
    const std::string two_lines(100, 'x');
    const std::string many_lines(16000, 'b');  // in the ring, not out of line: under a quarter of it
    for (const std::size_t capacity : {std::size_t{120}, std::size_t{512}, std::size_t{1000}, std::size_t{1024}}) {
      CAPTURE(capacity);
      {
        INFO("one record of one line popped, then records of two lines: one of them skips the ring's end");
        queue<std::string> q(capacity);
        REQUIRE(q.try_push(one_line));
        REQUIRE(q.get(1s) == one_line);
        std::size_t taken = 0;
        while (taken < capacity + 2 && q.try_push(two_lines)) ++taken;
        CHECK(taken == capacity);
      }
      {
        INFO("records of one line, a record of many, the first popped, then records of two lines");
        queue<std::string> q(capacity);
        const std::size_t first = capacity * 6 / 10;
        for (std::size_t i = 0; i < first; ++i) REQUIRE(q.try_push(one_line));
        REQUIRE(q.try_push(many_lines));
        for (std::size_t i = 0; i < first; ++i) REQUIRE(q.get(1s) == one_line);
        std::size_t taken = 0;
        while (taken < capacity + 2 && q.try_push(two_lines)) ++taken;
        CHECK(taken == capacity - 1);
        CHECK(q.size() == capacity);
        CHECK(q.get(1s) == many_lines);
        for (std::size_t i = 0; i < taken; ++i) CHECK(q.get(1s) == two_lines);
      }
    }
  }

  // Before, each said only "cohort: cohort needs the executor of an
  // asio::io_context".
  TEST_CASE("a push, a pop or an event's wait awaited on a thread_pool is refused, naming which") {
    queue<int> full(1);
    REQUIRE(full.try_push(1));
    queue<int> empty(1);
    event e;
    asio::thread_pool threads(1);
    // What the coroutine `body`, run on the thread_pool, ended with.
    const auto refusal = [&threads](std::function<asio::awaitable<void>()> body) {
      std::promise<std::string> said;
      asio::co_spawn(threads, std::move(body), [&said](std::exception_ptr failure) {
        try {
          if (failure) std::rethrow_exception(failure);
          said.set_value("no refusal");
        } catch (const std::invalid_argument& refused) {
          said.set_value(refused.what());
        } catch (...) {
          said.set_value("another exception");
        }
      });
      return said.get_future().get();
    };
    const int value = 2;
    CHECK(refusal([&]() -> asio::awaitable<void> { co_await full.push(value); }).starts_with("cohort::queue::push: "));
    CHECK(refusal([&]() -> asio::awaitable<void> { (void)co_await empty.pop(); }).starts_with("cohort::queue::pop: "));
    CHECK(refusal([&]() -> asio::awaitable<void> { co_await e.wait(); }).starts_with("cohort::event::wait: "));
  }

  TEST_CASE("a storage pushed and dropped by its sender arrives intact") {
    for (auto strategy : strategies) {
      set_sharing_strategy(strategy);
      queue<storage> q(4);
      {
        storage s = storage::allocate(100);
        std::memset(s.data(), 0x42, 100);
        q.put(s);
      }
      storage got = q.get().value();
      CHECK(got.is_shared());
      CHECK(got.use_count() == 1);
      CHECK(std::to_integer<int>(got.data()[99]) == 0x42);
      storage again = storage::allocate_shared(8);
      q.put(again);
      q.put(again);
      CHECK(q.get()->same(again));
      CHECK(q.get()->same(again));
    }
    set_sharing_strategy(sharing_strategy::file_descriptor);
  }

  TEST_CASE("ranks started by each start method receive storages through queues without a copy") {
    for (auto strategy : strategies) {
      set_sharing_strategy(strategy);
      for (auto method : methods) {
        CAPTURE(to_string(method));
        CAPTURE(to_string(strategy));
        queue<storage> in(16), out(16);
        std::vector<storage> sent;
        for (int i = 0; i < 6; ++i) {
          sent.push_back(storage::allocate_shared(64));
          sent.back().data()[0] = std::byte(10 * i);
          in.put(sent.back());
        }
        spawn_and_join(add_rank, std::tuple{in, out, 3}, 2, test::join_by(method));
        int sum = 0;
        for (int i = 0; i < 6; ++i) {
          storage back = out.get(1s).value();
          // The same bytes came back: a rank wrote into the parent's block.
          CHECK(std::any_of(sent.begin(), sent.end(), [&](const storage& s) { return s.same(back); }));
          sum += std::to_integer<int>(back.data()[0]);
        }
        CHECK(sum == 10 * (0 + 1 + 2 + 3 + 4 + 5) + 3 * 1 + 3 * 2);
      }
    }
    set_sharing_strategy(sharing_strategy::file_descriptor);
  }

  TEST_CASE("many storages cross into a rank limited to 64 descriptors") {
    for (auto strategy : strategies) {
      set_sharing_strategy(strategy);
      queue<storage> q(4096);
      std::vector<storage> kept;
      for (int i = 0; i < 3000; ++i) {
        kept.push_back(storage::allocate_shared(40));
        kept.back().data()[0] = std::byte(1);
        q.put(kept.back());
      }
      CHECK(spawn_and_join(sum_under_fd_limit, std::tuple{q, 3000}, 1) == std::vector{3000});
    }
    set_sharing_strategy(sharing_strategy::file_descriptor);
  }

  TEST_CASE("a pop waiting on a queue whose producers have all exited ends with peer_lost") {
    queue<int> q(4);
    spawn_and_join(push_one_and_leave, std::tuple{q}, 2);
    CHECK(q.get() == 7);
    CHECK(q.get() == 7);
    try {
      (void)q.get(10s);
      FAIL("the pop returned");
    } catch (const peer_lost& e) {
      CHECK(e.pid() > 0);
      CHECK((e.rank() == 0 || e.rank() == 1));
    }
    asio::io_context io;
    CHECK_THROWS_AS(test::run(io, q.pop()), peer_lost);
  }

  // Before, the watch of a queue's peers took a plain mutex across system
  // calls: a thread's fork() while another thread of the parent held it
  // (a wait looking at the producers) left the child's first wait that
  // sleeps stopped on it for good, past its timeout.
  TEST_CASE("a plain fork while another thread waits on a queue leaves the child's waits working") {
    queue<int> q(4);
    const pid_t producer = ::fork();
    REQUIRE(producer >= 0);
    if (producer == 0) {  // a live producer, which each wait looks at
      q.put(1);
      ::pause();
      ::_exit(0);
    }
    CHECK(q.get(10s) == 1);
    std::atomic<bool> stop = false;
    std::thread waiter([&] {
      while (!stop.load()) (void)q.get(1us);
    });
    int forks = 0, stuck = 0;
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (forks < 1000 && stuck == 0 && std::chrono::steady_clock::now() < until) {
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {
        ::alarm(3);  // a stuck wait ends the child with SIGALRM
        (void)q.get(1ms);
        ::_exit(0);
      }
      int status = 0;
      ::waitpid(child, &status, 0);
      ++forks;
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) ++stuck;
    }
    stop = true;
    waiter.join();
    ::kill(producer, SIGKILL);
    ::waitpid(producer, nullptr, 0);
    INFO("forks: " << forks);
    CHECK(stuck == 0);
    CHECK(forks > 0);
  }

  TEST_CASE("the death notice wakes a sleeper when an armed process ends, from a thread libc does not count") {
    join_options options;
    options.method = start_method::spawn;
    CHECK(spawn_and_join(watch_a_death, std::tuple{false}, 1, options).at(0) == (1 | 2 | 4));
  }

  TEST_CASE("a rank whose ids differ gets a std::thread for the death notice, which wakes") {
    if (::geteuid() != 0) {
      MESSAGE("not root: the ids cannot be made to differ");
      return;
    }
    join_options options;
    options.method = start_method::spawn;
    // libc counts the std::thread (no 1), which is there and wakes the sleep.
    CHECK(spawn_and_join(watch_a_death, std::tuple{true}, 1, options).at(0) == (2 | 4));
  }

  TEST_CASE("a peer entry left by an ended process with this pid becomes this process's") {
    detail::peer_table table{};
    table.count = 1;
    table.peers[0] = {::getpid(), 3, detail::peer_producer, os::own_start_time() + 1};
    table.join(detail::peer_consumer);
    CHECK(table.count == 1);
    CHECK(table.peers[0].start_time == os::own_start_time());
    CHECK(table.peers[0].roles == detail::peer_consumer);  // not the ended producer's
    CHECK(table.peers[0].rank == -1);
  }

  TEST_CASE("an entry whose start time could not be read is taken as this process's own") {
    detail::peer_table table{};
    table.count = 1;
    table.peers[0] = {::getpid(), -1, detail::peer_producer, 0};
    CHECK_FALSE(os::has_ended(::getpid(), 0));  // unknown: judged by the pid, which is here
    table.join(detail::peer_consumer);
    CHECK(table.count == 1);
    CHECK(table.peers[0].roles == (detail::peer_producer | detail::peer_consumer));
    CHECK(table.peers[0].start_time == os::own_start_time());
  }

  TEST_CASE("a full peer table keeps the processes still there, told by start time, not by pid") {
    const pid_t parent = ::getppid();
    const auto started = os::start_time_of(parent);
    REQUIRE(started.has_value());
    REQUIRE(*started > 0);
    detail::peer_table table{};
    table.count = detail::max_peers;
    // The parent's pid, but for one entry with start times other than its
    // own: processes that had that pid and have ended.
    for (int i = 0; i < detail::max_peers; ++i) {
      table.peers[i] = {parent, i, detail::peer_producer, i == 7 ? *started : *started + 1 + static_cast<std::uint64_t>(i)};
    }
    table.join(detail::peer_consumer);
    REQUIRE(table.count == 2);
    CHECK(table.peers[0].rank == 7);
    CHECK(table.peers[1].pid == ::getpid());
  }

  // Before, a full table kept only the processes still there: once one-shot
  // consumers had filled it, the queue's only producer, ended, was no longer
  // named, and a pop waited for it for good instead of ending with peer_lost.
  TEST_CASE("a full peer table keeps the last ended process of a side that no live process is on") {
    const pid_t parent = ::getppid();
    const auto started = os::start_time_of(parent);
    REQUIRE(started.has_value());
    REQUIRE(*started > 0);
    const auto ended = [&](int i) { return *started + 1 + static_cast<std::uint64_t>(i); };
    detail::peer_table table{};
    table.count = detail::max_peers;
    table.peers[0] = {parent, 0, detail::peer_producer, ended(0)};
    table.peers[1] = {parent, 1, detail::peer_producer, ended(1)};  // the last producer
    for (int i = 2; i < detail::max_peers; ++i) table.peers[i] = {parent, i, detail::peer_consumer, ended(i)};
    table.join(detail::peer_consumer);
    REQUIRE(table.count == 2);
    CHECK(table.peers[0].rank == 1);
    CHECK(table.peers[1].pid == ::getpid());
    detail::peer_watch watch;
    const auto gone = watch.all_gone(table.peers, table.count, detail::peer_producer);
    REQUIRE(gone.has_value());
    CHECK(gone->rank == 1);
    CHECK_FALSE(watch.all_gone(table.peers, table.count, detail::peer_consumer).has_value());  // this one
  }

  TEST_CASE("a peer table full of processes still there records no more, and says it is incomplete") {
    const pid_t parent = ::getppid();
    const auto started = os::start_time_of(parent);
    REQUIRE(started.has_value());
    detail::peer_table table{};
    table.count = detail::max_peers;
    for (int i = 0; i < detail::max_peers; ++i) table.peers[i] = {parent, i, detail::peer_consumer, *started};
    CHECK(table.incomplete == 0);
    table.join(detail::peer_producer);
    CHECK(table.count == static_cast<std::uint32_t>(detail::max_peers));
    CHECK(table.incomplete == 1);
    const auto self = [](const detail::peer& p) { return p.pid == ::getpid(); };
    CHECK(std::none_of(table.peers, table.peers + detail::max_peers, self));
  }

  TEST_CASE("a queue whose table missed a process ends no wait with peer_lost: that one may be there") {
    queue<int> q(2);
    q.put(1);
    spawn_and_join(pop_one_and_leave, std::tuple{q}, 1);  // the only consumer the table names, gone
    detail::queue_mark_peers_incomplete(detail::queue_access::core(q));
    q.put(2);
    q.put(3);
    CHECK_FALSE(q.put(4, 300ms));  // full, and waited out: not peer_lost
    CHECK(q.get() == 2);
    CHECK(q.put(4, 300ms));
  }

  TEST_CASE("a side of a queue keeps no descriptor for peers that came and went") {
    const auto open_pidfds = [] {
      int n = 0;
      for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        if (std::filesystem::read_symlink(e.path(), ec).string() == "anon_inode:[pidfd]") ++n;
      }
      return n;
    };
    const int before = open_pidfds();
    detail::peer_watch watch;
    detail::peer_table table{};
    for (int i = 0; i < 32; ++i) {
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {
        ::pause();
        ::_exit(0);
      }
      std::optional<std::uint64_t> started;
      while (!(started = os::start_time_of(child)) || *started == 0) std::this_thread::yield();
      // The table grows as producers come, as the queue's does.
      table.peers[table.count++] = {child, i, detail::peer_producer, *started};
      CHECK_FALSE(watch.all_gone(table.peers, table.count, detail::peer_producer).has_value());
      CHECK(watch.descriptors() == 1);  // the live one's, none for those gone
      ::kill(child, SIGKILL);
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      const auto gone = watch.all_gone(table.peers, table.count, detail::peer_producer);
      REQUIRE(gone.has_value());
      CHECK(gone->pid == child);
    }
    CHECK(watch.descriptors() == 0);
    CHECK(open_pidfds() == before);
    // Entries the table no longer names are dropped as well.
    table.count = 0;
    CHECK_FALSE(watch.all_gone(table.peers, table.count, detail::peer_producer).has_value());
  }

  TEST_CASE("a pop waiting on a queue only it fed ends with peer_lost once its consumers have exited") {
    queue<int> q(4);
    q.put(1);
    spawn_and_join(pop_one_and_leave, std::tuple{q}, 1);
    try {
      (void)q.get(10s);
      FAIL("the pop returned");
    } catch (const peer_lost& e) {
      CHECK(e.rank() == 0);
      CHECK(std::string_view(e.what()).find("every other process") != std::string_view::npos);
    }
    asio::io_context io;
    CHECK_THROWS_AS(test::run(io, q.pop()), peer_lost);
    // Alone from the start, a process is not told: another may yet come.
    queue<int> alone(4);
    alone.put(1);
    CHECK(alone.get() == 1);
    CHECK_FALSE(alone.get(100ms).has_value());
  }

  TEST_CASE("a push into a full queue whose consumers have all exited ends with peer_lost") {
    queue<int> q(2);
    q.put(1);
    spawn_and_join(pop_one_and_leave, std::tuple{q}, 1);
    q.put(2);
    q.put(3);
    CHECK_THROWS_AS(q.put(4, 10s), peer_lost);
    asio::io_context io;
    CHECK_THROWS_AS(test::run(io, q.push(4)), peer_lost);
  }

  TEST_CASE("an awaited pop is woken by a push from another thread") {
    queue<int> q(4);
    asio::io_context io;
    std::thread pusher([&] {
      std::this_thread::sleep_for(50ms);
      q.put(5);
    });
    CHECK(test::run(io, q.pop()) == 5);
    pusher.join();
  }

  // Before, only ENOSYS counted as no futex_waitv: under a filter that
  // answers EPERM, as Docker's default profile does for calls it does not
  // know, a blocking get threw "futex wait: Operation not permitted", and a
  // helper thread spun on the refused call through an awaited pop's wait.
  TEST_CASE("where futex_waitv is refused with EPERM, a blocking get and an awaited pop wait without spinning") {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // A program of its own: this one may have asked for futex_waitv already.
      if (!test::refuse_system_call(SYS_futex_waitv, EPERM)) ::_exit(77);
      ::dup2(out[1], STDOUT_FILENO);
      ::execl(test::target.c_str(), test::target.c_str(), "wait-on-queue", "500", nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buffer[256];
    for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
    ::close(out[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
      WARN_MESSAGE(false, "no seccomp filter could be installed here: a refused futex_waitv is not tested");
      return;
    }
    INFO(text);
    REQUIRE(WEXITSTATUS(status) == 0);
    std::istringstream lines(text);
    std::string got, popped;
    long long cpu_ms = -1, wall_ms = -1;
    std::getline(lines, got);
    std::getline(lines, popped);
    lines >> cpu_ms >> wall_ms;
    CHECK(got == "7");
    CHECK(popped == "8");
    CHECK(wall_ms >= 400);
    CHECK(cpu_ms * 10 < wall_ms);  // a sleep: a spin took a quarter of a core and more
  }

  TEST_CASE("a cancelled pop leaves the queue working") {
    using namespace asio::experimental::awaitable_operators;
    queue<int> q(4);
    asio::io_context io;
    auto race = [&]() -> asio::awaitable<bool> {
      asio::steady_timer t(co_await asio::this_coro::executor, 20ms);
      auto r = co_await (q.pop() || t.async_wait(asio::use_awaitable));
      co_return r.index() == 1;
    };
    CHECK(test::run(io, race()));
    q.put(9);
    CHECK(q.get(1s) == 9);
  }

  TEST_CASE("awaited pops raced against timers lose no value and leave no wait counted asleep") {
    // A pop that loses its race is cancelled: it must neither take a value
    // nobody will receive nor stay counted asleep.
    using namespace asio::experimental::awaitable_operators;
    const auto core = cohort::detail::make_queue_core(64, type_signature<int>());
    constexpr int n = 3000;
    std::atomic<bool> pushed_all{false};
    long sum = 0;
    int got = 0;
    asio::io_context io;
    auto popper = [&]() -> asio::awaitable<void> {
      auto executor = co_await asio::this_coro::executor;
      std::vector<std::byte> out;
      while (!pushed_all.load() || cohort::detail::queue_size(*core) > 0) {
        asio::steady_timer timer(executor, 1ms);
        auto r = co_await (cohort::detail::queue_pop(core, out) || timer.async_wait(asio::use_awaitable));
        if (r.index() == 0) {
          sum += cohort::detail::read_record<int>(out);
          ++got;
        }
      }
    };
    std::thread pusher([&] {
      cohort::detail::queue_record r;
      for (int i = 1; i <= n; ++i) {
        cohort::detail::fill_record(r, i);
        cohort::detail::queue_put(*core, r, std::nullopt);
        if (i % 8 == 0) std::this_thread::sleep_for(200us);
      }
      pushed_all = true;
    });
    for (int c = 0; c < 8; ++c) asio::co_spawn(io, popper(), asio::detached);
    io.run();
    pusher.join();
    CHECK(got == n);
    CHECK(sum == long{n} * (n + 1) / 2);
    CHECK(cohort::detail::queue_sleepers(*core) == std::pair<std::uint32_t, std::uint32_t>{0, 0});
  }

  TEST_CASE("awaited pushes and pops on an io_context that four threads run, without a strand, move every value once") {
    // The coroutines run on the io_context itself: a wait's wake and the
    // end of its sleep slice (a millisecond, for a push) can come at once,
    // on two threads. Before, the one could cancel the other while it was
    // being freed (SIGSEGV, in most runs of these rounds). Each round runs
    // for a while rather than for a number of values: how many sleep, not
    // how many values move, makes the chance.
    constexpr int producers = 32, consumers = 32, rounds = 12;
    for (int round = 0; round < rounds; ++round) {
      CAPTURE(round);
      queue<long> q(2);
      asio::io_context io;
      std::atomic<bool> stop{false};
      std::atomic<long> pushed{0}, pushed_sum{0}, popped{0}, popped_sum{0};
      std::atomic<int> producing{producers}, failures{0};
      const auto producer = [&](long first) -> asio::awaitable<void> {
        for (long value = first; !stop; value += producers) {
          co_await q.push(value);
          ++pushed;
          pushed_sum += value;
        }
        if (--producing == 0) q.close();
      };
      const auto consumer = [&]() -> asio::awaitable<void> {
        for (;;) {
          try {
            popped_sum += co_await q.pop();
          } catch (const queue_closed&) {
            co_return;
          }
          ++popped;
        }
      };
      const auto count_failure = [&](std::exception_ptr e) {
        if (e) ++failures;
      };
      for (int p = 0; p < producers; ++p) asio::co_spawn(io, producer(p), count_failure);
      for (int c = 0; c < consumers; ++c) asio::co_spawn(io, consumer(), count_failure);
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) threads.emplace_back([&io] { io.run(); });
      std::this_thread::sleep_for(500ms);
      stop = true;
      for (auto& t : threads) t.join();
      CHECK(failures == 0);
      CHECK(pushed > 0);
      CHECK(popped == pushed);
      CHECK(popped_sum == pushed_sum);
    }
  }

  TEST_CASE("a queue handle of one value type is refused as another") {
    queue<int> q(1);
    CHECK_THROWS_AS((void)decode<queue<std::string>>(encode(q)), decode_error);
    CHECK_THROWS_AS((void)decode<event>(encode(q)), decode_error);
  }

  TEST_CASE("push and pop with callbacks bound to an io_context move a value") {
    asio::io_context io;
    auto q = make_queue<int>(4);
    std::exception_ptr push_error, pop_error;
    bool pushed = false;
    std::optional<int> popped;
    q.pop(asio::bind_executor(io, [&](std::exception_ptr e, int value) {
      pop_error = e;
      popped = value;
    }));
    q.push(7, asio::bind_executor(io, [&](std::exception_ptr e) {
      push_error = e;
      pushed = true;
    }));
    io.run();
    CHECK(pushed);
    CHECK_FALSE(push_error);
    CHECK_FALSE(pop_error);
    CHECK(popped == 7);
  }

  // g++ 12 refuses other braced lists pushed inside co_await
  // (tests/compile_fail/queue_push_*.cpp), but not the empty one.
  TEST_CASE("an empty braced list pushed inside co_await arrives as an empty vector") {
    asio::io_context io;
    auto q = make_queue<std::vector<int>>(4);
    auto popped = test::run(io, [](queue<std::vector<int>> q) -> asio::awaitable<std::vector<int>> {
      co_await q.push({});
      co_return co_await q.pop();
    }(q));
    CHECK(popped.empty());
    CHECK(q.size() == 0);
  }

  // Their braces go to constructors rather than make a vector from an
  // initializer_list, which g++ 12 cannot compile inside co_await.
  TEST_CASE("pairs and tuples holding vectors, pushed in braces inside co_await, arrive as written") {
    asio::io_context io;
    auto pairs = make_queue<std::pair<std::string, std::vector<int>>>(4);
    auto tuples = make_queue<std::tuple<int, std::vector<std::string>, std::vector<int>>>(4);
    const std::vector<int> named{7, 8};
    test::run(io, [&]() -> asio::awaitable<void> {
      co_await pairs.push({"a", {1, 2}});
      co_await pairs.push({"b", {}});
      co_await pairs.push({"c", named});
      co_await tuples.push({3, {"x", "yz"}, {5}});
    }());
    CHECK(pairs.try_pop() == std::pair<std::string, std::vector<int>>{"a", {1, 2}});
    CHECK(pairs.try_pop() == std::pair<std::string, std::vector<int>>{"b", {}});
    CHECK(pairs.try_pop() == std::pair<std::string, std::vector<int>>{"c", {7, 8}});
    CHECK(tuples.try_pop() ==
          std::tuple<int, std::vector<std::string>, std::vector<int>>{3, {"x", "yz"}, {5}});
    CHECK(named == std::vector<int>{7, 8});
  }

  TEST_CASE("a pop with use_future is woken by a push from this thread") {
    asio::io_context io;
    auto q = make_queue<std::string>(4);
    const test::io_thread runner(io);
    auto value = q.pop(asio::bind_executor(io, asio::use_future));
    CHECK(value.wait_for(20ms) == std::future_status::timeout);
    REQUIRE(q.try_push("hello"));
    CHECK(value.get() == "hello");
    auto pushed = q.push("again", asio::bind_executor(io, asio::use_future));
    pushed.get();
    CHECK(q.try_pop() == "again");
  }

  TEST_CASE("a pop, push or event wait whose handler names no executor is refused at the call, moving nothing") {
    // A plain callback or use_future names no executor: the operation has
    // nowhere to run, and asio's system thread pool, where it would have
    // run, is not started for it.
    auto q = make_queue<int>(1);
    event e;
    const auto before = threads_now();
    const auto refused = [](auto&& start) {
      try {
        start();
      } catch (const std::invalid_argument& error) {
        const std::string what = error.what();
        return what.find("has no associated io_context executor") != std::string::npos &&
               what.find("asio::bind_executor") != std::string::npos;
      }
      return false;
    };
    bool called = false;
    CHECK(refused([&] { (void)q.pop(asio::use_future); }));  // empty: it would sleep
    CHECK(refused([&] { q.pop([&](std::exception_ptr, int) { called = true; }); }));
    REQUIRE(q.try_push(1));
    CHECK(refused([&] { (void)q.push(2, asio::use_future); }));  // full: it would sleep
    CHECK(refused([&] { q.push(2, [&](std::exception_ptr) { called = true; }); }));
    CHECK(refused([&] { (void)q.pop(asio::use_future); }));  // a value there: refused all the same
    CHECK(q.try_pop() == 1);                                   // and left there
    CHECK(refused([&] { (void)e.wait(asio::use_future); }));
    e.set();
    CHECK(refused([&] { e.wait([&](std::exception_ptr) { called = true; }); }));
    CHECK_FALSE(called);
    CHECK(threads_now() == before);
  }

  TEST_CASE("a pop inside make_parallel_group, whose handler names no executor, fails at once and leaves the value") {
    asio::io_context io;
    auto q = make_queue<int>(4);
    REQUIRE(q.try_push(42));
    const auto before = threads_now();
    std::size_t first = 2;
    std::string failure;
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      asio::steady_timer timer(co_await asio::this_coro::executor, 10s);
      auto both = asio::experimental::make_parallel_group(q.pop(asio::experimental::deferred),
                                                          timer.async_wait(asio::experimental::deferred));
      auto [order, error, value, waited] =
          co_await both.async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
      first = order[0];
      try {
        if (error) std::rethrow_exception(error);
      } catch (const std::invalid_argument& refusal) {
        failure = refusal.what();
      }
    }, asio::detached);
    io.run();  // the timer, which the pop's end cancels, bounds it
    CHECK(first == 0);
    CHECK(failure.find("has no associated io_context executor") != std::string::npos);
    CHECK(failure.find("make_parallel_group") != std::string::npos);
    CHECK(q.size() == 1);
    CHECK(q.try_pop() == 42);
    CHECK(threads_now() == before);
  }

  TEST_CASE("deferred pops and pushes cancelled through their slots complete as aborted and move nothing") {
    asio::io_context io;
    auto q = make_queue<int>(1);
    asio::cancellation_signal cancel_pop, cancel_push;
    std::exception_ptr pop_error, push_error;
    auto pop = q.pop(asio::experimental::deferred);
    std::move(pop)(asio::bind_cancellation_slot(cancel_pop.slot(), asio::bind_executor(io, [&](std::exception_ptr e, int) {
      pop_error = e;
    })));
    asio::steady_timer timer(io, 20ms);
    timer.async_wait([&](std::error_code) { cancel_pop.emit(asio::cancellation_type::terminal); });
    io.run();
    CHECK(test::aborted(pop_error));
    CHECK(q.size() == 0);

    REQUIRE(q.try_push(1));
    io.restart();
    auto push = q.push(2, asio::experimental::deferred);
    std::move(push)(asio::bind_cancellation_slot(cancel_push.slot(), asio::bind_executor(io, [&](std::exception_ptr e) {
      push_error = e;
    })));
    timer.expires_after(20ms);
    timer.async_wait([&](std::error_code) { cancel_push.emit(asio::cancellation_type::terminal); });
    io.run();
    CHECK(test::aborted(push_error));
    CHECK(q.try_pop() == 1);
    CHECK_FALSE(q.try_pop());
  }
}

TEST_SUITE("event") {
  TEST_CASE("an event is clear until set, and clear again once cleared") {
    event e;
    CHECK_FALSE(e.is_set());
    CHECK_FALSE(e.wait_for(10ms));
    e.set();
    CHECK(e.is_set());
    CHECK(e.wait_for(0ms));
    e.clear();
    CHECK_FALSE(e.is_set());
  }

  TEST_CASE("an event wait with a negative timeout returns at once, one too long to add waits for the set") {
    event e;
    auto waited = std::async(std::launch::async, [&] { return e.wait_for(std::chrono::nanoseconds::min()); });
    const bool returned = waited.wait_for(5s) == std::future_status::ready;
    if (!returned) e.set();  // lets the wait end, so that the test fails rather than hangs
    CHECK(returned);
    CHECK_FALSE(waited.get());
    std::thread setter([&] {
      std::this_thread::sleep_for(150ms);
      e.set();
    });
    CHECK(e.wait_for(std::chrono::nanoseconds::max()));
    setter.join();
  }

  // seconds::max() in nanoseconds wraps to -1 s: before, each of these
  // returned at once as timed out.
  TEST_CASE("a timeout of a coarser unit too long to count in nanoseconds waits as long as it takes") {
    static_assert(detail::saturating_cast<std::chrono::nanoseconds>(std::chrono::seconds::max()) ==
                  std::chrono::nanoseconds::max());
    static_assert(detail::saturating_cast<std::chrono::nanoseconds>(std::chrono::hours::min()) ==
                  std::chrono::nanoseconds::min());
    static_assert(detail::saturating_cast<std::chrono::nanoseconds>(std::chrono::seconds(9'223'372'036)) ==
                  std::chrono::nanoseconds(9'223'372'036'000'000'000));
    static_assert(detail::saturating_cast<std::chrono::milliseconds>(std::chrono::duration<double>(0.25)) == 250ms);
    queue<int> q(1);
    check_waits_for_the_other_side(q, std::chrono::seconds::max(), std::chrono::hours::max());
    CHECK(q.get() == 2);
    event e;
    std::thread setter([&] {
      std::this_thread::sleep_for(150ms);
      e.set();
    });
    CHECK(e.wait_for(std::chrono::milliseconds::max()));
    setter.join();
    // A fractional timeout counts too.
    const auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(q.get(std::chrono::duration<double>(0.05)));
    CHECK(std::chrono::steady_clock::now() - start >= 50ms);
  }

  TEST_CASE("an event wait ends at a set() that a clear() follows at once, blocking or awaited, as Python's does") {
    event e;
    std::thread setter([&] {
      test::within(10s, [&] { return detail::event_sleepers(e) == 2; }, 1ms);  // both waits below are asleep
      e.set();
      e.clear();
    });
    auto blocking = std::async(std::launch::async, [&] { return e.wait_for(3s); });
    asio::io_context io;
    bool awaited = false;
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      co_await e.wait();
      awaited = true;
    }, asio::detached);
    io.run_for(3s);
    setter.join();
    CHECK(blocking.get());
    CHECK(awaited);
    CHECK_FALSE(e.is_set());
    // A wait that begins after the clear waits for the next set.
    CHECK_FALSE(e.wait_for(50ms));
  }

  TEST_CASE("an event moved from is still the event") {
    event a;
    event b = std::move(a);
    a.set();  // NOLINT(bugprone-use-after-move): what is tested
    CHECK(b.is_set());
    b.clear();
    CHECK_FALSE(a.is_set());
  }

  TEST_CASE("a rank waits for an event the parent sets and sets one the parent waits for") {
    for (auto method : methods) {
      event go, done;
      std::thread parent([&] {
        std::this_thread::sleep_for(50ms);
        CHECK_FALSE(done.is_set());
        go.set();
      });
      spawn_and_join(set_after_wait, std::tuple{go, done}, 1, test::join_by(method));
      parent.join();
      CHECK(done.wait_for(1s));
    }
  }

  TEST_CASE("an awaited event wait is woken by set from another thread") {
    event e;
    asio::io_context io;
    std::thread setter([&] {
      std::this_thread::sleep_for(50ms);
      e.set();
    });
    test::run(io, e.wait());
    CHECK(e.is_set());
    setter.join();
  }

  // A kill gives nothing back: before, the killed waiter stayed counted for
  // good, and every later set() made a futex system call.
  TEST_CASE("a waiter killed while it waited is counted only until the next set(); woken waiters are not") {
    event e;
    const pid_t waiter = ::fork();
    if (waiter == 0) {
      (void)e.wait_for();
      ::_exit(0);
    }
    REQUIRE(waiter > 0);
    const bool asleep = test::within(10s, [&] { return detail::event_sleepers(e) == 1; }, 1ms);
    ::kill(waiter, SIGKILL);
    ::waitpid(waiter, nullptr, 0);
    REQUIRE(asleep);
    CHECK(detail::event_sleepers(e) == 1);
    e.set();
    CHECK(detail::event_sleepers(e) == 0);
    e.clear();
    std::thread woken([&] { CHECK(e.wait_for(10s)); });
    REQUIRE(test::within(10s, [&] { return detail::event_sleepers(e) == 1; }, 1ms));
    e.set();
    woken.join();
    CHECK(detail::event_sleepers(e) == 0);
  }

  // A forked waiter runs `wait` (its exit code: 0 when the wait saw the
  // flag); the flag is stored with no wake after it, as by a setter killed
  // between the two. Whether the waiter ended, with 0, within 5 s.
  void check_sees_unwoken_set(event& e, const std::function<int()>& wait) {
    const pid_t waiter = ::fork();
    if (waiter == 0) ::_exit(wait());
    REQUIRE(waiter > 0);
    REQUIRE(test::within(10s, [&] { return detail::event_sleepers(e) == 1; }, 1ms));
    detail::event_store_flag_only(e);
    int status = 0;
    const bool ended = test::within(5s, [&] { return ::waitpid(waiter, &status, WNOHANG) == waiter; }, 1ms);
    if (!ended) {
      ::kill(waiter, SIGKILL);
      ::waitpid(waiter, nullptr, 0);
    }
    REQUIRE(ended);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  // Before, a setter killed between its store and its wake left a waiter
  // asleep with the flag set, for good when it waited without a timeout.
  TEST_CASE("a blocking wait ends within a second of a set() whose setter was killed before its wake") {
    event e;
    check_sees_unwoken_set(e, [&] { return e.wait_for() ? 0 : 1; });
  }

  // Before, an awaited wait slept on the generation's word until a wake,
  // which the killed setter never sent.
  TEST_CASE("an awaited wait ends within a second of a set() whose setter was killed before its wake") {
    event e;
    check_sees_unwoken_set(e, [&] {
      asio::io_context io;
      int code = 3;  // it never ended
      asio::co_spawn(io, e.wait(), [&](std::exception_ptr error) { code = error ? 4 : 0; });
      io.run_for(20s);
      return code;
    });
  }

  // Before, the first wait on a fresh io_context made its ring's service
  // inside the initiation, whose throw ended the program (std::terminate).
  TEST_CASE("an awaited event wait on an io_context that can get no descriptor fails with an exception") {
    event e;
    const pid_t child = ::fork();
    if (child == 0) {
      rlimit low{64, 64};
      ::setrlimit(RLIMIT_NOFILE, &low);
      while (::open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) {
      }
      asio::io_context io;
      int code = 3;  // it completed
      asio::co_spawn(io, e.wait(), [&](std::exception_ptr error) {
        try {
          if (error) std::rethrow_exception(error);
        } catch (const std::system_error& failed) {
          code = failed.code().value() == EMFILE ? 0 : 4;
        } catch (...) {
          code = 5;
        }
      });
      io.run_for(2s);
      ::_exit(code);
    }
    REQUIRE(child > 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TEST_CASE("an event wait with a callback completes once the event is set") {
    asio::io_context io;
    event e;
    std::exception_ptr error;
    bool done = false;
    e.wait(asio::bind_executor(io, [&](std::exception_ptr x) {
      error = x;
      done = true;
    }));
    asio::steady_timer timer(io, 10ms);
    timer.async_wait([&](std::error_code) {
      CHECK_FALSE(done);
      e.set();
    });
    io.run();
    CHECK(done);
    CHECK_FALSE(error);
  }

  TEST_CASE("an event wait with use_future is woken by set from this thread") {
    asio::io_context io;
    event e;
    const test::io_thread runner(io);
    auto waited = e.wait(asio::bind_executor(io, asio::use_future));
    CHECK(waited.wait_for(20ms) == std::future_status::timeout);
    e.set();
    waited.get();
  }

  TEST_CASE("a deferred event wait cancelled through its slot completes as aborted and the event still works") {
    asio::io_context io;
    event e;
    asio::cancellation_signal cancel;
    std::exception_ptr error;
    auto wait = e.wait(asio::experimental::deferred);
    std::move(wait)(asio::bind_cancellation_slot(cancel.slot(), asio::bind_executor(io, [&](std::exception_ptr x) {
      error = x;
    })));
    asio::steady_timer timer(io, 20ms);
    timer.async_wait([&](std::error_code) { cancel.emit(asio::cancellation_type::terminal); });
    io.run();
    CHECK(test::aborted(error));
    CHECK_FALSE(e.is_set());
    e.set();
    io.restart();
    bool done = false;
    e.wait(asio::bind_executor(io, [&](std::exception_ptr x) { done = !x; }));
    io.run();
    CHECK(done);
  }

  // Before, a partial or total cancellation never reached the wait (a
  // spawned coroutine takes terminal ones alone): it went on waiting.
  TEST_CASE("an event wait, a pop and a push end as aborted at a cancellation of every type") {
    for (const auto type : {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                            asio::cancellation_type::total}) {
      CAPTURE(static_cast<int>(type));
      asio::io_context io;
      event e;
      queue<int> empty(4), full(1);
      REQUIRE(full.put(1, 1s));
      asio::cancellation_signal signals[3];
      std::exception_ptr errors[3];
      int completed = 0;
      const auto done = [&](int i) {
        auto handler = [&, i](std::exception_ptr x, auto&&...) {
          errors[i] = x;
          ++completed;
        };
        return asio::bind_cancellation_slot(signals[i].slot(), asio::bind_executor(io, handler));
      };
      e.wait(done(0));
      empty.pop(done(1));
      full.push(2, done(2));
      asio::steady_timer timer(io, 50ms);
      timer.async_wait([&](std::error_code) {
        for (auto& signal : signals) signal.emit(type);
      });
      io.run_for(5s);
      CHECK(completed == 3);
      for (const auto& error : errors) CHECK(test::aborted(error));
      CHECK(empty.size() == 0);
      CHECK(full.size() == 1);
      CHECK(detail::event_sleepers(e) == 0);
    }
  }
}

}  // namespace queue_tests
