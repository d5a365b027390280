// The child of exit_latency: writes CLOCK_MONOTONIC (ns, 8 bytes) to its
// stdout as its last act, then _exit(0).
#include <time.h>
#include <unistd.h>

#include <cstdint>

int main() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const std::int64_t ns = ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
  const bool written = ::write(1, &ns, sizeof ns) == sizeof ns;
  ::_exit(written ? 0 : 1);
}
