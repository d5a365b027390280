// Refused with every compiler: an entry point is called as fn(rank, args...)
// with the rank an int, so a function whose first parameter is another type,
// or that takes none, cannot be one.
// expected error: its first parameter is the rank, an int: write fn(int rank, ...)
#include "cohort/entry_point.hpp"

void takes_long_rank(long rank, int) { (void)rank; }
COHORT_ENTRYPOINT(takes_long_rank);

int main() { return 0; }
