// Which process this is, and whether another one is still the process it
// was: pids are recycled, so a process is known by its pid and start time.
// Also the entry point rank this process runs as, for the layers that name
// peers by rank.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace cohort::os {

/// The start time of process `pid` (field 22 of /proc/<pid>/stat, clock
/// ticks since boot): 0 when it has ended (no such process, or a zombie
/// with no thread left), nullopt when /proc could not tell (out of
/// descriptors, say).
std::optional<std::uint64_t> start_time_of(pid_t pid) noexcept;
/// The start time of `pid`, a child of this process not yet reaped: read
/// as start_time_of() does, but a zombie's too (its pid stays its own until
/// it is reaped). 0 when there is no such process.
std::optional<std::uint64_t> start_time_of_child(pid_t pid) noexcept;
/// Whether the process `pid` that started at `start_time` has ended; false
/// when that cannot be told. A start time of 0 (one that could not be read)
/// is judged by the pid alone.
bool has_ended(pid_t pid, std::uint64_t start_time) noexcept;
/// Whether the process `pid` that started at `start_time` has ended, as
/// has_ended() tells, or is ending: every thread of it has begun to exit
/// or has SIGKILL pending (the process was killed, or called exit_group),
/// though it is not yet a zombie. Such a process may have closed its
/// descriptors already, or have a zombie leader whose /proc/<pid>/fd
/// shows none. False when that cannot be told.
bool has_ended_or_is_ending(pid_t pid, std::uint64_t start_time) noexcept;
/// The state letter of process `pid` in /proc/<pid>/stat (R, S, D, T for
/// stopped by a signal, t for stopped by a tracer, Z...); '\0' when it has
/// ended or /proc could not tell.
char state_of(pid_t pid) noexcept;
/// This process's start time, read once per process; 0 when unreadable.
std::uint64_t own_start_time() noexcept;
/// This process's pid namespace: the inode of /proc/self/ns/pid, read once;
/// 0 when unreadable. A pid means a process only inside its namespace, and
/// namespaces may share a /dev/shm or a temporary directory.
std::uint64_t pid_namespace() noexcept;

/// The most pids the system hands out (/proc/sys/kernel/pid_max, read on
/// each call: it may be changed); -1 when unreadable. No more processes than
/// this can run at once.
long pid_max() noexcept;

/// This process's pid, without a system call on each use (glibc does not
/// cache it): queues and segments ask on every value.
pid_t this_process() noexcept;
/// Forgets the cached pid: for a child made without glibc's fork (whose
/// handlers do it) that goes on running this program.
void forget_process_id() noexcept;

/// Registers, once, the fork handler that makes every child of glibc's fork
/// forget its parent's pid, first of all child handlers that call this
/// before registering their own: the order of a program's static
/// initializers is its link order, which a static link of the library may
/// change. Called by this file's own initializer too.
void forget_process_id_in_forked_children() noexcept;

/// The rank this process runs as an entry point, or -1 (not a rank).
int running_rank() noexcept;
/// Sets what running_rank() returns: called once by a rank's start, before
/// its function runs.
void set_running_rank(int rank) noexcept;

}  // namespace cohort::os
