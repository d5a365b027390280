// Carving blocks of shared memory right after one was let go of, to see
// whether the arena hands that block out again while another process may
// still read it.
#pragma once

#include "cohort/storage.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace cohort::test {

// Carves 64 blocks of 64 bytes, writes 0xee over each, and checks that
// none is the block whose data was at `freed`.
inline std::vector<cohort::storage> carve_over(const std::byte* freed) {
  std::vector<cohort::storage> more;
  for (int i = 0; i < 64; ++i) {
    more.push_back(cohort::storage::allocate_shared(64));
    std::memset(more.back().data(), 0xee, 64);
    CHECK(more.back().data() != freed);
  }
  return more;
}

}  // namespace cohort::test
