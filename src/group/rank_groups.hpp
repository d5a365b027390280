// The process groups that ranks here lead, and the ranks themselves, noted
// where this process's guardian reads them once this process has died: it
// kills every process in those groups, whatever the process's environment
// holds, and removes the file_system segments those ranks made
// (guardian.hpp).
#pragma once

#include "os/owned_fd.hpp"

#include <sys/types.h>

#include <cstdint>

namespace cohort::detail {

/// Notes that process group `pgid` (a rank's, which leads it) may hold what
/// a group here started. False, and nothing noted, when no guardian of this
/// process's keeps such notes (none runs, or its table is full).
bool note_rank_group(pid_t pgid);

/// Lets go of one note of `pgid`, made by note_rank_group: once the group
/// is empty its id may be given to an unrelated process, whose group the
/// guardian must not kill.
void forget_rank_group(pid_t pgid);

/// Whether `pgid` is noted now (for the tests).
bool rank_group_noted(pid_t pgid);

/// Notes rank `pid`, which has started and is not yet reaped, by its pid
/// and start time, so that the guardian removes the file_system segments
/// it made also once it has ended (its process group's note gone), until
/// its run has swept them itself: then forget_rank. The start time tells a
/// process that took the pid since apart, as each segment is stamped with
/// its maker's. The note, for forget_rank; 0, and nothing noted, when no
/// guardian of this process's keeps notes (none runs, or its table is
/// full) or the start time cannot be read. A rank that has ended already,
/// not yet reaped, is noted: its pid is still its own, and the segments it
/// made are swept by its run as any rank's.
std::uint64_t note_rank(pid_t pid);

/// Lets go of a note note_rank made (0: none).
void forget_rank(std::uint64_t note);

/// Whether a note note_rank made is kept now (for the tests).
bool rank_noted(std::uint64_t note);

/// Notes a run's marker, shm::run_marker_hash of the "NAME=value" its
/// ranks' environment holds, before the run's first rank starts: the
/// guardian then removes the file_system segments any process made with
/// that marker in its environment (a rank's own child), until the run has
/// swept them itself: then forget_run. False, and nothing noted, when no
/// guardian of this process's keeps notes.
bool note_run(std::uint64_t marker);

/// Lets go of a note note_run made.
void forget_run(std::uint64_t marker);

/// A copy of the line of the guardian that takes notes now, for ranks to
/// announce their start on (launch_plan::announce_fd), so that the guardian
/// knows each from before it runs anything of its caller's until it is
/// noted here; invalid when no guardian runs. The launcher withdraws each
/// note (withdraw_start_note) once it has noted the rank with
/// note_rank_group and note_rank, or as the rank's start fails.
os::owned_fd start_line();

/// Makes the guardians started from now on copies, as they are where they
/// cannot share this process's memory (for the tests).
void start_guardians_as_copies(bool copies);

}  // namespace cohort::detail
