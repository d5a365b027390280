#include "cohort/storage.hpp"

#include "cohort/queue.hpp"
#include "cohort/spawn_and_join.hpp"
#include "os/process_identity.hpp"
#include "os/spin_mutex.hpp"
#include "shm/segment.hpp"

#include "support/carve_probe.hpp"
#include "support/harness.hpp"
#include "support/join_by.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/mount.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace cohort;
namespace fs = std::filesystem;

namespace storage_tests {

// /dev/shm files named for segments `pid` made.
std::vector<fs::path> named_segments_of(pid_t pid) {
  std::vector<fs::path> found;
  const auto prefix = fmt::format("cohort_{}_", pid);
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().starts_with(prefix)) found.push_back(e.path());
  }
  return found;
}

// A run marker that no run has: the processes these tests start with it
// stand for processes of a run that only these tests sweep.
char test_run_marker[] = "COHORT_GROUP_storage_tests=1";

// Mappings in this process of the segment `nonce` names: a named file's or
// a memfd's, whose names both end in it.
int mappings_of(std::uint64_t nonce) {
  const auto name = fmt::format("{:016x}", nonce);
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(name) != std::string::npos ? 1 : 0;
  return n;
}

int open_descriptors() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Sets the strategy for one test and, at its end, checks that nothing of
// this process is left in /dev/shm once its arena is let go.
struct strategy_scope {
  explicit strategy_scope(sharing_strategy s) { set_sharing_strategy(s); }
  ~strategy_scope() {
    trim_shared_memory();
    CHECK(named_segments_of(::getpid()).empty());
    set_sharing_strategy(sharing_strategy::file_descriptor);
  }
};

void fill_at_rank(int rank, storage s, int value) { std::memset(s.data() + rank, value, 1); }
COHORT_ENTRYPOINT(fill_at_rank);

bool same_twice(int, storage a, storage b) { return a.same(b) && a.data() == b.data() && a.is_shared(); }
COHORT_ENTRYPOINT(same_twice);

// A storage of `bytes` made in the rank, which goes to its keeper as the rank ends.
storage made_at_rank(int, std::size_t bytes) {
  storage s = storage::allocate_shared(bytes);
  std::memset(s.data(), 1, bytes);
  return s;
}
COHORT_ENTRYPOINT(made_at_rank);

storage inherited;
int read_inherited(int) { return std::to_integer<int>(inherited.data()[7]); }
COHORT_ENTRYPOINT(read_inherited);

// Pops `n` storages and lets them go: the last holder of each, in another
// process than the one that made them.
int take_and_drop(int, queue<storage> q, int n) {
  int taken = 0;
  for (int i = 0; i < n; ++i) taken += q.get(std::chrono::seconds(10)).has_value();
  return taken;
}
COHORT_ENTRYPOINT(take_and_drop);

// A forked child of this process that holds no storage and maps this
// process's segments (it records itself as a mapper of each as it starts),
// until this object goes. A process whose arena such a child maps is not
// dead weight to trim: only its count of blocks in use can let it go.
class idle_mapper {
 public:
  idle_mapper() {
    int ready[2];
    if (::pipe(ready) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      (void)!::write(ready[1], "r", 1);  // after fork's handlers: it is a mapper now
      ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    char c = 0;
    if (pid_ > 0 && ::read(ready[0], &c, 1) != 1) stop();
    ::close(ready[0]);
  }
  idle_mapper(const idle_mapper&) = delete;
  idle_mapper& operator=(const idle_mapper&) = delete;
  ~idle_mapper() { stop(); }
  bool running() const { return pid_ > 0; }

 private:
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid_ = -1;
};

// Sends n storages of a MiB and more, each filled with its index + 1.
int send_large(int, queue<storage> q, int n) {
  for (int i = 0; i < n; ++i) {
    storage s = storage::allocate_shared((std::size_t{1} << 20) + static_cast<std::size_t>(i));
    std::memset(s.data(), i + 1, s.nbytes());
    if (!q.put(s, std::chrono::seconds(10))) return i;
  }
  return n;
}
COHORT_ENTRYPOINT(send_large);

// In a process of its own: takes what a rank sent before it ended and
// holds it, then trims. Returns what the trim said went, or a negative
// value for the step that could not be done.
int trim_while_received_held(int) {
  constexpr int n = 8;
  trim_shared_memory();
  queue<storage> q(n);
  if (spawn_and_join(send_large, std::tuple{q, n}, 1).at(0) != n) return -1;
  std::vector<storage> held;
  for (int i = 0; i < n; ++i) {
    auto s = q.get(std::chrono::seconds(10));
    if (!s) return -2;
    held.push_back(*s);
  }
  const int went = trim_shared_memory();
  for (int i = 0; i < n; ++i) {
    const storage& s = held[static_cast<std::size_t>(i)];
    const auto value = static_cast<std::byte>(i + 1);
    if (s.data()[0] != value || s.data()[s.nbytes() - 1] != value) return -3;
  }
  return went;
}
COHORT_ENTRYPOINT(trim_while_received_held);

// In a process of its own, whose arena nothing else holds, under
// file_system (a segment's name tells whether it went): 64 blocks, of which
// 32 are freed last by another process, 16 here, and 16 kept. Returns what
// trim_shared_memory() lets go of and how many of this process's named
// segments there are: with the 16 kept; with one kept; and once that one
// too went to another process and was freed there, while an idle mapper
// runs. A negative value alone says which step could not be done.
std::vector<int> trim_while_blocks_held(int) {
  set_sharing_strategy(sharing_strategy::file_system);
  std::vector<int> seen;
  std::vector<storage> kept;
  {
    queue<storage> q(64);
    for (int i = 0; i < 64; ++i) {
      storage s = storage::allocate_shared(40);
      if (i < 32) {
        if (!q.put(s, std::chrono::seconds(10))) return {-1};
      } else if (i < 48) {
        kept.push_back(s);
      }
    }
    if (spawn_and_join(take_and_drop, std::tuple{q, 32}, 1).at(0) != 32) return {-2};
  }
  const auto look = [&seen] {
    seen.push_back(trim_shared_memory());
    seen.push_back(static_cast<int>(named_segments_of(::getpid()).size()));
  };
  look();
  kept.resize(1);
  look();
  {
    queue<storage> q(1);
    if (!q.put(kept.front(), std::chrono::seconds(10))) return {-3};
    kept.clear();
    if (spawn_and_join(take_and_drop, std::tuple{q, 1}, 1).at(0) != 1) return {-4};
  }
  const idle_mapper mapper;  // forked with nothing held: it holds no block
  if (!mapper.running()) return {-5};
  look();
  return seen;
}
COHORT_ENTRYPOINT(trim_while_blocks_held);

// A forked process that sends the handles `make` returns, then holds what
// it made (and its descriptors) until this object goes.
class sender {
 public:
  explicit sender(const std::function<std::vector<std::vector<std::byte>>()>& make) {
    int to_parent[2], to_child[2];
    REQUIRE(::pipe(to_parent) == 0);
    REQUIRE(::pipe(to_child) == 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const auto& h : make()) {
        const auto n = static_cast<std::uint32_t>(h.size());
        (void)!::write(to_parent[1], &n, sizeof n);
        (void)!::write(to_parent[1], h.data(), n);
      }
      ::close(to_parent[1]);
      char done;
      (void)!::read(to_child[0], &done, 1);
      ::_exit(0);
    }
    ::close(to_parent[1]);
    ::close(to_child[0]);
    release_ = to_child[1];
    std::uint32_t n = 0;
    while (::read(to_parent[0], &n, sizeof n) == sizeof n) {
      std::vector<std::byte> h(n);
      REQUIRE(::read(to_parent[0], h.data(), n) == static_cast<ssize_t>(n));
      handles_.push_back(std::move(h));
    }
    ::close(to_parent[0]);
  }
  sender(const sender&) = delete;
  sender& operator=(const sender&) = delete;
  ~sender() {
    (void)!::write(release_, "x", 1);
    ::close(release_);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  const std::vector<std::vector<std::byte>>& handles() const { return handles_; }

 private:
  pid_t pid_ = -1;
  int release_ = -1;
  std::vector<std::vector<std::byte>> handles_;
};

std::vector<std::byte> handle_bytes(const storage& s) {
  const auto e = encode(s);
  return {e.bytes().begin(), e.bytes().end()};
}

// Where a handle's descriptor + 1 sits: right after the source pid, which
// follows the handle's first four bytes.
std::size_t descriptor_offset(const std::vector<std::byte>& h, pid_t source) {
  const auto pid = static_cast<std::uint32_t>(source);
  for (std::size_t i = 0; i + 8 <= h.size(); ++i) {
    if (std::memcmp(h.data() + i, &pid, 4) == 0) return i + 4;
  }
  FAIL("no source pid in the handle");
  return 0;
}
std::uint32_t descriptor_field(const std::vector<std::byte>& h, pid_t source) {
  std::uint32_t fd = 0;
  std::memcpy(&fd, h.data() + descriptor_offset(h, source), 4);
  return fd;
}
void set_descriptor_field(std::vector<std::byte>& h, pid_t source, std::uint32_t fd) {
  std::memcpy(h.data() + descriptor_offset(h, source), &fd, 4);
}

// A child forked with plain fork(), outside cohort, as a program that
// forks and execs would: it waits for a byte on `go`, runs `then` (its exit
// code; 0 goes on) and execs /bin/sleep 30. `exec_seen` ends at that exec
// (or the child's end). Killed and reaped by pid when this object goes.
class plain_child {
 public:
  explicit plain_child(const std::function<int()>& then) {
    int go[2], seen[2];
    REQUIRE(::pipe(go) == 0);
    REQUIRE(::pipe2(seen, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(go[1]);
      char c = 0;
      if (::read(go[0], &c, 1) != 1) ::_exit(120);
      if (const int code = then()) ::_exit(code);
      ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(go[0]);
    ::close(seen[1]);
    go_ = go[1];
    exec_seen_ = seen[0];
  }
  plain_child(const plain_child&) = delete;
  plain_child& operator=(const plain_child&) = delete;
  ~plain_child() {
    ::close(go_);
    ::close(exec_seen_);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  // Lets the child go on; true once it has exec'd, false if it ended
  // first (its status in `status`).
  bool exec(int& status) {
    REQUIRE(::write(go_, "x", 1) == 1);
    char c = 0;
    REQUIRE(::read(exec_seen_, &c, 1) == 0);
    return ::waitpid(pid_, &status, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
  int go_ = -1;
  int exec_seen_ = -1;
};

const sharing_strategy strategies[] = {sharing_strategy::file_descriptor, sharing_strategy::file_system};
const start_method methods[] = {start_method::spawn, start_method::fork, start_method::forkserver};

TEST_SUITE("storage") {
  TEST_CASE("a os::spin_mutex lets one thread in at a time") {
    os::spin_mutex m;
    long inside = 0, most = 0, total = 0;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 20000; ++i) {
          std::lock_guard lock(m);
          most = std::max(most, ++inside);
          ++total;
          --inside;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(total == 80000);
    CHECK(most == 1);
    REQUIRE(m.try_lock());
    CHECK_FALSE(m.try_lock());
    m.unlock();
    CHECK(m.try_lock());
    m.unlock();
  }

  TEST_CASE("threads that run out of arena together grow it once, not once each") {
    // 4 threads keep 100 blocks of 64 KiB each (26 MB with their headers):
    // arena segments of 4, 8 and 16 MiB hold them all, made one at a time.
    strategy_scope scope(sharing_strategy::file_system);
    const auto before = named_segments_of(::getpid()).size();
    std::vector<std::vector<storage>> kept(4);
    std::vector<std::thread> threads;
    for (auto& mine : kept) {
      threads.emplace_back([&mine] {
        for (int i = 0; i < 100; ++i) mine.push_back(storage::allocate_shared(64 << 10));
      });
    }
    for (auto& t : threads) t.join();
    CHECK(named_segments_of(::getpid()).size() - before <= 3);
  }

  TEST_CASE("storages made in one thread and dropped in another, also as a thread ends, stay distinct") {
    // Storage objects are reused through per-thread caches: one made in a
    // thread and dropped in another, or dropped by a thread-local as its
    // thread ends, must never be handed out twice. (Blocks of 128 bytes and
    // more, to leave the smallest class's free list to the test that
    // counts on it.)
    struct holder {
      std::vector<storage> kept;
    };
    static thread_local holder at_exit;
    std::vector<storage> passed;
    std::thread maker([&] {
      at_exit.kept.push_back(storage::allocate_shared(128));  // made before this thread's cache: dropped after it
      for (int i = 0; i < 2000; ++i) {
        storage s = storage::allocate_shared(128 + i % 128);
        std::memset(s.data(), i % 251, s.nbytes());
        passed.push_back(s);
        at_exit.kept.push_back(std::move(s));
      }
    });
    maker.join();
    REQUIRE(passed.size() == 2000);
    std::vector<storage> mine;
    for (int i = 0; i < 2000; ++i) {
      mine.push_back(storage::allocate_shared(128));
      std::memset(mine.back().data(), 0xff, 128);
    }
    int wrong = 0;
    for (int i = 0; i < 2000; ++i) {
      for (std::size_t b = 0; b < passed[i].nbytes(); ++b) wrong += std::to_integer<int>(passed[i].data()[b]) != i % 251;
    }
    CHECK(wrong == 0);
    std::set<const std::byte*> places;
    for (const auto& s : passed) places.insert(s.data());
    for (const auto& s : mine) places.insert(s.data());
    CHECK(places.size() == 4000);
  }

  TEST_CASE("threads allocating while another trims get blocks of their own that stay whole") {
    std::atomic<bool> done{false};
    std::thread trimmer([&] {
      while (!done.load()) trim_shared_memory();
    });
    std::vector<std::thread> threads;
    std::atomic<int> broken{0};
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        // Each storage kept holds a byte no other one kept holds.
        std::vector<std::pair<storage, int>> kept;
        const auto check = [&](const std::pair<storage, int>& k) {
          for (std::size_t b = 0; b < k.first.nbytes(); ++b) {
            if (std::to_integer<int>(k.first.data()[b]) != k.second) ++broken;
          }
        };
        for (int i = 0; i < 3000; ++i) {
          // Mostly arena blocks, now and then a segment of its own.
          storage s = storage::allocate_shared(i % 500 == 0 ? (std::size_t{1} << 20) : 128 + i % 200);
          const int value = t * 80 + i % 80;
          std::memset(s.data(), value, s.nbytes());
          kept.emplace_back(std::move(s), value);
          if (kept.size() == 80) {
            for (const auto& k : kept) check(k);
            kept.erase(kept.begin(), kept.begin() + 40);
          }
        }
        for (const auto& k : kept) check(k);
      });
    }
    for (auto& t : threads) t.join();
    done = true;
    trimmer.join();
    CHECK(broken == 0);
  }

  TEST_CASE("shared storage is aligned, sized as asked, and writable") {
    for (auto strategy : strategies) {
      strategy_scope scope(strategy);
      for (std::size_t n : {std::size_t{1}, std::size_t{40}, std::size_t{4096}, std::size_t{300000}}) {
        storage s = storage::allocate_shared(n);
        CHECK(s.is_shared());
        CHECK(s.nbytes() == n);
        CHECK(reinterpret_cast<std::uintptr_t>(s.data()) % 64 == 0);
        std::memset(s.data(), 0xab, n);
        CHECK(std::to_integer<int>(s.data()[n - 1]) == 0xab);
      }
    }
  }

  // Before, the rounding up to whole lines and pages wrapped: a storage of
  // almost 2^64 bytes came back over 0 or 4096 bytes of memory.
  TEST_CASE("sizes no memory can hold are refused, not wrapped") {
    constexpr auto most = std::numeric_limits<std::size_t>::max();
    CHECK_THROWS_AS(storage::allocate(most), std::bad_alloc);
    CHECK_THROWS_AS(storage::allocate(most - 10), std::bad_alloc);
    for (auto strategy : strategies) {
      strategy_scope scope(strategy);
      CHECK_THROWS_AS(storage::allocate_shared(most - 100), shm_error);
      CHECK_THROWS_AS(storage::allocate_shared(most / 2 + 1), shm_error);
    }
  }

  TEST_CASE("share_memory moves the bytes in place and every copy sees them") {
    storage s = storage::allocate(100);
    for (int i = 0; i < 100; ++i) s.data()[i] = std::byte(i);
    storage copy = s;
    CHECK_FALSE(copy.is_shared());
    s.share_memory();
    CHECK(copy.is_shared());
    CHECK(copy.data() == s.data());
    for (int i = 0; i < 100; ++i) CHECK(std::to_integer<int>(copy.data()[i]) == i);
  }

  // Before, each thread found the bytes private and moved them: the second
  // freed the first's shared bytes as if private, and free() aborted.
  TEST_CASE("threads moving or sending copies of one private storage at once move its bytes once") {
    for (int round = 0; round < 2000; ++round) {
      storage s = storage::allocate(256);
      for (int i = 0; i < 256; ++i) s.data()[i] = std::byte(i);
      storage moved = s, sent = s;
      std::atomic<int> ready{0};
      std::optional<decltype(encode(sent))> message;
      const auto together = [&ready](auto&& work) {
        ready.fetch_add(1);
        while (ready.load() < 2) {
        }
        work();
      };
      std::thread mover([&] { together([&] { moved.share_memory(); }); });
      std::thread sender([&] { together([&] { message = encode(sent); }); });
      mover.join();
      sender.join();
      REQUIRE(s.is_shared());
      REQUIRE(moved.data() == sent.data());
      CHECK(decode<storage>(*message).same(s));
      int wrong = 0;
      for (int i = 0; i < 256; ++i) wrong += std::to_integer<int>(s.data()[i]) != i;
      REQUIRE(wrong == 0);
    }
    CHECK(trim_shared_memory() >= 0);
  }

  TEST_CASE("a storage encoded and decoded in its own process is the same storage") {
    storage s = storage::allocate_shared(64);
    auto back = decode<std::tuple<storage, storage>>(encode(std::tuple{s, s}));
    CHECK(std::get<0>(back).same(s));
    CHECK(std::get<1>(back).same(s));
  }

  TEST_CASE("an empty storage crosses as an empty storage") {
    CHECK(decode<storage>(encode(storage())).nbytes() == 0);
  }

  // Before, each refused handle left an empty entry in the table for good.
  TEST_CASE("a handle refused as naming a freed block leaves the table of storages as it was") {
    std::vector<std::byte> bytes;  // the handle alone, without the holds an encoded value keeps
    {
      const storage s = storage::allocate_shared(64);
      const auto handle = encode(s);
      bytes.assign(handle.bytes().begin(), handle.bytes().end());
    }
    const auto before = detail::storage_identities();
    for (int i = 0; i < 3; ++i) {
      CHECK_THROWS_WITH_AS(decode<storage>(encoded::from_bytes(bytes)), doctest::Contains("freed"), shm_error);
    }
    CHECK(detail::storage_identities() == before);
  }

  // Before, every storage of 0 bytes crossed as an empty byte: a shared one
  // came back as another storage, not shared.
  TEST_CASE("a shared storage of 0 bytes stays itself and shared when it crosses") {
    for (auto strategy : strategies) {
      CAPTURE(to_string(strategy));
      strategy_scope scope(strategy);
      storage s = storage::allocate_shared(0);
      REQUIRE(s.is_shared());
      const auto back = decode<storage>(encode(s));
      CHECK(back.same(s));
      CHECK(back.is_shared());
      CHECK(back.nbytes() == 0);
      CHECK(s.data() == nullptr);  // as for every empty storage
      CHECK(back.data() == nullptr);
    }
  }

  TEST_CASE("a child started by each start method writes into a storage the parent shares") {
    for (auto strategy : strategies) {
      strategy_scope scope(strategy);
      for (auto method : methods) {
        CAPTURE(to_string(strategy));
        CAPTURE(to_string(method));
        storage s = storage::allocate(4);
        std::memset(s.data(), 0, 4);
        spawn_and_join(fill_at_rank, std::tuple{s, 0x5a}, 4, test::join_by(method));
        CHECK(s.is_shared());
        for (int r = 0; r < 4; ++r) CHECK(std::to_integer<int>(s.data()[r]) == 0x5a);
      }
    }
  }

  TEST_CASE("a storage sent twice arrives in the child as one storage") {
    for (auto strategy : strategies) {
      strategy_scope scope(strategy);
      storage s = storage::allocate_shared(1 << 20);
      auto same = spawn_and_join(same_twice, std::tuple{s, s}, 1);
      CHECK(same.at(0));
    }
  }

  TEST_CASE("a forked child sees a shared storage made before the fork") {
    for (auto strategy : strategies) {
      strategy_scope scope(strategy);
      inherited = storage::allocate_shared(8);
      inherited.data()[7] = std::byte{99};
      CHECK(spawn_and_join(read_inherited, std::tuple{}, 2, test::join_by(start_method::fork)) == std::vector{99, 99});
      inherited = storage();
    }
  }

  // Before, a plain fork's child took a hold of its own on every block
  // this process held, and an exec dropped the child's memory without
  // giving them back: the blocks stayed allocated for good, and under
  // file_system the arena's file stayed in /dev/shm after this process.
  TEST_CASE("a plain fork's child keeps this process's blocks until it execs, then holds none of them") {
    for (auto strategy : strategies) {
      INFO(to_string(strategy));
      strategy_scope scope(strategy);  // checks that no file is left
      const storage kept = storage::allocate_shared(64);
      storage dropped = storage::allocate_shared(64);
      std::memset(dropped.data(), 0x5a, 64);
      // The child finds its copy of `dropped` whole after this process let
      // go of it and carved blocks of the same size and wrote them.
      plain_child child([d = dropped.data()] {
        for (int i = 0; i < 64; ++i) {
          if (d[i] != std::byte{0x5a}) return 3;
        }
        return 0;
      });
      CHECK(detail::shared_holders(kept) == 2);
      const std::byte* const at = dropped.data();
      dropped = storage();
      auto more = test::carve_over(at);
      int status = 0;
      REQUIRE_MESSAGE(child.exec(status), "the child ended with status ", status, " before its exec");
      more.clear();
      trim_shared_memory();
      CHECK(detail::shared_holders(kept) == 1);
    }
  }

  TEST_CASE("a plain fork's child that drops what it inherited and ends lets go of nothing of this process's") {
    storage s = storage::allocate_shared(64);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      s = storage();
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    trim_shared_memory();
    CHECK(detail::shared_holders(s) == 1);  // 0: the child's drop took this process's hold
  }

  TEST_CASE("a plain fork's child and the child it forks keep the blocks until both have exec'd or ended") {
    const storage s = storage::allocate_shared(64);
    int grandchild_pid[2], hold[2];
    REQUIRE(::pipe(grandchild_pid) == 0);
    REQUIRE(::pipe(hold) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const pid_t grandchild = ::fork();
      if (grandchild == 0) {
        char c = 0;
        ::close(hold[1]);
        (void)!::read(hold[0], &c, 1);  // until the test closes its end
        ::_exit(s.data()[0] == std::byte{0} ? 0 : 1);
      }
      (void)!::write(grandchild_pid[1], &grandchild, sizeof grandchild);
      ::_exit(grandchild > 0 ? 0 : 1);
    }
    ::close(hold[0]);
    ::close(grandchild_pid[1]);
    pid_t grandchild = -1;
    REQUIRE(::read(grandchild_pid[0], &grandchild, sizeof grandchild) == sizeof grandchild);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(grandchild > 0);
    trim_shared_memory();
    CHECK(detail::shared_holders(s) == 2);  // the grandchild may still read it
    ::close(hold[1]);
    // The grandchild's copy of the pipe's write end goes as it ends.
    char c = 0;
    CHECK(::read(grandchild_pid[0], &c, 1) == 0);
    ::close(grandchild_pid[0]);
    trim_shared_memory();
    CHECK(detail::shared_holders(s) == 1);
  }

  TEST_CASE("values in a queue are dropped by its last holder once a plain fork's child has exec'd") {
    const storage kept = storage::allocate_shared(64);
    {
      queue<storage> q(4);
      REQUIRE(q.put(kept, std::chrono::seconds(1)));
      CHECK(detail::shared_holders(kept) == 2);
      plain_child child([] { return 0; });
      int status = 0;
      REQUIRE_MESSAGE(child.exec(status), "the child ended with status ", status, " before its exec");
    }
    CHECK(detail::shared_holders(kept) == 1);
  }

  TEST_CASE("values in a queue let go of here while a plain fork's child could pop them are dropped once it exec'd") {
    const storage kept = storage::allocate_shared(64);
    std::optional<plain_child> child;
    {
      queue<storage> q(4);
      REQUIRE(q.put(kept, std::chrono::seconds(1)));
      child.emplace([] { return 0; });
    }
    // This process's, the value's in the queue, and the one kept for the child.
    CHECK(detail::shared_holders(kept) == 3);
    int status = 0;
    REQUIRE_MESSAGE(child->exec(status), "the child ended with status ", status, " before its exec");
    trim_shared_memory();
    CHECK(detail::shared_holders(kept) == 1);
  }

  // Before, a segment of its own that this process made was kept once for
  // each storage over its block that ended while another process held it:
  // this process's own, then one decoded from a value of it popped here or
  // left in a queue. Kept twice, it was never let go of once only a killed
  // child held it: under file_system its file stayed in /dev/shm, under
  // file_descriptor its memory stayed, until this process ended.
  TEST_CASE("a large storage that only an ended child still holds is let go of after a value of it is popped or drained") {
    for (auto strategy : strategies) {
      for (const bool drained : {true, false}) {
        INFO(to_string(strategy), drained ? std::string(", drained") : std::string(", popped back"));
        strategy_scope scope(strategy);  // checks that no file is left
        std::uint64_t nonce = 0;
        {
          queue<storage> q(4);
          // Private: its first put moves it into a segment of its own.
          storage s = storage::allocate(300 << 10);
          const pid_t pid = ::fork();
          REQUIRE(pid >= 0);
          if (pid == 0) {
            const auto v = q.get(std::chrono::seconds(5));
            ::_exit(v ? 0 : 1);  // its hold on the block is never given back
          }
          REQUIRE(q.put(s, std::chrono::seconds(1)));
          int status = 0;
          REQUIRE(::waitpid(pid, &status, 0) == pid);
          REQUIRE(WIFEXITED(status));
          REQUIRE(WEXITSTATUS(status) == 0);
          nonce = detail::segment_of(s);
          REQUIRE(nonce != 0);
          // Mapped here under its name while held (a file_system segment
          // was mapped through its unnamed file, which maps shows as
          // "#<inode> (deleted)"): the check below that no mapping is left
          // could not fail.
          CHECK(mappings_of(nonce) > 0);
          REQUIRE(q.put(s, std::chrono::seconds(1)));
          s = storage();
          if (!drained) CHECK(q.get(std::chrono::seconds(1)).has_value());
        }  // the queue's last holder drops what is left in it
        trim_shared_memory();
        CHECK(mappings_of(nonce) == 0);
      }
    }
  }

  // Before, each later fork's child dropped the copy it inherited of this
  // process's hold on the queue kept for the first child, and gave back a
  // hold it never had: two such forks freed the queue's memory, and the
  // next queue made here took it over.
  TEST_CASE("a queue let go of here while a plain fork's child could pop it stays whole across later forks") {
    std::optional<plain_child> consumer;
    {
      queue<int> q(8);
      for (int i = 1; i <= 4; ++i) REQUIRE(q.put(i, std::chrono::seconds(1)));
      consumer.emplace([&q] {
        for (int i = 1; i <= 4; ++i) {
          const auto v = q.get(std::chrono::seconds(2));
          if (!v || *v != i) return 1;
        }
        return 0;
      });
    }
    for (int i = 0; i < 2; ++i) {
      plain_child later([] { return 0; });
      int status = 0;
      REQUIRE(later.exec(status));
    }
    queue<int> other(8);
    for (int i = 0; i < 4; ++i) REQUIRE(other.put(42, std::chrono::seconds(1)));
    int status = 0;
    CHECK_MESSAGE(consumer->exec(status), "the consumer popped other values: status ", status);
  }

  TEST_CASE("a fork while another thread makes and drops storages leaves the child an arena it can use") {
    // With a second thread, the fork holds the arena's locks across it: the
    // child must find none held by a thread it does not have.
    struct churning {  // stopped and joined however the case ends
      std::atomic<bool> stop{false};
      std::thread thread;
      ~churning() {
        stop = true;
        thread.join();
      }
    } churn;
    churn.thread = std::thread([&stop = churn.stop] {
      while (!stop.load(std::memory_order_relaxed)) {
        storage s = storage::allocate_shared(64);
        s.data()[0] = std::byte{1};
      }
    });
    for (int i = 0; i < 50; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::alarm(5);  // a lock left held hangs the child: SIGALRM ends it
        storage s = storage::allocate_shared(64);
        s.data()[63] = std::byte{7};
        storage t = storage::allocate_shared(64);
        ::_exit(s.data() != t.data() && s.data()[63] == std::byte{7} ? 0 : 1);
      }
      REQUIRE(pid > 0);
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      INFO("fork ", i, ": status ", status);
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
    }
  }

  // Before, take_holds left the reference the record gave each storage
  // after the one that failed: the parent's block below stayed held for good.
  TEST_CASE("a result's holds that fail on a storage gone with its maker let go of the storage after it") {
    strategy_scope scope(sharing_strategy::file_descriptor);  // a child's segment goes with it
    const storage kept = storage::allocate_shared(64);
    REQUIRE(detail::shared_holders(kept) == 1);
    int ends[2];
    REQUIRE(::pipe(ends) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // As a rank's result is made: (its own storage, one it got), each
      // given a reference for the reader.
      const storage own = storage::allocate_shared(64);
      const auto record = detail::hold_for_receiver(encode(std::tuple{own, kept}));
      const bool written = ::write(ends[1], record.data(), record.size()) == static_cast<ssize_t>(record.size());
      detail::release_shared_memory_holds();  // as a forked rank does at its end
      ::_exit(written ? 0 : 1);
    }
    ::close(ends[1]);
    std::vector<std::byte> record;
    std::byte buffer[512];
    for (ssize_t n; (n = ::read(ends[0], buffer, sizeof buffer)) > 0;) record.insert(record.end(), buffer, buffer + n);
    ::close(ends[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    trim_shared_memory();  // what this process held for the child while it ran goes
    CHECK(detail::shared_holders(kept) == 2);  // this process's, and the record's
    auto value = encode(0);
    CHECK_THROWS(detail::take_holds(value, record));
    CHECK(detail::shared_holders(kept) == 1);
  }

  // Before, the refused handle's reference stayed on the block for good.
  TEST_CASE("a held storage named with another size in a record is refused and the record's reference let go") {
    const storage kept = storage::allocate_shared(64);
    auto record = detail::hold_for_receiver(encode(std::vector<storage>{kept}));
    REQUIRE(detail::shared_holders(kept) == 2);  // this process's, and the record's
    // The record ends with where each handle starts, then their count; a
    // handle ends with the storage's size in bytes.
    std::uint32_t count = 0, at = 0;
    std::memcpy(&count, record.data() + record.size() - sizeof count, sizeof count);
    REQUIRE(count == 1);
    std::memcpy(&at, record.data() + record.size() - sizeof count - sizeof at, sizeof at);
    const std::size_t size_at = at + detail::handle_codec<storage>::handle_size - sizeof(std::uint64_t);
    std::uint64_t nbytes = 0;
    std::memcpy(&nbytes, record.data() + size_at, sizeof nbytes);
    REQUIRE(nbytes == 64);
    nbytes = 32;
    std::memcpy(record.data() + size_at, &nbytes, sizeof nbytes);
    CHECK_THROWS_WITH_AS((void)detail::read_handle_record<std::vector<storage>>(record, "bytes follow"),
                         doctest::Contains("names one of 64 bytes"), decode_error);
    CHECK(detail::shared_holders(kept) == 1);
  }

  TEST_CASE("small storages come from a few segments, not one each") {
    for (auto strategy : strategies) {
      strategy_scope scope(strategy);
      const int fds = open_descriptors();
      std::vector<storage> many;
      for (int i = 0; i < 2000; ++i) many.push_back(storage::allocate_shared(40 + i % 200));
      CHECK(open_descriptors() - fds <= 2);
      CHECK(named_segments_of(::getpid()).size() <= 2);
    }
  }

  TEST_CASE("blocks another process freed last go back to their maker, which carves them again") {
    for (auto strategy : strategies) {
      strategy_scope scope(strategy);
      constexpr int n = 100;
      // A size class no other test here uses: its free list starts empty.
      constexpr std::size_t block_bytes = 1500;
      std::set<const std::byte*> used;
      {
        queue<storage> q(n);
        for (int i = 0; i < n; ++i) {
          storage s = storage::allocate_shared(block_bytes);
          used.insert(s.data());
          REQUIRE(q.put(s, std::chrono::seconds(1)));
        }
        REQUIRE(spawn_and_join(take_and_drop, std::tuple{q, n}, 1).at(0) == n);
      }
      const auto segments = named_segments_of(::getpid()).size();
      std::vector<storage> again;
      for (int i = 0; i < n; ++i) {
        again.push_back(storage::allocate_shared(block_bytes));
        CHECK(used.contains(again.back().data()));
      }
      CHECK(named_segments_of(::getpid()).size() == segments);
    }
  }

  TEST_CASE("trim lets an arena go only once every block is freed, here or by another process, and its name goes") {
    const auto seen = spawn_and_join(trim_while_blocks_held, std::tuple{}, 1).at(0);
    REQUIRE_MESSAGE(seen.size() == 6, fmt::format("seen: {}", fmt::join(seen, " ")));
    CHECK(seen[0] == 0);  // 16 blocks held: kept
    CHECK(seen[1] == 1);
    CHECK(seen[2] == 0);  // one held: kept
    CHECK(seen[3] == 1);
    CHECK(seen[4] == 1);  // none, the last freed by another process: let go
    CHECK(seen[5] == 0);  // and unlinked
  }

  // Before, a trim counted the segments kept for a rank that had ended as
  // gone, though the storages received from it still mapped them.
  TEST_CASE("trim counts none of a rank's segments that storages here still hold as gone") {
    CHECK(spawn_and_join(trim_while_received_held, std::tuple{}, 1).at(0) == 0);
  }

  TEST_CASE("a segment forked into more processes than its table of mappers holds is let go of once they have ended") {
    strategy_scope scope(sharing_strategy::file_system);
    {
      const storage s = storage::allocate_shared(100);
      for (int i = 0; i < 210; ++i) {
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) ::_exit(0);  // its hold on the storage is never given back
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
      }
    }
    trim_shared_memory();
    CHECK(named_segments_of(::getpid()).empty());
  }

  TEST_CASE("a named segment is mode 0600 and unlinked when its last block is freed") {
    strategy_scope scope(sharing_strategy::file_system);
    const auto before = named_segments_of(::getpid()).size();
    {
      storage big = storage::allocate_shared(8 << 20);
      const auto now = named_segments_of(::getpid());
      REQUIRE(now.size() == before + 1);
      struct stat st {};
      for (const auto& p : now) {
        REQUIRE(::stat(p.c_str(), &st) == 0);
        CHECK((st.st_mode & 0777) == 0600);
      }
    }
    CHECK(named_segments_of(::getpid()).size() == before);
  }

  TEST_CASE("a full /dev/shm is an shm_error at allocation naming the sizes") {
    strategy_scope scope(sharing_strategy::file_system);
    struct statvfs v {};
    REQUIRE(::statvfs("/dev/shm", &v) == 0);
    const std::size_t too_much = static_cast<std::size_t>(v.f_bavail) * v.f_frsize + (std::size_t{1} << 30);
    try {
      (void)storage::allocate_shared(too_much);
      FAIL("the allocation succeeded");
    } catch (const shm_error& e) {
      CHECK(e.requested() >= too_much);
      CHECK(e.available() > 0);
      CHECK(e.available() < too_much);
      CHECK(std::string(e.what()).find("/dev/shm") != std::string::npos);
    }
  }

  // Before, the arena grew only by its next size (twice the last, 4 MiB at
  // first): a small request failed while /dev/shm still had room for it.
  TEST_CASE("small storages fill a nearly full /dev/shm, and the error then names the request") {
    const int code = test::exit_code_in_child([] {
      // A /dev/shm of 3 MiB of this child's own: root only.
      if (::unshare(CLONE_NEWNS) != 0 || ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=3m") != 0) {
        return 77;
      }
      set_sharing_strategy(sharing_strategy::file_system);
      std::vector<storage> held;
      constexpr std::size_t each = 200 << 10;
      try {
        for (int i = 0; i < 100; ++i) held.push_back(storage::allocate_shared(each));
        return 2;  // 20 MiB in 3
      } catch (const shm_error& e) {
        if (e.requested() != each) return 3;
      }
      return held.size() >= 8 ? 0 : 10 + static_cast<int>(std::min<std::size_t>(held.size(), 9));
    });
    if (code == 77) {
      MESSAGE("no /dev/shm of its own could be mounted here: not checked");
    } else {
      CHECK(code == 0);
    }
  }

  // Before, an mmap refused for want of address space was reported as no
  // room in memory, with the memory available (plenty) beside it.
  TEST_CASE("a segment that the address space limit refuses says so") {
    const int code = test::exit_code_in_child([] {
      const auto size = test::status_field(::getpid(), "VmSize");
      const std::size_t kib = size ? std::stoul(*size) : 0;
      const rlimit limit{(kib << 10) + (std::size_t{64} << 20), RLIM_INFINITY};
      if (kib == 0 || ::setrlimit(RLIMIT_AS, &limit) != 0) return 77;
      try {
        (void)storage::allocate_shared(std::size_t{128} << 20);
        return 2;
      } catch (const shm_error& e) {
        const std::string what = e.what();
        return what.find("RLIMIT_AS") != std::string::npos && what.find("no room for") == std::string::npos ? 0 : 3;
      }
    });
    if (code == 77) {
      MESSAGE("the address space could not be limited here: not checked");
    } else {
      CHECK(code == 0);
    }
  }

  // Before, a segment longer than RLIMIT_FSIZE allows was SIGXFSZ at its
  // ftruncate, which ended the process and left a named segment's file.
  TEST_CASE("a segment longer than the file size limit allows is an shm_error, and leaves no file") {
    for (const auto strategy : strategies) {
      CAPTURE(static_cast<int>(strategy));
      const int code = test::exit_code_in_child([strategy] {
        set_sharing_strategy(strategy);
        const rlimit limit{std::size_t{1} << 20, RLIM_INFINITY};
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 77;
        const std::string own = fmt::format("cohort_{}_", ::getpid());
        auto own_files = [&own] {
          int n = 0;
          for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
            n += entry.path().filename().string().starts_with(own) ? 1 : 0;
          }
          return n;
        };
        try {
          (void)storage::allocate_shared(std::size_t{2} << 20);
          return 2;
        } catch (const shm_error& e) {
          if (std::string(e.what()).find("RLIMIT_FSIZE") == std::string::npos) return 3;
        }
        return own_files() == 0 ? 0 : 4;
      });
      CHECK(code == 0);
    }
  }

  TEST_CASE("a tampered handle is refused and the receiver keeps working") {
    storage s = storage::allocate_shared(64);
    const auto good = encode(s);
    const auto bytes = good.bytes();
    // Every single-byte change is either refused or, where it names the
    // same bytes (the message flag aside), harmless.
    int refused = 0;
    for (std::size_t i = 3; i < bytes.size(); ++i) {
      for (unsigned delta : {1u, 0x40u, 0x80u}) {
        std::vector<std::byte> bad(bytes.begin(), bytes.end());
        bad[i] ^= std::byte(delta);
        try {
          storage got = decode<storage>(bad);
          CHECK(got.same(s));
        } catch (const decode_error&) {
          ++refused;
        } catch (const shm_error&) {
          ++refused;
        }
      }
    }
    CHECK(refused > 0);
    CHECK(decode<storage>(good).same(s));
  }

  TEST_CASE("a handle whose block names a place inside another block is refused, and that block's bytes stay") {
    // Data that reads as a large capacity wherever a header is looked for.
    storage ones = storage::allocate_shared(256);
    const std::vector<float> values(64, 1.0f);
    std::memcpy(ones.data(), values.data(), 256);
    const auto good = encode(ones);
    const std::vector<std::byte> bytes(good.bytes().begin(), good.bytes().end());
    // The handle's block offset and byte count (its fields at 32 and 40),
    // after the value's two leading bytes.
    constexpr std::size_t block_at = 2 + 32;
    REQUIRE(bytes.size() >= block_at + 16);
    std::uint64_t block = 0, nbytes = 0;
    std::memcpy(&block, bytes.data() + block_at, 8);
    std::memcpy(&nbytes, bytes.data() + block_at + 8, 8);
    REQUIRE(nbytes == 256);
    REQUIRE(block % 64 == 0);
    for (const std::uint64_t shift : {64u, 128u, 192u}) {
      CAPTURE(shift);
      auto bad = bytes;
      const std::uint64_t inside = block + shift;
      std::memcpy(bad.data() + block_at, &inside, 8);
      CHECK_THROWS_WITH_AS((void)decode<storage>(bad), doctest::Contains("is no block of its"), decode_error);
    }
    CHECK(std::memcmp(ones.data(), values.data(), 256) == 0);
    CHECK(decode<storage>(good).same(ones));
  }

  TEST_CASE("a handle whose message flag was set outside a queue is refused and frees nothing") {
    storage s = storage::allocate_shared(64);
    std::memset(s.data(), 7, 64);
    const auto good = encode(s);
    // [signature length][signature "S"][kind][strategy][message flag]...
    std::vector<std::byte> forged(good.bytes().begin(), good.bytes().end());
    REQUIRE(forged[4] == std::byte{0});
    forged[4] = std::byte{1};
    // Carried as plain bytes, as a user could carry an encoded value.
    auto q = make_queue<std::vector<std::byte>>(4);
    q.put(forged);
    const auto carried = q.get();
    REQUIRE(carried.has_value());
    CHECK_THROWS_WITH_AS(decode<storage>(*carried), doctest::Contains("claims a queue's reference"), decode_error);
    // No reference was dropped: the block is still s's, and a new one lands elsewhere.
    storage other = storage::allocate_shared(64);
    CHECK(other.data() != s.data());
    CHECK(std::to_integer<int>(s.data()[0]) == 7);
    CHECK(decode<storage>(good).same(s));
  }

  TEST_CASE("a handle cut short anywhere is refused") {
    storage s = storage::allocate_shared(64);
    const auto good = encode(s);
    const auto bytes = good.bytes();
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      CAPTURE(n);
      CHECK_THROWS_AS((void)decode<storage>(bytes.first(n)), decode_error);
    }
    CHECK(decode<storage>(good).same(s));
  }

  TEST_CASE("a handle whose descriptor names another of the sender's segments is refused") {
    // The sender makes two segments and sends both handles; the receiver
    // gets the first with the second's descriptor number, and must find it
    // out from the segment's header once it has opened it.
    std::vector<storage> kept;
    const sender child([&] {
      kept = {storage::allocate_shared(1 << 20), storage::allocate_shared(1 << 20)};
      kept[0].data()[0] = std::byte{1};
      kept[1].data()[0] = std::byte{2};
      return std::vector<std::vector<std::byte>>{handle_bytes(kept[0]), handle_bytes(kept[1])};
    });
    const auto& handles = child.handles();
    REQUIRE(handles.size() == 2);
    const auto fd_a = descriptor_field(handles[0], child.pid());
    const auto fd_b = descriptor_field(handles[1], child.pid());
    REQUIRE(fd_a != fd_b);
    auto swapped = handles[0];
    set_descriptor_field(swapped, child.pid(), fd_b);
    CHECK_THROWS_AS((void)decode<storage>(swapped), shm_error);
    CHECK(decode<storage>(handles[1]).data()[0] == std::byte{2});
    CHECK(decode<storage>(handles[0]).data()[0] == std::byte{1});
  }

  TEST_CASE("a handle whose descriptor names a plain file dressed as a segment is refused") {
    // The sender copies a real segment's header into a file that cannot be
    // sealed and names that file in the handle: the receiver must refuse it
    // rather than map a file its sender could shrink under it.
    std::vector<storage> kept;
    const sender child([&] {
      kept = {storage::allocate_shared(1 << 20)};
      const std::byte* base = kept[0].data() - 4096;  // a segment of its own: the header page, then the block
      std::uint64_t size = 0;
      std::memcpy(&size, base + 16, sizeof size);  // after the magic and the nonce
      char path[] = "/tmp/cohort_forged_XXXXXX";
      const int file = ::mkstemp(path);
      ::unlink(path);
      if (file < 0 || ::ftruncate(file, static_cast<off_t>(size)) != 0 || ::pwrite(file, base, 4096, 0) != 4096) {
        return std::vector<std::vector<std::byte>>{};
      }
      auto forged = handle_bytes(kept[0]);
      set_descriptor_field(forged, ::getpid(), static_cast<std::uint32_t>(file + 1));
      return std::vector<std::vector<std::byte>>{forged};
    });
    REQUIRE(child.handles().size() == 1);
    CHECK_THROWS_AS((void)decode<storage>(child.handles()[0]), shm_error);
  }

  // Before, the receiver opened what the handle's descriptor named without
  // O_NOCTTY: a session leader with no terminal took a terminal named there
  // as its own, whatever the refusal that followed.
  TEST_CASE("a handle whose descriptor names a terminal is refused, and the receiver does not take the terminal") {
    std::vector<storage> kept;
    const sender child([&] {
      kept = {storage::allocate_shared(1 << 20)};
      const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
      if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return std::vector<std::vector<std::byte>>{};
      const int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
      if (terminal < 0) return std::vector<std::vector<std::byte>>{};
      auto forged = handle_bytes(kept[0]);
      set_descriptor_field(forged, ::getpid(), static_cast<std::uint32_t>(terminal + 1));
      return std::vector<std::vector<std::byte>>{forged};
    });
    if (child.handles().empty()) {
      MESSAGE("no pseudo-terminal to be had here: not checked");
      return;
    }
    // A session leader without a terminal receives it: 0, refused and no
    // terminal taken; 1, a terminal taken; 2, accepted.
    const pid_t receiver = ::fork();
    if (receiver == 0) {
      if (::setsid() < 0) ::_exit(3);
      int code = 2;
      try {
        (void)decode<storage>(child.handles()[0]);
      } catch (const shm_error&) {
        code = 0;
      }
      const int tty = ::open("/dev/tty", O_RDWR | O_NOCTTY);
      ::_exit(tty >= 0 ? 1 : code);
    }
    REQUIRE(receiver > 0);
    int status = 0;
    REQUIRE(::waitpid(receiver, &status, 0) == receiver);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TEST_CASE("a handle whose holder has exited is an shm_error naming it") {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      storage s = storage::allocate_shared(1 << 20);
      const auto e = encode(s);
      (void)!::write(pipe_fds[1], e.bytes().data(), e.size());
      ::_exit(0);
    }
    ::close(pipe_fds[1]);
    std::vector<std::byte> bytes(4096);
    const auto n = ::read(pipe_fds[0], bytes.data(), bytes.size());
    ::close(pipe_fds[0]);
    REQUIRE(::waitpid(pid, nullptr, 0) == pid);
    REQUIRE(n > 0);
    bytes.resize(static_cast<std::size_t>(n));
    try {
      (void)decode<storage>(bytes);
      FAIL("the handle was accepted");
    } catch (const shm_error& e) {
      CHECK(std::string(e.what()).find(std::to_string(pid)) != std::string::npos);
    }
  }
}

// Before, a process that called exit() holding file_system storages (whose
// destructors exit() skips) left their files in /dev/shm for good.
TEST_CASE("a process that exits holding named storages removes their names, but not one a value in flight names") {
  strategy_scope scope(sharing_strategy::file_system);
  queue<storage> q(4);
  const pid_t child = ::fork();
  if (child == 0) {
    set_sharing_strategy(sharing_strategy::file_system);
    new storage(storage::allocate_shared(1 << 10));   // never destroyed: exit() skips it
    new storage(storage::allocate_shared(8 << 20));   // a segment of its own
    storage sent = storage::allocate_shared(2 << 20);  // a segment of its own, which a value names
    std::memset(sent.data(), 9, sent.nbytes());
    q.put(sent);
    new storage(std::move(sent));
    std::exit(named_segments_of(::getpid()).size() == 3 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  const auto left = named_segments_of(child);
  CHECK(left.size() == 1);  // the one the value in flight names
  {
    const auto got = q.get(std::chrono::seconds(10));
    REQUIRE(got);
    CHECK(got->nbytes() == (std::size_t{2} << 20));
    CHECK(std::to_integer<int>(got->data()[12345]) == 9);
  }
  trim_shared_memory();
  CHECK(named_segments_of(child).empty());  // the receiver, last, removed it
}

// This process's descriptors of memfd segments.
int memfd_segments_held() {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    n += fs::read_symlink(e.path(), ec).string().starts_with("/memfd:cohort");
  }
  return n;
}

// Before, a keeper let go of what it kept only as another rank ended, at a
// trim, or as its last queue object went: a rank's returned tensor stayed
// in memory after the caller dropped it, for as long as nothing else ran.
TEST_CASE("a keeper lets go of a rank's returned memory soon after the caller drops it") {
  REQUIRE(get_sharing_strategy() == sharing_strategy::file_descriptor);
  const int before = memfd_segments_held();
  {
    const auto results = spawn_and_join(made_at_rank, std::tuple{std::size_t{32} << 20}, 1);
    REQUIRE(results.size() == 1);
    CHECK(std::to_integer<int>(results[0].data()[(std::size_t{32} << 20) - 1]) == 1);
    CHECK(memfd_segments_held() > before);
  }
  CHECK(test::within(std::chrono::seconds(5), [&] { return memfd_segments_held() == before; },
                     std::chrono::milliseconds(10)));
}

// Before, the sweep at a group's end unlinked every file named for a rank's
// pid: a process that took the pid of a rank that had ended lost its files,
// and its receivers could no longer open its segments.
TEST_CASE("a run's sweep removes an ended or unreaped rank's files and passes over a live process's with its pid") {
  strategy_scope scope(sharing_strategy::file_system);
  const pid_t child = ::fork();
  if (child == 0) {
    storage s = storage::allocate_shared(1 << 20);
    ::_exit(named_segments_of(::getpid()).empty() ? 1 : 0);  // leaves its file, as a killed rank does
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  REQUIRE(named_segments_of(child).size() == 1);
  const storage mine = storage::allocate_shared(1 << 20);
  const auto own = named_segments_of(::getpid());
  REQUIRE(own.size() == 1);
  // This process stands for one that took an ended rank's pid. The child
  // ran with no run's marker: another run that ends meanwhile on this
  // machine passes over its file.
  const pid_t ranks[] = {child, ::getpid()};
  CHECK(shm::sweep_segments_of_run(ranks, {}, test_run_marker, [](pid_t) { return false; }) == 1);
  CHECK(named_segments_of(child).empty());
  CHECK(named_segments_of(::getpid()) == own);
  // A rank still unreaped is the process its pid names: its files go.
  const pid_t unreaped[] = {::getpid()};
  CHECK(shm::sweep_segments_of_run(unreaped, unreaped, test_run_marker, [](pid_t) { return false; }) == 1);
  CHECK(named_segments_of(::getpid()).empty());
  CHECK(mine.is_shared());
}

// A forked child holding a named storage of a segment of its own until
// this object goes. With the start time in the segment's header changed,
// it stands for a process that took the pid of the segment's maker, which
// has ended. It runs with test_run_marker in its environment, as a process
// of a run that only these tests sweep.
class pid_taker {
 public:
  pid_taker() {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::putenv(test_run_marker);
      const storage s = storage::allocate_shared(1 << 20);  // a segment of its own
      (void)!::write(ready[1], "r", 1);
      ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte = 0;
    const bool made = ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
    REQUIRE(made);
    const auto files = named_segments_of(pid_);
    REQUIRE(files.size() == 1);
    file_ = files[0];
    const auto name = file_.filename().string();
    nonce_ = std::strtoull(name.substr(name.rfind('_') + 1).c_str(), nullptr, 16);
  }
  pid_taker(const pid_taker&) = delete;
  pid_taker& operator=(const pid_taker&) = delete;
  ~pid_taker() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    std::error_code ec;
    fs::remove(file_, ec);
  }

  pid_t pid() const { return pid_; }
  const fs::path& file() const { return file_; }
  shm::segment_ref ref() const {
    shm::segment_ref r;
    r.strategy = sharing_strategy::file_system;
    r.source = r.maker = pid_;
    r.nonce = nonce_;
    return r;
  }
  /// A start time other than its own: an earlier process of its pid's.
  std::uint64_t other_start_time() const { return os::start_time_of(pid_).value_or(1) + 1; }

 private:
  pid_t pid_ = -1;
  fs::path file_;
  std::uint64_t nonce_ = 0;
};

// Before, a segment's last mapper judged its maker by the pid alone: a
// process that had taken the pid of the ended maker kept the name for good.
TEST_CASE("a named segment whose ended maker's pid another process took loses its name as its last mapper lets go") {
  strategy_scope scope(sharing_strategy::file_system);
  const pid_taker taker;
  {
    const auto s = shm::segment::open(taker.ref());
    CHECK_FALSE(s->orphaned());  // its maker runs
    s->header().maker_start_time = taker.other_start_time();
    CHECK(s->orphaned());
  }
  trim_shared_memory();  // this process, its last mapper, unmaps it
  CHECK_FALSE(fs::exists(taker.file()));
}

// Before, the sweep passed over a file of a rank's child while any
// process had its pid.
TEST_CASE("a run's sweep removes a rank's child's file nothing reaches, though its maker's pid was taken since") {
  strategy_scope scope(sharing_strategy::file_system);
  const pid_taker taker;
  const auto made_by_run = [&taker](pid_t maker) { return maker == taker.pid(); };
  CHECK(shm::sweep_segments_of_run({}, {}, test_run_marker, made_by_run) == 0);  // its maker runs
  {
    const int fd = ::open(taker.file().c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const auto start = taker.other_start_time();
    const auto written = ::pwrite(fd, &start, sizeof start, offsetof(shm::segment_header, maker_start_time));
    ::close(fd);
    REQUIRE(written == static_cast<ssize_t>(sizeof start));
  }
  // Another run's sweep passes over it: its maker was no process of that run.
  CHECK(shm::sweep_segments_of_run({}, {}, "COHORT_GROUP_storage_tests_other=1", made_by_run) == 0);
  CHECK(fs::exists(taker.file()));
  CHECK(shm::sweep_segments_of_run({}, {}, test_run_marker, made_by_run) == 1);
  CHECK_FALSE(fs::exists(taker.file()));
}

// Forks a child that makes a file_system segment and _exits holding it, as
// a process killed holding it would; returns the child's pid once it is
// reaped, or -1.
pid_t leave_a_file() {
  const pid_t child = ::fork();
  if (child == 0) {
    set_sharing_strategy(sharing_strategy::file_system);
    const storage s = storage::allocate_shared(1 << 20);
    ::_exit(named_segments_of(::getpid()).empty() ? 1 : 0);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return child;
}

pid_t child_leaves_a_file(int) { return leave_a_file(); }
COHORT_ENTRYPOINT(child_leaves_a_file);

// Makes the file `started`, then waits until the file `release` exists
// (for at most a minute).
bool wait_for_release(int, std::string started, std::string release) {
  std::ofstream(started).put('s');
  return test::within(std::chrono::minutes(1), [&release] { return fs::exists(release); });
}
COHORT_ENTRYPOINT(wait_for_release);

TEST_CASE("a run's end removes the file a rank's child left, however the rank started") {
  for (const auto method : methods) {
    CAPTURE(to_string(method));
    const auto children = spawn_and_join(child_leaves_a_file, std::tuple{}, 1, test::join_by(method));
    REQUIRE(children.size() == 1);
    REQUIRE(children[0] > 0);
    CHECK(named_segments_of(children[0]).empty());
  }
}

// Before, a run's end removed the file of any process that had started
// since the run began and ended holding it, whatever it was: another
// program's, or a child of the run's own supervisor.
TEST_CASE("a run's end leaves the file of a process not of the run that ended while it ran") {
  const test::temp_dir dir;
  const auto started = dir.path / "started", release = dir.path / "release";
  std::exception_ptr error;
  std::vector<bool> released;
  std::thread run([&] {
    try {
      released = spawn_and_join(wait_for_release, std::tuple{started.string(), release.string()}, 1);
    } catch (...) {
      error = std::current_exception();
    }
  });
  // Started once the rank runs: within the run's window, but not of the run.
  const bool running = test::within(std::chrono::minutes(1), [&] { return fs::exists(started); });
  const pid_t child = running ? leave_a_file() : -1;
  std::ofstream(release).put('r');
  run.join();
  REQUIRE_FALSE(error);
  CHECK(released == std::vector{true});
  REQUIRE(child > 0);
  const auto files = named_segments_of(child);
  CHECK(files.size() == 1);
  for (const auto& file : files) fs::remove(file);
}

}  // namespace storage_tests

// Before, a handle naming a descriptor that was no segment of cohort's (a
// corrupt one, or a number since taken by another file) had the receiver
// open that file read-write before telling it apart, which for a FIFO or a
// device is not without effects.
TEST_CASE("a handle naming a descriptor that is not a cohort memfd is refused without opening it") {
  storage_tests::strategy_scope scope(sharing_strategy::file_descriptor);
  test::temp_dir dir;
  const auto path = dir.path / "plain";
  { std::ofstream(path) << "not a segment"; }
  const int file = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(file >= 0);
  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(watch >= 0);
  REQUIRE(::inotify_add_watch(watch, path.c_str(), IN_OPEN) >= 0);
  shm::segment_ref ref;
  ref.strategy = sharing_strategy::file_descriptor;
  ref.source = ref.maker = ::getpid();
  ref.fd = ref.maker_fd = file;
  ref.nonce = 0x5eed;
  CHECK_THROWS_AS(shm::segment::open(ref), shm_error);
  char events[4096];
  const ssize_t got = ::read(watch, events, sizeof events);
  CHECK(got < 0);  // no event: nothing opened the file
  CHECK(errno == EAGAIN);
  ::close(watch);
  ::close(file);
}
