// A bounded queue of values across processes (torch.multiprocessing's
// Queue): any number of producers and consumers, in any processes that
// hold it; tensors travel as handles to their shared memory, never copied.
#pragma once

#include "cohort/export.hpp"

#include "cohort/compiler.hpp"
#include "cohort/completion_token.hpp"
#include "cohort/encoding.hpp"
#include "cohort/storage.hpp"
#include "cohort/timeout.hpp"

#include <asio/awaitable.hpp>

#include <sys/types.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

/// A wait on a queue ended because the processes that could end it are
/// gone (an event's wait waits for its set(), as Python's does): a pop on
/// an empty queue whose producers have all exited, or a push into a full
/// queue whose consumers have all exited; names the last
/// of them found gone. Also a value popped whose shared memory went with
/// its sender (a sender killed before the value was received: a memfd no
/// other process held, or a file swept with its maker); names that sender.
class peer_lost : public std::runtime_error {
 public:
  peer_lost(const std::string& what, pid_t pid, int rank) : std::runtime_error(what), pid_(pid), rank_(rank) {}
  pid_t pid() const noexcept { return pid_; }
  /// Its rank when it ran as a function entry point; -1 otherwise.
  int rank() const noexcept { return rank_; }

 private:
  pid_t pid_;
  int rank_;
};

/// A push into a closed queue, or a pop from one that is closed and empty.
class queue_closed : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

/// The untyped queue: records of bytes in a ring in shared memory.
class queue_core;

/// One value, encoded for the ring, with the storages it names.
struct queue_record {
  std::vector<std::byte> bytes;
  handle_context handles{true, {}, {}, {}};
  bool overflowed = false;  ///< `bytes` is a storage holding the value's bytes
  ~queue_record() { undo_unsent(handles); }  // an awaited push's record, never pushed
};

/// The most bytes a thread's buffer keeps between its pushes or pops: one
/// that a larger value grew is let go of once the push or pop is over, so
/// that a thread keeps no memory as large as the largest value it moved.
inline constexpr std::size_t kept_buffer_bytes = std::size_t{1} << 20;

/// Lets go of `bytes`' memory when it is above kept_buffer_bytes, at its end.
struct buffer_release {
  std::vector<std::byte>& bytes;
  ~buffer_release() {
    if (bytes.capacity() > kept_buffer_bytes) std::vector<std::byte>().swap(bytes);
  }
};

/// Lets go of the storages a record holds for its value once a push is
/// over: one that went through has handed them to the queue already, and
/// one that failed (full, timed out, closed) must not keep the value's
/// shared memory until the thread's next push.
struct record_release {
  queue_record& record;
  ~record_release() {
    undo_unsent(record.handles);
    record.handles.held.clear();
    const buffer_release bytes{record.bytes};
  }
};

/// Decodes a record's bytes into a value and destroys it, so that the
/// storages it names let go of the references the record held; installed
/// by queue<T> for the records the last holder of a queue drains.
using record_drop = void (*)(std::span<const std::byte> bytes);

std::shared_ptr<queue_core> make_queue_core(std::size_t capacity, std::string_view signature,
                                            record_drop drop = nullptr);
bool queue_try_push(queue_core& q, queue_record& r);
bool queue_put(queue_core& q, queue_record& r, std::optional<std::chrono::nanoseconds> timeout);
asio::awaitable<void> queue_push(std::shared_ptr<queue_core> q, queue_record& r);
/// A record a pop took, from the take until its decode has ended. Its
/// place in the ring is kept from pushes meanwhile, and the decode notes in
/// the queue how far it got, so that when this process is killed in
/// between, the references of the handles it had not reached are let go
/// of: by a push that finds the ring full, or by the queue's last holder.
/// Ending it unread (destroyed before any decode) lets go of them here.
/// A pop claims nothing when the queue's 64 claims are all in use.
class record_claim {
 public:
  record_claim() noexcept = default;
  record_claim(const record_claim&) = delete;
  record_claim& operator=(const record_claim&) = delete;
  ~record_claim() {
    if (core_ != nullptr) end();
  }

 private:
  friend class queue_core;
  friend class claim_decoding;
  void end() noexcept;

  queue_core* core_ = nullptr;  // null: nothing claimed
  std::uint32_t slot_ = 0;
  bool decoded_ = false;
  std::span<const std::byte> record_;  // the record as the decode reads it
  storage block_;                      // a value's block of its own, held until the end
};

/// While a claimed record decodes on this thread: its handles' reads note
/// how far they got.
class claim_decoding {
 public:
  claim_decoding(record_claim& claim, std::span<const std::byte> record) noexcept;
  claim_decoding(const claim_decoding&) = delete;
  claim_decoding& operator=(const claim_decoding&) = delete;
  ~claim_decoding();

 private:
  bool noting_ = false;
  alignas(void*) std::byte before_[3 * sizeof(void*)];  // what this thread noted before, put back at the end
};

bool queue_try_pop(queue_core& q, std::vector<std::byte>& out, record_claim* claim = nullptr);
bool queue_get(queue_core& q, std::vector<std::byte>& out, std::optional<std::chrono::nanoseconds> timeout,
               record_claim* claim = nullptr);
asio::awaitable<void> queue_pop(std::shared_ptr<queue_core> q, std::vector<std::byte>& out,
                                record_claim* claim = nullptr);
void queue_close(queue_core& q);
bool queue_closed_now(const queue_core& q);
std::size_t queue_size(const queue_core& q);
std::size_t queue_capacity(const queue_core& q);
/// Waits counted asleep now, on pops and on pushes (for tests).
std::pair<std::uint32_t, std::uint32_t> queue_sleepers(const queue_core& q);
/// Moves an empty queue's head and tail to where `values` values taking
/// `lines` cache lines of the ring would have left them (for tests of what
/// wraps past 2^32); throws std::logic_error when the queue holds values.
void queue_skip_ahead(queue_core& q, std::uint32_t values, std::uint32_t lines);
/// Counts this process a producer of the queue from now on, as its first
/// push would: a consumer's wait ends (peer_lost) once every producer has
/// gone, this process among them even if it never pushed. For a queue whose
/// one producer is known before it pushes (a pool's parent).
void queue_join_as_producer(queue_core& q);
/// Marks the queue's table of processes as missing one, as a process that
/// found it full leaves it (for tests).
void queue_mark_peers_incomplete(queue_core& q);
/// The core of a typed queue (for tests).
struct queue_access {
  template <class Q>
  static queue_core& core(const Q& q) noexcept {
    return *q.core_;
  }
};
/// The storage holding the queue's shared state, which is how it crosses.
const storage& queue_storage(const queue_core& q);
std::shared_ptr<queue_core> queue_from_storage(storage s, std::string_view signature, record_drop drop = nullptr);

/// A record's bytes are the value's, then the end that end_handle_record
/// writes (storage.hpp): end_record appends that to a value written into `r`.
void end_record(queue_record& r);

/// Encodes a value into a record's bytes; keeps the storages it names.
template <class T>
void fill_record(queue_record& r, const T& value) {
  r.bytes.clear();
  r.handles.held.clear();
  r.handles.handle_at.clear();
  r.overflowed = false;
  {
    handle_scope scope(r.handles);
    write(r.bytes, value);
  }
  end_record(r);
}

template <class T>
T read_record(std::span<const std::byte> bytes);

/// Called while a value popped from `q` fails to decode: throws peer_lost
/// naming its sender when the value's shared memory went with a sender
/// that has exited, else the failure itself.
[[noreturn]] void rethrow_receive_failure(queue_core& q);

/// A popped record decoded into a value.
template <class T>
T receive_record(queue_core& q, std::span<const std::byte> bytes, record_claim& claim) {
  const claim_decoding decoding(claim, bytes);
  try {
    return read_record<T>(bytes);
  } catch (const shm_error&) {
    rethrow_receive_failure(q);
  }
}

template <class T>
void drop_record(std::span<const std::byte> bytes) {
  (void)read_record<T>(bytes);
}

#if COHORT_AWAIT_TEMPORARY_BUG
/// Nothing converts to it: a std::initializer_list of it can only be `{}`.
struct no_element {
  no_element() = delete;
};

/// A vector given in braces as an element of a pair or tuple: a constructor
/// gathers the values, where the vector's own would take a
/// std::initializer_list. Also a named vector, or `{}`.
template <class V>
class braced_vector {
 public:
  braced_vector() = default;
  braced_vector(V values) : values_(std::move(values)) {}
  template <class... U>
    requires(sizeof...(U) > 0 && (std::convertible_to<U, typename V::value_type> && ...))
  braced_vector(U&&... each) {
    values_.reserve(sizeof...(U));
    (values_.emplace_back(std::forward<U>(each)), ...);
  }
  V take() && { return std::move(values_); }

 private:
  V values_;
};

template <class E>
struct braced_part {
  using type = E;
};
template <class E>
struct braced_part<std::vector<E>> {
  using type = braced_vector<std::vector<E>>;
};

template <class E>
E&& part_value(E& part) {
  return std::move(part);
}
template <class V>
V part_value(braced_vector<V>& part) {
  return std::move(part).take();
}

template <class T>
inline constexpr bool holds_vector = false;
template <class... E>
inline constexpr bool holds_vector<std::tuple<E...>> = (is_vector<E> || ...);
template <class A, class B>
inline constexpr bool holds_vector<std::pair<A, B>> = is_vector<A> || is_vector<B>;

/// A pair or tuple holding a vector, pushed as values in braces,
/// `{"a", {1, 2}}`: its constructor takes each element, a vector's as
/// braced_vector does.
template <class T>
class braced_tuple;
template <template <class...> class Tuple, class... E>
class braced_tuple<Tuple<E...>> {
 public:
  braced_tuple(typename braced_part<E>::type... parts) : value_(part_value(parts)...) {}
  Tuple<E...> take() && { return std::move(value_); }

 private:
  Tuple<E...> value_;
};
#endif

}  // namespace detail

/// A bounded FIFO of T shared by processes: copies and handles sent to
/// other processes (as entry point arguments or through queues) are the
/// same queue. T is any crossable type: tensors, storages, and vectors and
/// tuples of them arrive as views of the sender's shared memory (a private
/// tensor is moved into shared memory when pushed); scalars, strings and
/// bytes are copied. Values larger than a quarter of the ring travel in a
/// shared block of their own, and so do values the ring's bytes cannot
/// hold while the queue holds fewer than its capacity: a queue takes
/// `capacity` values whatever their sizes.
///
/// Every call may come from any thread; a cancellation slot's signal comes
/// from the operation's executor, as asio requires (on an io_context run by
/// several threads, a strand). A wait ends with peer_lost when the
/// processes that could end it are all gone (see peer_lost); processes
/// count as producers once they have pushed, as consumers once they have
/// popped, so a pop whose producers so far have all exited ends with
/// peer_lost though a process that has not pushed yet may still. The
/// waiting process never counts for its own wait, so that a process left
/// alone with a queue it fed itself is told rather than kept waiting; a
/// wait for values another thread of the same process will push ends
/// with peer_lost too, once the other processes are gone. A queue tells
/// this from a table of the processes that used it, 256 alive at once at
/// most: once a 257th joins while all 256 are there, it goes unrecorded
/// and the queue never again ends a wait with peer_lost (it could be
/// wrong); its waits then end by a value, room, close() or their timeout.
/// Values
/// pushed and never popped are dropped, and their shared memory let go of,
/// when the last process holding the queue lets go of it (see queue_core's
/// holders); a queue a process killed outright still held keeps them while
/// a live process holds a handle to it. The holders are recorded in 128
/// slots; a slot of a process killed holding the queue is taken again.
/// Past 128 live at once, the others go unrecorded, and the values wait
/// for each of those to let go as well: one of them killed outright keeps
/// them.
template <crossable T>
class queue {
 public:
  /// A queue of at most `capacity` values, 1 to 2^24 (std::invalid_argument
  /// otherwise: every queue is bounded, so Python's maxsize 0, unbounded,
  /// has no equal here). Its ring of shared memory is reserved in full at
  /// once: 128 bytes per value of capacity, rounded up to a power of two,
  /// and at least 64 KiB (128 KiB for the default 1024, 128 MiB for 2^20,
  /// 2 GiB for 2^24; mind a container's small /dev/shm under the
  /// file_system strategy). Throws shm_error when its shared memory cannot
  /// be had.
  explicit queue(std::size_t capacity = 1024)
      : core_(detail::make_queue_core(capacity, type_signature<T>(), &detail::drop_record<T>)) {}
  /// Copies are handles to the same queue. A move copies too, so a queue
  /// moved from is still that queue, never an empty handle to crash on.
  queue(const queue&) = default;
  queue& operator=(const queue&) = default;

  /// Pushes unless full; false when full. Throws queue_closed.
  bool try_push(const T& value) {
    auto& r = record();
    const detail::record_release release{r};
    detail::fill_record(r, value);
    return detail::queue_try_push(*core_, r);
  }
  /// Pops unless empty; nullopt when empty. Throws queue_closed once closed
  /// and empty; peer_lost, naming the sender, for a value whose shared
  /// memory went with its sender (see peer_lost); decode_error or shm_error
  /// for any other value that cannot be received. The queue goes on after
  /// each, and the rest of a value that failed partway is let go of: the
  /// shared memory its other storages name is held no longer for it.
  std::optional<T> try_pop() {
    auto& out = buffer();
    const detail::buffer_release release{out};
    detail::record_claim claim;
    if (!detail::queue_try_pop(*core_, out, &claim)) return std::nullopt;
    return detail::receive_record<T>(*core_, out, claim);
  }

  /// Pushes, blocking while full; false when `timeout` passed first.
  /// Throws queue_closed, peer_lost.
  bool put(const T& value, std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    auto& r = record();
    const detail::record_release release{r};
    detail::fill_record(r, value);
    return detail::queue_put(*core_, r, timeout);
  }
  /// Pops, blocking while empty; nullopt when `timeout` passed first.
  /// Throws queue_closed, peer_lost, and what try_pop throws.
  std::optional<T> get(std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    auto& out = buffer();
    const detail::buffer_release release{out};
    detail::record_claim claim;
    if (!detail::queue_get(*core_, out, timeout, &claim)) return std::nullopt;
    return detail::receive_record<T>(*core_, out, claim);
  }
  /// put() and get() with a timeout of any duration type: one too long to
  /// count in nanoseconds (seconds::max(), hours::max()) waits without end,
  /// where its conversion would wrap to a negative timeout.
  template <class Rep, class Period>
  bool put(const T& value, std::chrono::duration<Rep, Period> timeout) {
    return put(value, std::optional(detail::saturating_cast<std::chrono::nanoseconds>(timeout)));
  }
  template <class Rep, class Period>
  std::optional<T> get(std::chrono::duration<Rep, Period> timeout) {
    return get(std::optional(detail::saturating_cast<std::chrono::nanoseconds>(timeout)));
  }

  /// Pushes, waiting while full; an asio asynchronous operation completing
  /// as void(std::exception_ptr), by default an asio::awaitable<void> that
  /// starts lazily, when awaited. It runs on the handler's associated
  /// executor, which must be an io_context's (the awaiting coroutine's for
  /// use_awaitable; bind one with asio::bind_executor for a callback or
  /// asio::use_future); a handler that names none is refused with
  /// std::invalid_argument, nothing pushed (see cohort/completion_token.hpp).
  /// `value` is encoded when the operation is made.
  /// Cancellation through the token's cancellation slot (of any type:
  /// terminal, partial or total) ends it with
  /// std::system_error(operation_aborted) and leaves the value unpushed.
  /// Fails as put() throws.
  template <completion_token_of<void> Token = default_token>
  [[nodiscard]] auto push(const T& value, Token&& token = {}) {
    auto r = std::make_shared<detail::queue_record>();
    detail::fill_record(*r, value);
    // Awaited (the default), it runs inside the awaiting coroutine: no
    // coroutine of its own to start, nor a trip through the executor.
    if constexpr (std::is_same_v<std::decay_t<Token>, default_token>) return push_record(core_, std::move(r));
    else return detail::async_awaitable<void>(
        std::nullopt,
        [core = core_, r](const asio::any_io_executor&) {
          return detail::taking_any_cancellation(push_record(core, r));
        },
        std::forward<Token>(token));
  }
#if COHORT_AWAIT_TEMPORARY_BUG
  /// Refused at compile time on g++ 12 and older, which cannot compile a
  /// std::initializer_list inside a co_await expression (cohort/compiler.hpp).
  /// Every braced list of values for a queue of vectors comes here, whatever
  /// its elements (nested, of mixed types): its element type is the
  /// vector's, not deduced, and a braced list converts to an
  /// initializer_list before a vector. The return type is deduced so that
  /// the reason is given at the call, before the compiler's own error at the
  /// function's end.
  template <class V = T>
    requires detail::is_vector<V>
  auto push(std::initializer_list<typename V::value_type> values) {
    static_assert(detail::refused<V>,
                  "g++ 12 cannot compile a braced list inside co_await: build the vector in a "
                  "variable first, then `co_await q.push(std::move(values));`");
    return push(V(values.begin(), values.end()));
  }
  /// The same with a token, where `{}` is refused too (see below).
  template <class Token, class V = T>
    requires detail::is_vector<V>
  auto push(std::initializer_list<typename V::value_type> values, Token&& token) {
    static_assert(detail::refused<V>,
                  "g++ 12 cannot compile a braced list inside co_await: build the vector in a "
                  "variable first, then `co_await q.push(std::move(values), token);`");
    return push(V(values.begin(), values.end()), std::forward<Token>(token));
  }
  /// `co_await q.push({})` pushes an empty vector, as it does with other
  /// compilers: an empty list has no array for g++ 12 to get wrong. This
  /// overload takes only an empty list, and takes it before the refusal
  /// above, which is a template. (With a token, no such overload can be
  /// preferred to the refusal's: g++ 12 finds the two ambiguous.)
  [[nodiscard]] auto push(std::initializer_list<detail::no_element>)
    requires detail::is_vector<T>
  {
    return push(T());
  }
  /// `co_await q.push({"a", {1, 2}})`, for a queue of pairs or tuples
  /// holding a vector, pushes as it does with other compilers: the braces
  /// go to constructors (detail::braced_tuple) rather than make the
  /// vector from a std::initializer_list. This overload takes the braces
  /// before push(const T&), which could take them too, as it is not a
  /// template. With a token none can be preferred, and the compiler's own
  /// error remains: build the value in a variable first.
  [[nodiscard]] auto push(detail::braced_tuple<T> values)
    requires detail::holds_vector<T>
  {
    return push(std::move(values).take());
  }
#endif
  /// Pops, waiting while empty; an asio asynchronous operation completing
  /// as void(std::exception_ptr, T), by default an asio::awaitable<T> that
  /// starts lazily, when awaited; it runs as push() does. Cancellation ends
  /// it with std::system_error(operation_aborted) and takes no value. Fails
  /// as get() throws.
  template <completion_token_of<T> Token = default_token>
  [[nodiscard]] auto pop(Token&& token = {}) {
    if constexpr (std::is_same_v<std::decay_t<Token>, default_token>) return pop_value(core_);
    else return detail::async_awaitable<T>(
        std::nullopt,
        [core = core_](const asio::any_io_executor&) { return detail::taking_any_cancellation(pop_value(core)); },
        std::forward<Token>(token));
  }

  /// Ends pushing, in every process: pushes throw queue_closed; pops drain
  /// what is left, then throw queue_closed. Waits in progress end.
  void close() { detail::queue_close(*core_); }
  bool closed() const { return detail::queue_closed_now(*core_); }
  /// Values in the queue now (already stale when it returns).
  std::size_t size() const { return detail::queue_size(*core_); }
  std::size_t capacity() const { return detail::queue_capacity(*core_); }

 private:
  friend struct detail::handle_codec<queue>;
  friend struct detail::queue_access;
  explicit queue(std::shared_ptr<detail::queue_core> core) noexcept : core_(std::move(core)) {}

  // `r` is held by the operation object, which may start (deferred) after
  // push() has returned.
  static asio::awaitable<void> push_record(std::shared_ptr<detail::queue_core> core,
                                           std::shared_ptr<detail::queue_record> r) {
    co_await detail::queue_push(std::move(core), *r);
  }
  static asio::awaitable<T> pop_value(std::shared_ptr<detail::queue_core> core) {
    std::vector<std::byte> out;
    detail::record_claim claim;
    co_await detail::queue_pop(core, out, &claim);
    co_return detail::receive_record<T>(*core, out, claim);
  }

  static detail::queue_record& record() {
    thread_local detail::queue_record r;
    return r;
  }
  static std::vector<std::byte>& buffer() {
    thread_local std::vector<std::byte> b;
    return b;
  }

  std::shared_ptr<detail::queue_core> core_;
};

/// queue<T>(capacity), as DESIGN's make_queue.
template <crossable T>
queue<T> make_queue(std::size_t capacity = 1024) {
  return queue<T>(capacity);
}

namespace detail {

template <class T>
T read_record(std::span<const std::byte> bytes) {
  return read_handle_record<T>(bytes, "cohort::queue: bytes follow a value");
}

/// A queue crosses as the storage of its shared state; the receiver checks
/// that it holds values of the same type.
template <class T>
struct handle_codec<queue<T>> {
  static std::string signature() {
    // Appended, not "q" + ...: g++ 12 warns (-Wrestrict) on that form once inlined.
    std::string s(1, 'q');
    s += type_signature<T>();
    return s;
  }
  static std::size_t size_bound(const queue<T>& q) { return handle_codec<storage>::size_bound(queue_storage(*q.core_)); }
  static void write(std::vector<std::byte>& out, const queue<T>& q) {
    handle_codec<storage>::write(out, queue_storage(*q.core_));
  }
  static queue<T> read(reader& in) {
    return queue<T>(queue_from_storage(handle_codec<storage>::read(in), type_signature<T>(), &drop_record<T>));
  }
};

}  // namespace detail

}  // namespace cohort

COHORT_API_END
