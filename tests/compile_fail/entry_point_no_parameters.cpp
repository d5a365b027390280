// Refused with every compiler: a function that takes no parameters has no
// rank to be given, so it cannot be an entry point.
// expected error: its first parameter is the rank, an int: write fn(int rank, ...)
#include "cohort/entry_point.hpp"

void takes_nothing() {}
COHORT_ENTRYPOINT(takes_nothing);

int main() { return 0; }
