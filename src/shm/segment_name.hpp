// The names of segments: file_system ones in /dev/shm hold the maker's pid
// and the segment's nonce, so that what an ended process left can be
// found; memfds hold the nonce, so that a keeper's descriptor can be.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>

namespace cohort::shm {

/// The name of a file_system segment: "/cohort_<maker pid>_<nonce, hex>".
std::string segment_name(pid_t maker, std::uint64_t nonce);
/// The name of a memfd segment, "cohort-<nonce, hex>": how a keeper's
/// descriptor of it is told among the keeper's others.
std::string memfd_name_of(std::uint64_t nonce);
/// Unlinks every file_system segment still in /dev/shm that one of `pids`
/// (processes that have ended) made; returns how many. Mappings of them
/// stay valid; only opening them by name ends: a value still in flight
/// that names one is lost with its maker (segment_gone).
int sweep_segments_of(std::span<const pid_t> pids) noexcept;

}  // namespace cohort::shm
