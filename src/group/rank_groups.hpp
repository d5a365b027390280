// The process groups that ranks here lead, noted where this process's
// guardian reads them once this process has died: it kills every process
// in them, whatever the process's environment holds (guardian.hpp).
#pragma once

#include <sys/types.h>

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

/// Makes the guardians started from now on copies, as they are where they
/// cannot share this process's memory (for the tests).
void start_guardians_as_copies(bool copies);

}  // namespace cohort::detail
