// What every test file shares: the target program's path, running a
// coroutine to its end, and the io_uring mode the suite runs in.
#pragma once

#include <cohort/io_uring_info.hpp>

#include "support/read_file.hpp"

#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/read.hpp>
#include <asio/readable_pipe.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <system_error>
#include <vector>

namespace cohort::test {

/// The helper program driven by its first argument (tests/support/target.cpp).
inline const std::string target = COHORT_TEST_TARGET;
/// A program that supervises a group of sleeping ranks (tests/support/supervisor.cpp).
inline const std::string supervisor = COHORT_TEST_SUPERVISOR;
/// A program linked to the shared library whose rank throws (tests/support/thrower.cpp).
inline const std::string thrower = COHORT_TEST_THROWER;
/// A stand-in for the CUDA driver, libcuda.so.1 (tests/support/fake_driver/):
/// cuInit, and cuDeviceGet answering CUDA_ERROR_NOT_INITIALIZED before it.
inline const std::string fake_libcuda = COHORT_TEST_FAKE_LIBCUDA;

/// Whether this run was told to use the reactor (COHORT_IO_URING=0).
/// Whether the running kernel is at least `major`.`minor`.
inline bool kernel_at_least(int major, int minor) {
  utsname u{};
  int a = 0, b = 0;
  return ::uname(&u) == 0 && std::sscanf(u.release, "%d.%d", &a, &b) == 2 && (a > major || (a == major && b >= minor));
}

inline bool reactor_mode() {
  const char* v = std::getenv("COHORT_IO_URING");
  return v != nullptr && std::string_view(v) == "0";
}

/// The io_uring operation a program's io_uring run exists to test. Where
/// the kernel lacks it, that run would only repeat the reactor run, so main
/// skips the whole program with exit code 77 (meson reports SKIP), as
/// liburing's tests do. Declared once per program, at namespace scope:
///
///     const test::needs_ring_operation needs{"IORING_OP_WAITID", &io_uring_info::waitid};
struct needs_ring_operation {
  const char* name;
  bool io_uring_info::*available;
  needs_ring_operation(const char* name_, bool io_uring_info::*available_) : name(name_), available(available_) {
    declared() = this;
  }
  /// The program's declaration, or null when its io_uring run tests no one operation.
  static const needs_ring_operation*& declared() {
    static const needs_ring_operation* need = nullptr;
    return need;
  }
};

/// The device a program's tests need (a CUDA device: tests/cuda/). main
/// asks for it before any test, in a forked child, so that the program has
/// not initialised the device itself (a process that has initialised CUDA
/// may no longer fork ranks); where `why_not` answers a reason, main skips
/// the program with exit code 77. Declared once per program, at namespace
/// scope:
///
///     const test::needs_device needs{"a CUDA device", [] { return cuda::unavailable_reason(); }};
struct needs_device {
  const char* name;
  std::string (*why_not)();  ///< empty when the device is there
  needs_device(const char* name_, std::string (*why_not_)()) : name(name_), why_not(why_not_) { declared() = this; }
  /// The program's declaration, or null when its tests need no device.
  static const needs_device*& declared() {
    static const needs_device* need = nullptr;
    return need;
  }
};

/// Runs `work` on `io` with `threads` threads until io runs out of work;
/// returns its result or rethrows its exception. It completes through a
/// plain callback, which runs on `io`: asio::use_future's completion is
/// posted through asio's system executor, whose first use starts a pool of
/// threads that lasts the program, and a plain fork of a program with such
/// threads hangs in the pool's destructor when it calls exit().
template <class T>
T run(asio::io_context& io, asio::awaitable<T> work, int threads = 1) {
  std::exception_ptr error;
  bool done = false;
  std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> result;
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(io, std::move(work), [&](std::exception_ptr e) {
      error = e;
      done = true;
    });
  } else {
    asio::co_spawn(io, std::move(work), [&](std::exception_ptr e, T value) {
      error = e;
      if (!e) result.emplace(std::move(value));
      done = true;
    });
  }
  std::vector<std::thread> extra;
  for (int i = 1; i < threads; ++i) extra.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : extra) t.join();
  io.restart();
  if (error) std::rethrow_exception(error);
  if (!done) throw std::logic_error("test::run: the work ended without completing");
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

/// Whether `error` holds a std::system_error for operation_aborted: how a
/// cancelled cohort operation completes.
inline bool aborted(std::exception_ptr error) {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const std::system_error& e) {
    return e.code() == std::error_code(asio::error::operation_aborted);
  } catch (...) {
    return false;
  }
}

/// Runs `io` on a thread of its own until destroyed, kept busy by a work
/// guard: for operations awaited through asio::use_future.
class io_thread {
 public:
  explicit io_thread(asio::io_context& io) : io_(io), work_(io.get_executor()), thread_([&io] { io.run(); }) {}
  ~io_thread() {
    work_.reset();
    thread_.join();
    io_.restart();
  }

 private:
  asio::io_context& io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

/// A fresh directory under the temporary directory, removed with its contents.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "cohort-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::system_error(errno, std::system_category(), "mkdtemp");
    path = std::filesystem::canonical(pattern);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() { std::filesystem::remove_all(path); }
};

/// Whether `done()` holds within `limit`, asked every `tick` (and once more
/// at the end).
template <class Done>
bool within(std::chrono::milliseconds limit, Done done, std::chrono::milliseconds tick = std::chrono::milliseconds(1)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return done();
    std::this_thread::sleep_for(tick);
  }
  return true;
}

/// Runs `body` in a forked child, which ends with _exit of what it returns
/// (4 when it throws), and returns that code once the child is reaped; -1
/// when a signal ended it or no child could be forked. The tests take 77 as
/// "what it needs could not be set up here": not checked.
template <class Body>
int exit_code_in_child(Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 4;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

/// Reads a pipe until end of file.
inline asio::awaitable<std::string> read_all(asio::readable_pipe& pipe) {
  std::string text;
  std::error_code ec;  // asio::error::eof ends the read
  co_await asio::async_read(pipe, asio::dynamic_buffer(text), asio::redirect_error(asio::use_awaitable, ec));
  if (ec && ec != asio::error::eof) throw std::system_error(ec, "read_all");
  co_return text;
}

}  // namespace cohort::test
