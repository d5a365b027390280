// The names of segments: file_system ones in /dev/shm hold the maker's pid
// and the segment's nonce, so that what an ended process left can be
// found (for_each_named_segment); memfds hold the nonce, so that a keeper's
// descriptor can be.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

namespace cohort::shm {

/// The name of a file_system segment: "/cohort_<maker pid>_<nonce, hex>".
std::string segment_name(pid_t maker, std::uint64_t nonce);
/// The name of a memfd segment, "cohort-<nonce, hex>": how a keeper's
/// descriptor of it is told among the keeper's others.
std::string memfd_name_of(std::uint64_t nonce);
/// Calls fn(maker, nonce) for each file_system segment's file in /dev/shm.
void for_each_named_segment(const std::function<void(pid_t, std::uint64_t)>& fn);

}  // namespace cohort::shm
