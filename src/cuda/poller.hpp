// The thread that polls device work for this layer (src/cuda/tensor.cpp):
// receivers' stream-ordered releases, waits gated on other processes'
// events, and asynchronous waits on events and streams.
#pragma once

#include "cohort/cuda/event.hpp"

#include <memory>

namespace cohort::cuda::detail {

/// Tells `waiter` once `e`, an event of `device`, has no work pending (or
/// has failed: with the error); `keep` holds `e` until then (and destroys it
/// when it is the last holder). At once, on the calling thread, when it is
/// done already.
void watch_event(int device, CUevent_st* e, std::shared_ptr<CUevent_st> keep, std::unique_ptr<event_waiter> waiter);

}  // namespace cohort::cuda::detail
