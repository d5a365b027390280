// Signal names for exit statuses.
#include "cohort/exit_status.hpp"

#include <fmt/format.h>

#include <signal.h>
#include <string.h>

namespace cohort {

std::string signal_name(int signal) {
  if (signal >= SIGRTMIN && signal <= SIGRTMAX) {
    return signal == SIGRTMIN ? "SIGRTMIN" : fmt::format("SIGRTMIN+{}", signal - SIGRTMIN);
  }
  if (const char* abbrev = ::sigabbrev_np(signal)) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", signal);
}

}  // namespace cohort
