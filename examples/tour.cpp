// The README's tour of the API, compiled with the examples.
#include <cohort/cohort.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/read.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

asio::awaitable<void> service() {
  // One child, its stdout piped back to us.
  cohort::command printenv("/usr/bin/env", {"FOO=1", "printenv", "FOO"});
  cohort::spawn_options options{.out = cohort::stdio::pipe()};
  cohort::child c = co_await cohort::spawn(printenv, options);

  std::string text;
  std::error_code eof;
  co_await asio::async_read(c.out(), asio::dynamic_buffer(text), asio::redirect_error(asio::use_awaitable, eof));

  cohort::exit_status st = co_await c.wait();  // reaps it; st.exited(), st.code(), st.signaled(), st.signal()
  fmt::print("printenv said {:?} and {}\n", text, st);  // ... and exited with code 0
}

int main() {
  asio::io_context io;
  asio::co_spawn(io, service(), asio::detached);
  io.run();

  // Plain blocking code: run() spawns and waits.
  cohort::exit_status st = cohort::run(cohort::command("sh", {"-c", "kill -KILL $$"}));
  fmt::print("{}\n", st);  // killed by signal SIGKILL (9)
}
