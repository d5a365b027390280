// The bytes a tensor views: private memory of this process, or a block of
// shared memory that other processes map without a copy.
#pragma once

#include "cohort/export.hpp"

#include "cohort/encoding.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

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
  /// Named files /dev/shm/cohort_<pid>_<random>, mode 0600, linked under
  /// their name once their header says who made them, unlinked when their
  /// last block is freed, and swept by the group that ran their creator
  /// when it ends. A receiver opens them by name, so they outlive their
  /// creator.
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
class device_memory;
/// The holders of a shared storage's block counted in shared memory: one
/// for each process with a storage over it, one for each message in flight
/// that names it. 0 for a private storage.
std::uint32_t shared_holders(const storage& s) noexcept;
std::vector<std::byte> hold_for_receiver(const encoded& value);
std::vector<storage> held_storages(const encoded& value);
storage make_device_storage(std::shared_ptr<const device_memory> memory);
const device_memory* device_memory_of(const storage& s) noexcept;
bool only_ended_processes_share(const storage& s) noexcept;
std::uint64_t segment_of(const storage& s) noexcept;
/// A borrower of the bytes (tensor::to_dlpack) begins, or ends, holding
/// them where they are: share_memory() refuses private bytes while lent.
void lend_bytes(const storage& s) noexcept;
void end_loan(const storage& s) noexcept;
/// Work that a layer recording this process in a shared block's memory (a
/// queue's table of holders) sets for the block's storage in this process:
/// `run` gets a storage over the block and `context`, the layer's own.
struct hold_work {
  void (*run)(const storage& s, void (*context)()) noexcept = nullptr;
  void (*context)() = nullptr;
};
/// What a forked rank's end does for a shared storage before it lets go
/// of the storage's block: the layer takes this process out of the block's
/// memory, as the destructors that the rank's `_exit` skips would have.
/// Sets `work` for `s` in this process; the first set stays. Nothing for a
/// storage not shared.
void at_forked_rank_end(const storage& s, hold_work work) noexcept;
/// What the end of the last storage over the block of `s` in this process
/// does before this process's hold on the block goes: `run` gets a storage
/// that has taken that hold over (and no work set), so that the layer can
/// still read the block, and decide under a lock of its own whether this
/// hold was the last that could use it (let_go_unless_last). The first set
/// stays. Nothing for a storage not shared.
void at_last_release(const storage& s, hold_work work) noexcept;
/// Lets go of this process's hold on the block of `s`, a shared storage,
/// at once, unless it is the block's last hold: whether it did. The
/// storages over the block here hold none after, and their ends let go of
/// nothing.
bool let_go_unless_last(const storage& s) noexcept;
/// In a forked child about to end without destructors: runs the work set
/// by at_forked_rank_end, then lets go of the shared memory its storages
/// hold.
void release_shared_memory_holds() noexcept;
/// Runs the work set by at_forked_rank_end, the holds kept: the first part
/// of release_shared_memory_holds, and the first work of exit(), which
/// destroys no local of main() (a queue that no other process can pop
/// from is drained there).
void run_rank_end_work() noexcept;
}

/// A reference-counted run of bytes. Copies share the bytes (as torch's
/// storages do); the memory goes when the last copy in the last process is
/// gone. Thread-safe as std::shared_ptr is: distinct copies may be used from
/// distinct threads. Moving private bytes into shared memory (share_memory(),
/// or sending a tensor over them) may run on several threads at once: the
/// bytes move once. Their old address is freed then: a thread reading or
/// writing them through data() while another moves them races the move.
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
  /// Whether the bytes are in shared memory, or on a device (whose memory
  /// other processes map: see cohort/cuda/tensor.hpp).
  bool is_shared() const noexcept;
  /// Moves private bytes into shared memory in place: every copy of this
  /// storage, and every tensor over it, sees the shared bytes from then on.
  /// Does nothing when already shared, on a device, or empty. Throws
  /// shm_error, and std::logic_error while a DLPack export of a tensor over
  /// it (tensor::to_dlpack) has not been deleted: the borrower's pointer
  /// would be left on freed bytes.
  void share_memory();

  /// Whether both are copies of one storage (in this process: a storage
  /// received twice is one storage).
  bool same(const storage& other) const noexcept { return impl_ == other.impl_; }
  /// How many copies of this storage exist in this process.
  long use_count() const noexcept { return impl_.use_count(); }

 private:
  friend struct detail::handle_codec<storage>;
  friend std::uint32_t detail::shared_holders(const storage& s) noexcept;
  friend std::vector<storage> detail::held_storages(const encoded& value);
  friend storage detail::make_device_storage(std::shared_ptr<const detail::device_memory> memory);
  friend const detail::device_memory* detail::device_memory_of(const storage& s) noexcept;
  friend bool detail::only_ended_processes_share(const storage& s) noexcept;
  friend std::uint64_t detail::segment_of(const storage& s) noexcept;
  friend void detail::lend_bytes(const storage& s) noexcept;
  friend void detail::end_loan(const storage& s) noexcept;
  friend void detail::at_forked_rank_end(const storage& s, detail::hold_work work) noexcept;
  friend void detail::at_last_release(const storage& s, detail::hold_work work) noexcept;
  friend bool detail::let_go_unless_last(const storage& s) noexcept;
  friend class detail::storage_impl;
  friend void detail::release_shared_memory_holds() noexcept;
  friend void detail::run_rank_end_work() noexcept;
  explicit storage(std::shared_ptr<detail::storage_impl> impl) noexcept : impl_(std::move(impl)) {}
  std::shared_ptr<detail::storage_impl> impl_;
};

namespace detail {

/// Memory of a device other than the CPU, which a device layer
/// (libcohort-cuda) makes and the core library holds without knowing the
/// device: a storage over it is its bytes, and crosses as what write()
/// appends. Destroyed when the last storage over it, in this process, goes.
class device_memory {
 public:
  virtual ~device_memory() = default;
  /// The device address of the first byte.
  virtual std::byte* data() const noexcept = 0;
  virtual std::size_t nbytes() const noexcept = 0;
  /// DLPack's device type (kDLCUDA) and this process's index of the device.
  virtual int device_type() const noexcept = 0;
  virtual int device_index() const noexcept = 0;
  /// The most bytes write() appends.
  virtual std::size_t handle_bound() const noexcept = 0;
  /// Appends what another process reads back with the reader registered
  /// for device_type(); may put storages in current_handles, as a shared
  /// storage's handle does.
  virtual void write(std::vector<std::byte>& out) const = 0;
};
/// What reads a device storage's handle back: registered by the device
/// layer as it loads. Throws decode_error for what it cannot trust.
using device_handle_reader = storage (*)(reader& in);
/// What a device layer waits for as a rank's function returns: the values
/// it sent through queues to be received (they are fetched through this
/// process), for at most `limit`.
using device_receivers_wait = void (*)(std::chrono::steady_clock::duration limit) noexcept;
/// The DLPack device types a device layer may register for: 1 up to
/// device_types - 1 (kDLCPU, 1, included; no layer registers for it).
inline constexpr int device_types = 64;
/// Whether `device_type` is one of those.
constexpr bool registrable_device_type(int device_type) noexcept {
  return device_type > 0 && device_type < device_types;
}
/// What lets go of a device storage's handle in a queue's record that the
/// receiver never reached (the value failed before it), as reading it and
/// refusing it would: `handle` starts at what device_memory::write
/// appended and runs to the value's end. Given only handles whose write
/// began with a shared storage's handle in the record (the place of that
/// handle is marked, see end_handle_record).
using device_unread_drop = void (*)(std::span<const std::byte> handle) noexcept;
/// Registers the reader for handles of DLPack device type `device_type`
/// (1..63), the layer's wait and its drop of unread handles; a second
/// registration replaces the first.
void register_device_reader(int device_type, device_handle_reader read, device_receivers_wait wait,
                            device_unread_drop drop) noexcept;
/// Runs every registered wait, each for at most `limit`.
void wait_for_device_receivers(std::chrono::steady_clock::duration limit) noexcept;
/// A storage over `memory`.
storage make_device_storage(std::shared_ptr<const device_memory> memory);
/// For a shared storage of this process's making: whether every other
/// process that has mapped its segment has ended and no message naming the
/// segment is in flight, so that any hold on its block beyond this
/// process's own is a dead process's. False for any other storage.
bool only_ended_processes_share(const storage& s) noexcept;
/// What tells shared storages' segments apart (their nonce); 0 for others.
std::uint64_t segment_of(const storage& s) noexcept;
/// The device memory a storage views; null for host memory.
const device_memory* device_memory_of(const storage& s) noexcept;

/// A storage crosses as the segment and block it lives in, moved into
/// shared memory first when it is private. A receiver checks every field
/// against the segment it opens; a storage received twice in one process is
/// one storage there. A device storage crosses as its device layer writes
/// it, after [2][device type].
template <>
struct handle_codec<storage> {
  static std::string signature() { return "S"; }
  /// A shared storage's handle, whole (an empty one is a single byte).
  static constexpr std::size_t handle_size = 48;
  static std::size_t size_bound(const storage& s) noexcept;
  static void write(std::vector<std::byte>& out, const storage& value);
  static storage read(reader& in);
};

/// How many entries this process's table of storages by block holds (for
/// tests): one for each storage in shared memory here, and some whose end
/// is under way.
std::size_t storage_identities();

/// Gives each storage a queue message names a reference of its own, which
/// the receiver takes over. Called by the queue before the tail that
/// publishes the message moves, so no receiver can see the message before.
void hold_for_message(handle_context& context) noexcept;

/// Lets go of the reference that a record with handles (a queue's value,
/// or the holds of a rank's result) gives the storage handle at the start
/// of `handle`, which the receiver never read (the value failed to decode
/// before it): counts the message received and releases the block, as
/// reading the handle and dropping the storage would. Does nothing where
/// the segment cannot be opened any more, or the bytes are not such a
/// handle.
void drop_unread_handle(std::span<const std::byte> handle) noexcept;

/// A record whose storage handles carry references of their own (a queue's
/// value, the holds of a rank's result) ends with where each shared
/// storage's handle starts in it (4 bytes each), then how many there are
/// (4 bytes). A place with its top bit set (device_record_place) is that
/// of the handle a device storage's write began with, right after its
/// [2][device type]. end_handle_record appends that end to the record's
/// bytes.
inline constexpr std::uint32_t device_record_place = std::uint32_t{1} << 31;
void end_handle_record(std::vector<std::byte>& bytes, const std::vector<std::uint32_t>& handle_at);
/// The value's bytes of such a record; throws decode_error when its end
/// does not name places inside them, in order.
std::span<const std::byte> record_value(std::span<const std::byte> record);
/// For such a record whose value failed to decode after `read` of its
/// bytes: lets go of the references of the handles it had not reached.
void drop_unread_handles(std::span<const std::byte> record, std::size_t read) noexcept;
/// For such a record that names one storage (a queue value too large for
/// the ring, in a block of its own): as drop_unread_handles for the
/// value's record in the block, then lets go of the block's reference:
/// that of a receiver that took it over and ended (`taken`), or else the
/// message's, counted received.
void drop_unread_in_block(std::span<const std::byte> record, std::size_t read, bool taken) noexcept;

/// Reads the whole value of such a record; `trailing` is the decode_error's
/// message when bytes follow it. When reading throws, what was read goes
/// with the exception, and the handles not reached are let go of.
template <class T>
T read_handle_record(std::span<const std::byte> record, const char* trailing) {
  reader in(record_value(record), reader::source::queue_record);
  try {
    T value = read<T>(in);
    if (in.left() != 0) throw decode_error(trailing);
    return value;
  } catch (...) {
    drop_unread_handles(record, in.position());
    throw;
  }
}

/// For a value that may be read after its sender has ended (a rank's
/// result): a record naming every storage encode() held for `value`, each
/// given a reference of its own, which the receiver takes over with
/// take_holds. It ends as end_handle_record's do. Empty when it names none.
std::vector<std::byte> hold_for_receiver(const encoded& value);
/// The storages encode() held for `value` (what keeps the shared memory its
/// handles name alive); empty when it holds none. Sent beside the value's
/// bytes (a queue gives each a reference of its own while in flight), they
/// let the sender drop the value at once.
std::vector<storage> held_storages(const encoded& value);
/// Takes over the references such a record holds, for as long as `value`
/// (the value it was made for) lives. Throws decode_error and shm_error;
/// the references of the storages it had not reached then are let go of.
void take_holds(encoded& value, std::span<const std::byte> record);

}  // namespace detail

}  // namespace cohort

COHORT_API_END
