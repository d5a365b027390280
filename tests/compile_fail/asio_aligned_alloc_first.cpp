// Refused with every compiler: Asio included after a standard header and
// before cohort, without -DASIO_DISABLE_STD_ALIGNED_ALLOC=1, would free with
// std::free what the library allocated with operator new, and the reverse.
// expected error: compile with -DASIO_DISABLE_STD_ALIGNED_ALLOC=1
#include <vector>

#include <asio/io_context.hpp>

#include "cohort/spawn.hpp"

int main() { return 0; }
