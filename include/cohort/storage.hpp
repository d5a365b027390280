// The bytes a tensor views: private memory of this process, or a block of
// shared memory that other processes map without a copy.
#pragma once

#include "cohort/export.hpp"

#include "cohort/encoding.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

COHORT_API_BEGIN

namespace cohort {

/// How shared memory is made, chosen per process (torch's
/// torch.multiprocessing.set_sharing_strategy).
enum class sharing_strategy {
  /// Sealed memfds. The kernel frees one when its last descriptor and
  /// mapping are gone, so nothing outlives the processes using it, crashes
  /// included. A receiver opens a segment through its owner's
  /// /proc/<pid>/fd entry, so the owner (or the sender of an argument) must
  /// be alive when a receiver first sees that segment. The default.
  file_descriptor,
  /// Named files /dev/shm/cohort_<pid>_<random>, made O_EXCL with mode 0600,
  /// unlinked when their last block is freed, and swept by the group that
  /// ran their creator when it ends. A receiver opens them by name, so they
  /// outlive their creator.
  file_system,
};

/// Sets the strategy for shared memory this process makes from now on.
/// Segments already made keep theirs; receivers follow the sender's.
void set_sharing_strategy(sharing_strategy strategy) noexcept;
/// The strategy this process makes shared memory with.
sharing_strategy get_sharing_strategy() noexcept;
/// "file_descriptor" or "file_system".
std::string_view to_string(sharing_strategy strategy) noexcept;

/// Lets go of the shared memory this process keeps for reuse: arena
/// segments with no block in use, segments it made that others have since
/// freed, and mappings of other processes' segments that no storage here
/// uses (kept so a stream of values maps each segment once). Returns how
/// many segments went. Thread-safe.
int trim_shared_memory();

/// Shared memory could not be had: /dev/shm (or the memory behind memfds)
/// has no room for the reservation, or a segment could not be made, opened
/// or mapped. Thrown where the memory is asked for, never later as SIGBUS.
class shm_error : public std::runtime_error {
 public:
  shm_error(const std::string& what, std::size_t requested = 0, std::size_t available = 0)
      : std::runtime_error(what), requested_(requested), available_(available) {}
  /// The bytes asked for; 0 when the failure was not about room.
  std::size_t requested() const noexcept { return requested_; }
  /// The bytes /dev/shm had free when asked; 0 when unknown.
  std::size_t available() const noexcept { return available_; }

 private:
  std::size_t requested_;
  std::size_t available_;
};

class storage;

namespace detail {
class storage_impl;
/// The holders of a shared storage's block counted in shared memory: one
/// for each process with a storage over it, one for each message in flight
/// that names it. 0 for a private storage.
std::uint32_t shared_holders(const storage& s) noexcept;
std::vector<std::byte> hold_for_receiver(const encoded& value);
}

/// A reference-counted run of bytes. Copies share the bytes (as torch's
/// storages do); the memory goes when the last copy in the last process is
/// gone. Thread-safe as std::shared_ptr is: distinct copies may be used from
/// distinct threads; share_memory() must not run while another thread uses
/// the same storage.
class storage {
 public:
  /// No bytes.
  storage() noexcept = default;

  /// `nbytes` of private memory, uninitialised. Throws std::bad_alloc.
  static storage allocate(std::size_t nbytes);
  /// `nbytes` of shared memory under this process's sharing strategy,
  /// uninitialised, aligned to 64 bytes. Small sizes come from an arena of
  /// few large segments; large ones get a segment each. Throws shm_error
  /// when the memory cannot be reserved.
  static storage allocate_shared(std::size_t nbytes);

  /// The first byte; null for an empty storage. Stable except across
  /// share_memory(), which moves the bytes.
  std::byte* data() const noexcept;
  std::size_t nbytes() const noexcept;
  /// Whether the bytes are in shared memory.
  bool is_shared() const noexcept;
  /// Moves private bytes into shared memory in place: every copy of this
  /// storage, and every tensor over it, sees the shared bytes from then on.
  /// Does nothing when already shared or empty. Throws shm_error.
  void share_memory();

  /// Whether both are copies of one storage (in this process: a storage
  /// received twice is one storage).
  bool same(const storage& other) const noexcept { return impl_ == other.impl_; }
  /// How many copies of this storage exist in this process.
  long use_count() const noexcept { return impl_.use_count(); }

 private:
  friend struct detail::handle_codec<storage>;
  friend std::uint32_t detail::shared_holders(const storage& s) noexcept;
  friend std::vector<std::byte> detail::hold_for_receiver(const encoded& value);
  explicit storage(std::shared_ptr<detail::storage_impl> impl) noexcept : impl_(std::move(impl)) {}
  std::shared_ptr<detail::storage_impl> impl_;
};

namespace detail {

/// A storage crosses as the segment and block it lives in, moved into
/// shared memory first when it is private. A receiver checks every field
/// against the segment it opens; a storage received twice in one process is
/// one storage there.
template <>
struct handle_codec<storage> {
  static std::string signature() { return "S"; }
  /// A shared storage's handle, whole (an empty one is a single byte).
  static constexpr std::size_t handle_size = 48;
  static std::size_t size_bound(const storage&) noexcept { return handle_size; }
  static void write(std::vector<std::byte>& out, const storage& value);
  static storage read(reader& in);
};

/// Gives each storage a queue message names a reference of its own, which
/// the receiver takes over. Called with the queue's lock held, so no
/// receiver can see the message before.
void hold_for_message(const handle_context& context) noexcept;

/// For a value that may be read after its sender has ended (a rank's
/// result): a record naming every storage encode() held for `value`, each
/// given a reference of its own, which the receiver takes over with
/// take_holds. Empty when it names none.
std::vector<std::byte> hold_for_receiver(const encoded& value);
/// Takes over the references such a record holds, for as long as `value`
/// (the value it was made for) lives. Throws decode_error and shm_error.
void take_holds(encoded& value, std::span<const std::byte> record);

/// In a forked child about to end without destructors: lets go of the
/// shared memory its storages hold.
void release_shared_memory_holds() noexcept;

}  // namespace detail

}  // namespace cohort

COHORT_API_END
