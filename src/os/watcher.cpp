#include "os/watcher.hpp"

#include <pthread.h>
#include <signal.h>

#include <system_error>
#include <thread>
#include <utility>

namespace cohort::os {

bool start_watcher(std::chrono::milliseconds period, std::function<bool()> look) noexcept {
  try {
    std::thread([period, look = std::move(look)] {
      sigset_t all;
      ::sigfillset(&all);
      ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
      do {
        std::this_thread::sleep_for(period);
      } while (!look());
    }).detach();
    return true;
  } catch (const std::system_error&) {
    return false;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

}  // namespace cohort::os
