// How far the decode of a queue record that a pop claimed has got
// (queue/queue.cpp): each handle read from the record notes, before it
// takes the handle's reference, that the handles before its end are
// taken, so that when this process is killed mid-decode, whoever finds
// the claim lets go of the references of those it never reached.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace cohort::shm {

/// A value no handle's place reaches (places are below 2^31): the handles
/// past the last noted place are in an unknown state, and none is let go
/// of. Stored as a device record's read begins (the device layer's own
/// read of the handle inside it notes its place as any other) and by a
/// decode that failed, which lets go of the rest itself.
inline constexpr std::uint32_t progress_unknown = 0x7fffffff;

/// The record whose decode this thread notes, where, and bits every note
/// keeps (the claim's own).
struct read_progress {
  const std::byte* value = nullptr;
  std::atomic<std::uint32_t>* word = nullptr;
  std::uint32_t keep = 0;
};

/// This thread's: set for as long as a claimed record decodes.
[[gnu::tls_model("initial-exec")]] extern thread_local read_progress current_read_progress;

/// Notes `next` (a place in the value; handles below it are taken) when
/// `value` is the record this thread's progress is for.
inline void note_read_progress(const std::byte* value, std::uint32_t next) noexcept {
  const auto& p = current_read_progress;
  // A place past what a note can say (values past 2 GiB) leaves the rest
  // unknown rather than meaning something else.
  if (p.word != nullptr && p.value == value) {
    p.word->store(std::min(next, progress_unknown) | p.keep, std::memory_order_release);
  }
}

}  // namespace cohort::shm
