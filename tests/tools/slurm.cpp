// Slurm's node lists, expanded as Slurm expands them, and a step's place
// from srun's variables.
#include "run/slurm.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

using cohort_run::expand_nodelist;
using hosts = std::vector<std::string>;

TEST_SUITE("slurm") {
  TEST_CASE("node lists: ranges, single numbers, widths kept, several groups, plain names") {
    CHECK(expand_nodelist("node1") == hosts{"node1"});
    CHECK(expand_nodelist("gpu[01-03,7],cpu-a") == hosts{"gpu01", "gpu02", "gpu03", "gpu7", "cpu-a"});
    CHECK(expand_nodelist("n[8-11]") == hosts{"n8", "n9", "n10", "n11"});
    CHECK(expand_nodelist("n[008-010]") == hosts{"n008", "n009", "n010"});
    CHECK(expand_nodelist("rack[1-2]-node[3,5]") == hosts{"rack1-node3", "rack1-node5", "rack2-node3", "rack2-node5"});
    CHECK(expand_nodelist("a,b[2],c") == hosts{"a", "b2", "c"});
    CHECK(expand_nodelist("") == hosts{});
  }

  TEST_CASE("node lists Slurm would not write are refused") {
    for (const char* bad : {"gpu[1-", "gpu1]", "gpu[]", "gpu[3-1]", "gpu[a-b]", "gpu[[1]]", "gpu[1-2-3]"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(expand_nodelist(bad), std::invalid_argument);
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
}
