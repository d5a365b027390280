// Slurm's node lists, read for their first host as Slurm expands them, and
// a step's place from srun's variables.
#include "run/slurm.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

using cohort_run::nodelist_first_host;

TEST_SUITE("slurm") {
  TEST_CASE("node lists: the first host, with ranges, single numbers, widths kept, several groups, plain names") {
    CHECK(nodelist_first_host("node1") == "node1");
    CHECK(nodelist_first_host("gpu[01-03,7],cpu-a") == "gpu01");
    CHECK(nodelist_first_host("n[8-11]") == "n8");
    CHECK(nodelist_first_host("n[008-010]") == "n008");
    CHECK(nodelist_first_host("rack[1-2]-node[3,5]") == "rack1-node3");
    CHECK(nodelist_first_host("a,b[2],c") == "a");
    CHECK(nodelist_first_host("x[7,2-3]") == "x7");
    CHECK_FALSE(nodelist_first_host(""));
  }

  TEST_CASE("node lists Slurm would not write are refused, wherever in the list") {
    for (const char* bad : {"gpu[1-", "gpu1]", "gpu[]", "gpu[3-1]", "gpu[a-b]", "gpu[[1]]", "gpu[1-2-3]", "gpu[1,]",
                            "gpu[,1]", "a,gpu[1,]", "a,b[3-1]", "n[99999999999999999999]", "n[0-200000]"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(nodelist_first_host(bad), std::invalid_argument);
    }
  }

  TEST_CASE("a step's place: step variables before the job's; nothing outside srun") {
    for (const char* name : {"SLURM_STEP_ID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_JOB_ID",
                             "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST"}) {
      ::unsetenv(name);
    }
    CHECK_FALSE(cohort_run::slurm_step_from_environment());
    ::setenv("SLURM_NODEID", "2", 1);
    ::setenv("SLURM_NNODES", "4", 1);
    ::setenv("SLURM_JOB_ID", "77", 1);
    ::setenv("SLURM_JOB_NODELIST", "x[10-13]", 1);
    CHECK_FALSE(cohort_run::slurm_step_from_environment());  // a batch script, not srun
    ::setenv("SLURM_STEP_ID", "0", 1);
    auto step = cohort_run::slurm_step_from_environment();
    REQUIRE(step);
    CHECK(step->node_id == 2);
    CHECK(step->nnodes == 4);
    CHECK(step->job_id == "77");
    CHECK(step->first_host == "x10");
    ::setenv("SLURM_STEP_NUM_NODES", "3", 1);
    ::setenv("SLURM_STEP_NODELIST", "x[11-13]", 1);
    step = cohort_run::slurm_step_from_environment();
    REQUIRE(step);
    CHECK(step->nnodes == 3);
    CHECK(step->first_host == "x11");
    ::setenv("SLURM_NODEID", "3", 1);
    CHECK_THROWS_WITH_AS(cohort_run::slurm_step_from_environment(), doctest::Contains("SLURM_STEP_NUM_NODES"),
                         std::invalid_argument);
    ::setenv("SLURM_NODEID", "one", 1);
    CHECK_THROWS_WITH_AS(cohort_run::slurm_step_from_environment(), doctest::Contains("SLURM_NODEID"), std::invalid_argument);
  }

  TEST_CASE("a step's node list is read, not expanded: a list of 10^10 hosts gives its first; a bad part is named") {
    for (const char* name : {"SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST"}) {
      ::unsetenv(name);
    }
    ::setenv("SLURM_STEP_ID", "0", 1);
    ::setenv("SLURM_NODEID", "0", 1);
    ::setenv("SLURM_NNODES", "2", 1);
    ::setenv("SLURM_JOB_ID", "77", 1);
    ::setenv("SLURM_JOB_NODELIST", "n[00000-99999]x[0-99999]", 1);
    const auto step = cohort_run::slurm_step_from_environment();
    REQUIRE(step);
    CHECK(step->first_host == "n00000x0");
    CHECK(std::string(step->nodelist_name) == "SLURM_JOB_NODELIST");
    // A range list that ends in a comma names no range there.
    ::setenv("SLURM_JOB_NODELIST", "node[1,]", 1);
    CHECK_THROWS_WITH_AS(cohort_run::slurm_step_from_environment(), doctest::Contains("SLURM_JOB_NODELIST"),
                         std::invalid_argument);
    // A number too large for any count is out of range, not "not a number".
    ::setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
    ::setenv("SLURM_NODEID", "99999999999999999999", 1);
    CHECK_THROWS_WITH_AS(cohort_run::slurm_step_from_environment(), doctest::Contains("is out of range"),
                         std::invalid_argument);
  }
}
