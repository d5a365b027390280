// A program of another project, built against cohort as a meson subproject,
// through pkg-config, or through CMake's find_package (tests/support/embed.py).
#include <cohort/cohort.hpp>

#include <fmt/format.h>

int main() {
  cohort::exit_status ok = cohort::run(cohort::command("/bin/true"));
  cohort::exit_status three = cohort::run(cohort::command("/bin/sh", {"-c", "exit 3"}));
  if (!ok.exited() || ok.code() != 0 || !three.exited() || three.code() != 3) {
    fmt::print("cohort {}: /bin/true gave {}, exit 3 gave {}\n", COHORT_VERSION, ok, three);
    return 1;
  }
  fmt::print("cohort {}.{}.{}: /bin/true {}, exit 3 {}\n", COHORT_VERSION_MAJOR, COHORT_VERSION_MINOR,
             COHORT_VERSION_PATCH, ok, three);
  return 0;
}
