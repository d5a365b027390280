// How a receiver gets what a device tensor's record only names: the
// descriptor of a chunk and the handle of an event. Each process that sends
// device tensors answers on a socket of its own (abstract, named by its pid
// and a random port), from a thread that waits there; a receiver asks the
// process that made the chunk, or the one that sent it on, once per chunk
// and event, and keeps what it got. The driver's descriptors cannot be
// reopened through /proc as memfds can, and pidfd_getfd is refused between
// siblings where ptrace is restricted: a socket works between any two
// processes of one user. It answers that user and root only (the peer's
// credentials, as the kernel gives them): anyone can connect to an
// abstract socket, and another user's connection is closed unanswered, as
// is one past 1024 answered at once, or one that finds no thread or no
// descriptor to be answered with.
#pragma once

#include "cohort/cuda/event.hpp"

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace cohort::cuda::detail {

/// One slot of a process's event table (served by serve_event_table): how
/// many receivers' waits its records asked for, counted by the sender, and
/// how many no longer depend on the record, counted by each receiver.
struct slot_counts {
  std::atomic<std::uint64_t> sends;
  std::atomic<std::uint64_t> acks;
};
/// The table's slots, and its size in bytes.
inline constexpr std::size_t max_slots = std::size_t{1} << 16;
inline constexpr std::size_t table_bytes = max_slots * sizeof(slot_counts);

/// This process's port; its socket is made, and its thread started, on the
/// first call. Throws std::system_error when the socket cannot be made.
std::uint32_t own_port();

/// Answers requests for chunk `id` of process `maker`, whose socket is
/// `port`, with a duplicate of `fd`, until stop_serving_chunk with the same
/// `fd`. The table keeps no descriptor of its own: `fd` stays the caller's,
/// who must keep it open until then. A chunk served again under the same
/// key is answered with the latest descriptor.
void serve_chunk(pid_t maker, std::uint32_t port, std::uint64_t id, int fd);
/// Stops answering with `fd` for that chunk; leaves a later serve_chunk's
/// descriptor for it served.
void stop_serving_chunk(pid_t maker, std::uint32_t port, std::uint64_t id, int fd) noexcept;
/// Answers requests for event slot `slot` with `handle`.
void serve_event(std::uint32_t slot, const ipc_event_handle& handle);
/// Answers requests for the table of event acknowledgements with a
/// duplicate of `fd` (a memfd, which stays the caller's).
void serve_event_table(int fd);

/// A descriptor, the caller's, of chunk `id` of `maker` (whose socket is
/// `maker_port`) from process `pid` answering on `port`; -1 with the
/// reason in `why` when that process has ended, is another user's, does
/// not know the chunk, or does not answer within 10 seconds.
int fetch_chunk(pid_t pid, std::uint32_t port, pid_t maker, std::uint32_t maker_port, std::uint64_t id,
                std::string& why);
/// The handle of event slot `slot` from process `pid` answering on `port`;
/// false with the reason in `why`, as fetch_chunk.
bool fetch_event(pid_t pid, std::uint32_t port, std::uint32_t slot, ipc_event_handle& handle, std::string& why);
/// A descriptor, the caller's, of the event table of process `pid`; -1
/// with the reason in `why`, as fetch_chunk.
int fetch_event_table(pid_t pid, std::uint32_t port, std::string& why);
/// Closes the connections kept to processes that have ended (one is kept
/// per process asked, for the next request).
void forget_ended_peers() noexcept;

}  // namespace cohort::cuda::detail
