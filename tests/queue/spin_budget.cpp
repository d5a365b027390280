#include "queue/spin_budget.hpp"

#include <doctest/doctest.h>

#include <chrono>

using cohort::detail::spin_budget;
using namespace std::chrono_literals;

TEST_SUITE("spin budget") {
  TEST_CASE("a new budget spins the longest, and waits answered at once bring it to the shortest and no lower") {
    spin_budget budget;
    CHECK(budget.get() == spin_budget::longest);
    for (int i = 0; i < 100; ++i) {
      budget.spun(0ns);
      CHECK(budget.get() >= spin_budget::shortest);
    }
    // A quarter of the way each time: within a microsecond after a hundred.
    CHECK(budget.get() <= spin_budget::shortest + 1us);
  }

  TEST_CASE("a wait answered within the spin moves the budget a quarter of the way towards twice its wait") {
    spin_budget budget;
    budget.spun(10us);  // towards 20 us, from 50
    CHECK(budget.get() == 42'500ns);
    budget.spun(10us);  // from 42.5
    CHECK(budget.get() == 36'875ns);
  }

  TEST_CASE("a sleep answered within the longest spin teaches as a spin that long would") {
    spin_budget slept, spun;
    slept.slept(10us, false);
    spun.spun(10us);
    CHECK(slept.get() == spun.get());
  }

  TEST_CASE("a sleep answered late, or stamped before the wait began, halves the budget down to the shortest") {
    spin_budget late, early;
    late.slept(spin_budget::longest + 1ns, false);
    CHECK(late.get() == spin_budget::longest / 2);
    early.slept(-1us, false);
    CHECK(early.get() == spin_budget::longest / 2);
    for (int i = 0; i < 10; ++i) late.slept(1s, false);
    CHECK(late.get() == spin_budget::shortest);
  }

  TEST_CASE("beside the other side on its CPU, an answer just after the spin halves the budget, where apart it holds") {
    // Both sides on one CPU: the wait spins its whole budget while the
    // other side cannot run, and the answer comes just after. Taken as a
    // sign that spinning pays, it would keep the budget at its longest.
    spin_budget apart, beside;
    for (int i = 0; i < 10; ++i) {
      apart.slept(spin_budget::longest - 5us, false);
      beside.slept(spin_budget::longest - 5us, true);
    }
    CHECK(apart.get() == spin_budget::longest);
    CHECK(beside.get() == spin_budget::shortest);
  }
}
