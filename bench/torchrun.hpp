// torchrun from Debian's torch 1.13, for the launcher benchmarks. As
// shipped it fails on Python 3.11: its Std.from_str iterates an IntFlag,
// which no longer yields NONE and ALL, so every -r/-t value becomes None.
// The wrapper written here mends that, then calls torch.distributed.run.main().
#pragma once

#include <cstdio>
#include <string>

namespace cohort::bench {

inline const char* const torchrun_wrapper = R"(
import sys
from torch.distributed.elastic.multiprocessing.api import Std
def from_str(vm):
    if ":" not in vm:
        return Std(int(vm))
    return {int(k): Std(int(v)) for k, v in (p.split(":") for p in vm.split(","))}
Std.from_str = staticmethod(from_str)
from torch.distributed.run import main
main(sys.argv[1:])
)";

/// Writes the wrapper to `path`; false when it cannot.
inline bool write_torchrun_wrapper(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs(torchrun_wrapper, f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace cohort::bench
