// A program that replaces the global operator new and delete, as heap
// profilers and pools do, with blocks that do not start where malloc's do:
// Asio's recycled handler memory passes between the program's code and the
// library's, and both must allocate and free it the same way.
#include "cohort/spawn.hpp"

#include <doctest/doctest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

namespace {

// Each block carries this before it; a delete of a pointer that is not
// one of ours stops the program (and one of ours freed by std::free makes
// glibc stop it).
constexpr std::size_t header = 16;
constexpr std::uint64_t mark = 0xc0407d0c0407d0c0;

void* take(std::size_t n) {
  auto* p = static_cast<unsigned char*>(std::malloc(n + header));
  if (p == nullptr) throw std::bad_alloc();
  *reinterpret_cast<std::uint64_t*>(p) = mark;
  return p + header;
}

void give(void* p) noexcept {
  if (p == nullptr) return;
  auto* block = static_cast<unsigned char*>(p) - header;
  if (*reinterpret_cast<std::uint64_t*>(block) != mark) std::abort();
  *reinterpret_cast<std::uint64_t*>(block) = 0;
  std::free(block);
}

}  // namespace

void* operator new(std::size_t n) { return take(n); }
void* operator new[](std::size_t n) { return take(n); }
void operator delete(void* p) noexcept { give(p); }
void operator delete[](void* p) noexcept { give(p); }
void operator delete(void* p, std::size_t) noexcept { give(p); }
void operator delete[](void* p, std::size_t) noexcept { give(p); }

TEST_SUITE("replaced operator new") {
  TEST_CASE("children spawned and awaited from four threads, under a replaced operator new") {
    {
      asio::io_context io;
      std::atomic<int> done{0};
      const cohort::command cmd("/bin/true");
      constexpr int children = 64;
      for (int i = 0; i < children; ++i) {
        asio::co_spawn(io, [&]() -> asio::awaitable<void> {
          const cohort::spawn_options options;
          cohort::child c = co_await cohort::spawn(cmd, options);
          const cohort::exit_status status = co_await c.wait();
          if (status.success()) done.fetch_add(1);
        }, asio::detached);
      }
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) threads.emplace_back([&io] { io.run(); });
      for (auto& t : threads) t.join();
      CHECK(done.load() == children);
    }
  }
}
