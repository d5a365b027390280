// This process's device memory for tensors: per device, chunks carved by
// size class as the host arena carves memfd segments (a small tensor is
// never a chunk, a descriptor or a handle of its own; a large one gets a
// chunk), and the chunks of other processes mapped here, each once.
//
// Every block carries a note: a small block of host shared memory (a
// cohort::storage) that says where the block lies, for receivers, and whose
// holders are the block's. A note crosses with each tensor as any shared
// storage crosses, so the host layer's counts (one per process holding the
// block, one per message in flight) say when every receiver is done; the
// maker's block goes back to its free list only then.
#pragma once

#include "cohort/cuda/chunk.hpp"
#include "cohort/cuda/device.hpp"
#include "cohort/storage.hpp"

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace cohort::cuda::detail {

/// What a block's note holds, in shared memory: written once by the maker
/// as it carves the block, read by every receiver, trusted by none until
/// checked.
struct chunk_note {
  static constexpr std::uint64_t expected_magic = 0x65746f6e6b6e6863;  // "chknote"
  std::uint64_t magic;
  std::uint32_t maker;       // the process that made the chunk
  std::uint32_t maker_port;  // its socket (exchange.hpp)
  std::uint64_t chunk_id;    // never reused by the maker
  std::uint64_t chunk_size;
  std::uint64_t offset;      // of the block in the chunk
  std::uint64_t capacity;    // the block's bytes
  std::array<unsigned char, 16> device;  // the device's UUID
  std::uint8_t kind;         // sharing
  std::uint8_t single;       // 1: the block is the whole chunk
  std::uint8_t zero[6];
  ipc_memory_handle ipc;     // the chunk's, for sharing::ipc_handle
};

/// A note's bytes: the chunk_note, then two counters of the messages that
/// named the block, each on a cache line of its own: sent (by any process),
/// and received. A process whose rank ends waits for the two to agree for
/// every note it sent, so that receivers can still fetch the chunk from it.
inline constexpr std::size_t note_sent_at = 192;
inline constexpr std::size_t note_received_at = 256;
inline constexpr std::size_t note_bytes = note_received_at + 8;
static_assert(sizeof(chunk_note) <= note_sent_at);

/// Counts a message naming `note`'s block as sent, and remembers the note
/// until it has been received.
void note_sent(const cohort::storage& note);
/// Counts a message naming the block of the note whose bytes are at
/// `note` as received.
void note_received(std::byte* note) noexcept;
/// Whether every message naming a block of a chunk this process made and
/// shares by CUDA IPC handle (sharing::ipc_handle), whoever sent it, has
/// been received: such a chunk is opened from its maker's handle alone,
/// so the maker must outlast the messages that relays send on.
bool made_ipc_notes_settled() noexcept;
/// Whether a message this process sent that names a block of chunk `id`
/// of process `maker` (its socket `port`) waits to be received: a receiver
/// may still ask here for the chunk.
bool sent_unreceived(pid_t maker, std::uint32_t port, std::uint64_t id);

/// A chunk held here: made by this process, or mapped from another's.
struct held_chunk {
  chunk memory;
  pid_t maker = 0;
  std::uint32_t port = 0;  // the maker's socket
  std::uint64_t id = 0;
  bool single = false;
  /// An ipc_handle chunk opened here from its maker's handle: closed as
  /// soon as no received tensor here uses it, before this process lets go
  /// of the note that named it (CUDA leaves the maker's free of memory
  /// that another process still has open undefined).
  bool opened = false;
  /// The chunk's descriptor (file_descriptor chunks), which this process
  /// hands out to receivers (exchange.hpp) while it holds the chunk: the
  /// served table names it, and the destructor stops serving it before it
  /// closes it.
  int fd = -1;
  /// Received tensors here over it whose stream-ordered release has not
  /// run yet.
  std::atomic<long> users{0};

  held_chunk() = default;
  held_chunk(const held_chunk&) = delete;
  held_chunk& operator=(const held_chunk&) = delete;
  ~held_chunk();
};

/// A block of this process's arena.
struct block {
  std::shared_ptr<held_chunk> chunk;
  std::uint64_t offset = 0;
  std::size_t capacity = 0;
  int size_class = -1;  // -1: a chunk of its own
  cohort::storage note;

  std::byte* data() const noexcept { return static_cast<std::byte*>(chunk->memory.data()) + offset; }
};

/// A block of at least `nbytes` (at least one byte's block for 0) on
/// `device`, which the caller holds until give_back; `entry` names the
/// call in errors. Throws std::invalid_argument, no_device, or error (out
/// of memory names the size and the device's free memory).
block allocate(int device, std::size_t nbytes, const char* entry);
/// Ends the maker's own hold: the block is free for reuse once no other
/// process and no message holds its note, or only processes that have
/// ended do (it then gets a new note).
void give_back(int device, block b) noexcept;
/// The chunk `id` this process made on any device; null when it has none
/// by that id (never made, or freed).
std::shared_ptr<held_chunk> own_chunk(std::uint64_t id);

/// Frees the blocks whose receivers are all done, and releases the chunks
/// of this process's arenas with no block in use; returns how many chunks
/// went.
int trim_arenas();

}  // namespace cohort::cuda::detail
