// torchrun's file-timer requests as torch's FileTimerClient writes them,
// and which timers expire, with which signal.
#include "run/file_timer.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

using cohort_run::parse_timer_request;
using cohort_run::timer_table;

namespace {

cohort_run::timer_request request(pid_t pid, std::string scope, double expires, int signal) {
  cohort_run::timer_request r;
  r.pid = pid;
  r.scope = std::move(scope);
  r.expires = expires;
  r.signal = signal;
  return r;
}

}  // namespace

TEST_SUITE("file timer") {
  TEST_CASE("a request as torch's FileTimerClient writes it is read whole; anything else is refused") {
    const auto r = parse_timer_request(
        R"({"version": 1, "pid": 4242, "scope_id": "train.py#12", "expiration_time": 1700000000.25, "signal": 9})");
    REQUIRE(r);
    CHECK(r->pid == 4242);
    CHECK(r->scope == "train.py#12");
    CHECK(r->expires == 1700000000.25);
    CHECK(r->signal == 9);
    const auto release =
        parse_timer_request(R"({"version": 1, "pid": 4242, "scope_id": "s", "expiration_time": -1, "signal": 0})");
    REQUIRE(release);
    CHECK(release->expires < 0);
    // The last signal the kernel knows, SIGRTMAX, is one; none names none.
    for (const int signal : {64, 0, -1}) {
      CAPTURE(signal);
      const auto r = parse_timer_request(fmt::format(
          R"({{"version": 1, "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": {}}})", signal));
      REQUIRE(r);
      CHECK(r->signal == signal);
    }
    for (const char* bad : {"", "not json", "[1, 2]", R"({"pid": 1, "scope_id": "s", "expiration_time": 1})",
                            R"({"pid": "1", "scope_id": "s", "expiration_time": 1, "signal": 9})",
                            R"({"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})",
                            R"({"pid": -5, "scope_id": "s", "expiration_time": 1, "signal": 9})",
                            R"({"pid": 1, "scope_id": 3, "expiration_time": 1, "signal": 9})",
                            R"({"pid": 1, "scope_id": "s", "expiration_time": "soon", "signal": 9})",
                            R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 65})",
                            R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 100})"}) {
      CAPTURE(bad);
      CHECK_FALSE(parse_timer_request(bad));
    }
  }

  TEST_CASE("an expired timer's process gets the signal of its earliest expired timer that names one, once") {
    timer_table t;
    t.apply(request(10, "late", 200, 15));
    t.apply(request(10, "early", 100, 0));
    t.apply(request(10, "middle", 150, 9));
    t.apply(request(20, "later", 500, 9));
    CHECK(t.next_expiry() == 100);
    CHECK(t.take_expired(50).empty());
    const auto expired = t.take_expired(300);
    REQUIRE(expired.size() == 1);
    CHECK(expired[0].first == 10);
    CHECK(expired[0].second.first == 9);  // "early" names none
    CHECK(expired[0].second.second == "middle");
    CHECK(t.take_expired(300).empty());   // every timer of pid 10 went with it
    CHECK(t.next_expiry() == 500);
  }

  TEST_CASE("a release ends its timer; setting a scope again moves its expiry; a process's timers go together") {
    timer_table t;
    t.apply(request(10, "s", 100, 9));
    t.apply(request(10, "s", -1, 0));
    CHECK_FALSE(t.next_expiry());
    CHECK(t.take_expired(1000).empty());
    t.apply(request(10, "s", 100, 9));
    t.apply(request(10, "s", 400, 9));
    CHECK(t.take_expired(300).empty());
    CHECK(t.take_expired(500).size() == 1);
    t.apply(request(10, "a", 100, 9));
    t.apply(request(11, "b", 200, 9));
    t.clear(10);  // the timers of a process that ended, its pid taken again
    CHECK(t.next_expiry() == 200);
  }
}
