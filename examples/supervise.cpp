// Spawns three children on one io_context and supervises them: reads one's
// output through a pipe, waits for all, and kills the one that overstays.
#include <cohort/cohort.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/read.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>

using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;

asio::awaitable<void> supervise() {
  // A child whose output we read through a pipe.
  // Commands and options are named before the co_await: g++ 12 miscompiles
  // aggregate temporaries inside a co_await expression.
  cohort::command greet{"sh", {"-c", "echo hello from pid $$; exit 3"}};
  cohort::spawn_options piped{.out = cohort::stdio::pipe()};
  cohort::child hello = co_await cohort::spawn(greet, piped);
  std::string text;
  std::error_code ec;
  co_await asio::async_read(hello.out(), asio::dynamic_buffer(text),
                            asio::redirect_error(asio::use_awaitable, ec));  // reads until EOF
  fmt::print("child {} said: {}", hello.pid(), text);
  fmt::print("child {} {}\n", hello.pid(), co_await hello.wait());

  // A child that crashes, with a changed environment.
  cohort::command crasher{"sh", {"-c", "echo \"GREETING=$GREETING\"; kill -SEGV $$"}};
  cohort::spawn_options greeting{.env = cohort::environment::inherit().set("GREETING", "hi")};
  cohort::child crash = co_await cohort::spawn(crasher, greeting);
  fmt::print("child {} {}\n", crash.pid(), co_await crash.wait());

  // A child that overstays: wait at most 200 ms, then stop it.
  cohort::command sleeper{"sleep", {"30"}};
  cohort::child slow = co_await cohort::spawn(sleeper);
  asio::steady_timer deadline(co_await asio::this_coro::executor, 200ms);
  auto first = co_await (slow.wait() || deadline.async_wait(asio::use_awaitable));
  if (first.index() == 1) {
    fmt::print("child {} still running after 200 ms: sending SIGTERM\n", slow.pid());
    slow.signal(SIGTERM);
  }
  cohort::exit_status st = co_await slow.wait();
  fmt::print("child {} {} (user {} us, max rss {} KiB)\n", slow.pid(), st,
             st.usage().user_time.count(), st.usage().max_rss_kib);
}

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // our lines and the children's, in order
  asio::io_context io;
  auto info = cohort::io_uring_support(io);
  fmt::print("exits arrive through {}\n", info.waitid ? "io_uring waitid" : "asio's reactor on the pidfd");
  asio::co_spawn(io, supervise(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  io.run();
}
