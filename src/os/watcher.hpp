// A thread that looks at something every so often until it is done.
#pragma once

#include <chrono>
#include <functional>

namespace cohort::os {

/// Starts a detached thread that calls `look()` every `period` until it
/// returns true. The thread blocks every signal: they go to the program's
/// own threads. False when no thread could be made (nothing then looks).
bool start_watcher(std::chrono::milliseconds period, std::function<bool()> look) noexcept;

}  // namespace cohort::os
