// A compact, typed binary encoding for values that cross between processes:
// a blob is [varint signature length][signature][payload], and decoding checks
// the signature and every length before it trusts the bytes.
#pragma once

#include "cohort/export.hpp"

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

namespace detail {

template <class T, class... Us>
inline constexpr bool one_of = (std::same_as<T, Us> || ...);

template <class T>
inline constexpr bool is_integer = one_of<T, char, signed char, unsigned char, short, unsigned short,
                                          int, unsigned, long, unsigned long, long long,
                                          unsigned long long>;

template <class T>
inline constexpr bool is_float = one_of<T, float, double>;

template <class T>
inline constexpr bool is_byte_vector = one_of<T, std::vector<std::byte>, std::vector<unsigned char>>;

class storage_impl;
struct encoded_holds;

/// Specialised by the types that cross as handles to shared memory
/// (storage, tensor, queue, event) with `static std::string signature()`,
/// `static std::size_t size_bound(const T&)`, `static void
/// write(std::vector<std::byte>&, const T&)` and `static T read(reader&)`.
template <class T>
struct handle_codec;

template <class T>
concept handle = requires { handle_codec<T>::signature(); };

/// What the handles in a value being encoded refer to. Each writer puts its
/// shared block in `held`, which keeps it alive: for as long as the encoded
/// value lives (arguments, encoded once for every rank), or until a queue
/// has given each its own reference for the message (`message` true), which
/// the receiver then takes over.
struct handle_context {
  bool message = false;
  std::vector<std::shared_ptr<storage_impl>> held;
  /// For a message: where each shared storage's handle starts in the bytes
  /// written, so a receiver that fails to decode the value partway can let
  /// go of the references of the handles it did not reach.
  std::vector<std::uint32_t> handle_at;
  /// For a message: what undoes the counts its writers took for it as they
  /// wrote (a device tensor's send), run if it is not sent after all (a
  /// push that found the queue full, timed out, was closed or cancelled);
  /// dropped once it is sent (hold_for_message).
  std::vector<std::function<void()>> if_unsent;
};
inline thread_local handle_context* current_handles = nullptr;

/// Runs what `context` holds for a message that was not sent, once.
inline void undo_unsent(handle_context& context) noexcept {
  auto undo = std::move(context.if_unsent);
  context.if_unsent.clear();
  for (auto& f : undo) {
    try {
      f();
    } catch (...) {
      // Left counted: the sender then waits for a receiver, as before.
    }
  }
}

// Whether T may cross, and whether its encoding takes no bytes at all (empty
// tuples): a vector of those would carry a count no input length can bound.
template <class T>
struct traits {
  static constexpr bool crossable =
      one_of<T, bool, std::string> || is_integer<T> || is_float<T> || handle<T>;
  static constexpr bool encodes_to_nothing = false;
};

template <class T>
struct traits<std::vector<T>> {
  static constexpr bool crossable =
      std::same_as<T, std::byte> || (traits<T>::crossable && !traits<T>::encodes_to_nothing);
  static constexpr bool encodes_to_nothing = false;
};

template <class... Ts>
struct traits<std::tuple<Ts...>> {
  static constexpr bool crossable = (traits<Ts>::crossable && ...);
  static constexpr bool encodes_to_nothing = (traits<Ts>::encodes_to_nothing && ...);
};

template <class A, class B>
struct traits<std::pair<A, B>> : traits<std::tuple<A, B>> {};

template <class T>
inline constexpr bool is_vector = false;
template <class T>
inline constexpr bool is_vector<std::vector<T>> = true;

}  // namespace detail

/// True for the types a value may have to cross to another process: bool,
/// the standard integer types (not the wide or UTF character types), float,
/// double, std::string, byte vectors (std::byte or unsigned char), handles
/// to shared memory (storage, tensor, queue, event), and vectors, tuples
/// and pairs of these. A vector of empty tuples is not.
template <class T>
concept crossable = detail::traits<T>::crossable;

/// What decode throws for a blob it cannot trust: a signature other than the
/// one asked for, truncated or trailing bytes, a malformed varint, a length
/// larger than the bytes left, an integer out of range, a bool other than 0/1.
class decode_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class T>
void append_signature(std::string& out) {
  if constexpr (std::same_as<T, bool>) {
    out += 'b';
  } else if constexpr (is_integer<T>) {
    out += std::is_signed_v<T> ? 'i' : 'u';
    out += static_cast<char>('0' + sizeof(T));
  } else if constexpr (is_float<T>) {
    out += 'f';
    out += static_cast<char>('0' + sizeof(T));
  } else if constexpr (std::same_as<T, std::string>) {
    out += 's';
  } else if constexpr (is_byte_vector<T>) {
    out += 'y';
  } else if constexpr (handle<T>) {
    out += handle_codec<T>::signature();
  } else if constexpr (is_vector<T>) {
    out += 'v';
    append_signature<typename T::value_type>(out);
  } else {
    out += "t(";
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (append_signature<std::tuple_element_t<I, T>>(out), ...);
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
    out += ')';
  }
}

}  // namespace detail

/// The canonical signature of T: b bool; i1 i2 i4 i8 signed and u1 u2 u4 u8
/// unsigned integers by size (char by its signedness); f4 f8; s string;
/// y byte vector; v<element> vector; t(<elements>) tuple or pair.
template <crossable T>
std::string type_signature() {
  std::string out;
  detail::append_signature<T>(out);
  return out;
}

namespace detail {

/// Writes `value` at `at` (room for 10 bytes); returns the byte after it.
inline std::byte* put_varint(std::byte* at, std::uint64_t value) noexcept {
  while (value >= 0x80) {
    *at++ = static_cast<std::byte>(value | 0x80);
    value >>= 7;
  }
  *at++ = static_cast<std::byte>(value);
  return at;
}

/// Room for at most `bound` bytes at the end of `out`, written through a
/// pointer and appended when the run ends: a handle's fields without a
/// capacity check per byte. Up to `local` bytes are gathered on the stack,
/// as `out` would zero the room it gives; a larger bound writes into `out`.
class byte_run {
 public:
  static constexpr std::size_t local = 256;

  byte_run(std::vector<std::byte>& out, std::size_t bound) : out_(out), start_(out.size()), on_stack_(bound <= local) {
    if (on_stack_) {
      out_.reserve(start_ + bound);  // the append at the end cannot throw
      at = local_;
    } else {
      out_.resize(start_ + bound);
      at = out_.data() + start_;
    }
  }
  byte_run(const byte_run&) = delete;
  byte_run& operator=(const byte_run&) = delete;
  ~byte_run() {
    if (on_stack_) {
      out_.insert(out_.end(), local_, at);
    } else {
      out_.resize(static_cast<std::size_t>(at - out_.data()));
    }
  }

  void byte(std::uint8_t b) noexcept { *at++ = std::byte{b}; }
  void varint(std::uint64_t v) noexcept { at = put_varint(at, v); }

  std::byte* at;

 private:
  std::vector<std::byte>& out_;
  std::size_t start_;
  bool on_stack_;
  std::byte local_[local];
};

inline void write_varint(std::vector<std::byte>& out, std::uint64_t value) {
  std::byte bytes[10];
  // At most ten bytes; said again so that g++ 12 sees it (-Warray-bounds).
  const auto size = std::min<std::size_t>(static_cast<std::size_t>(put_varint(bytes, value) - bytes), sizeof bytes);
  out.insert(out.end(), bytes, bytes + size);
}

inline void write_raw(std::vector<std::byte>& out, const void* data, std::size_t size) {
  const auto* first = static_cast<const std::byte*>(data);
  out.insert(out.end(), first, first + size);
}

template <class T>
constexpr std::size_t max_varint_size = (sizeof(T) * 8 + 6) / 7;

// The unsigned integer holding a float's IEEE-754 bits.
template <class T>
  requires std::numeric_limits<T>::is_iec559
using bits_of = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

// An upper bound on the payload size of `value`, so encode allocates once.
template <class T>
std::size_t size_bound(const T& value) {
  if constexpr (std::same_as<T, bool>) {
    return 1;
  } else if constexpr (is_integer<T>) {
    return max_varint_size<T>;
  } else if constexpr (is_float<T>) {
    return sizeof(T);
  } else if constexpr (std::same_as<T, std::string> || is_byte_vector<T>) {
    return max_varint_size<std::uint64_t> + value.size();
  } else if constexpr (handle<T>) {
    return handle_codec<T>::size_bound(value);
  } else if constexpr (is_vector<T>) {
    std::size_t size = max_varint_size<std::uint64_t>;
    if constexpr (std::is_arithmetic_v<typename T::value_type>) {
      size += value.size() * size_bound(typename T::value_type{});
    } else {
      for (const auto& element : value) size += size_bound(element);
    }
    return size;
  } else {
    return std::apply([](const auto&... e) { return (std::size_t{0} + ... + size_bound(e)); }, value);
  }
}

template <class T>
void write(std::vector<std::byte>& out, const T& value) {
  if constexpr (std::same_as<T, bool>) {
    out.push_back(std::byte{value});
  } else if constexpr (is_integer<T> && std::is_signed_v<T>) {
    const auto wide = static_cast<std::int64_t>(value);
    write_varint(out, (static_cast<std::uint64_t>(wide) << 1) ^ static_cast<std::uint64_t>(wide >> 63));
  } else if constexpr (is_integer<T>) {
    write_varint(out, value);
  } else if constexpr (is_float<T>) {
    const auto bits = std::bit_cast<bits_of<T>>(value);
    for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::byte>(bits >> (8 * i)));
  } else if constexpr (std::same_as<T, std::string> || is_byte_vector<T>) {
    write_varint(out, value.size());
    write_raw(out, value.data(), value.size());
  } else if constexpr (handle<T>) {
    handle_codec<T>::write(out, value);
  } else if constexpr (is_vector<T>) {
    write_varint(out, value.size());
    for (const auto& element : value) write(out, element);
  } else {
    std::apply([&](const auto&... e) { (write(out, e), ...); }, value);
  }
}

// Reads a payload front to back; every read checks the bytes left.
class reader {
 public:
  /// Where the bytes come from: a value (decode, arguments), or a queue's
  /// record, whose handles each come with a reference the queue took for
  /// them. A handle's own claim to such a reference is checked against
  /// this, never trusted.
  enum class source { value, queue_record };

  explicit reader(std::span<const std::byte> bytes, source from = source::value) noexcept
      : bytes_(bytes), from_queue_(from == source::queue_record) {}

  /// Whether the bytes are a queue's record.
  bool from_queue_record() const noexcept { return from_queue_; }

  std::size_t left() const noexcept { return bytes_.size() - position_; }
  /// How many bytes have been read.
  std::size_t position() const noexcept { return position_; }
  /// The first byte of what it reads.
  const std::byte* data() const noexcept { return bytes_.data(); }

  std::byte next() {
    if (left() == 0) throw decode_error("cohort::decode: the input ends early");
    return bytes_[position_++];
  }

  std::uint64_t varint() {
    std::uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      const auto byte = std::to_integer<std::uint64_t>(next());
      if (shift == 63 && byte > 1) {
        throw decode_error(byte & 0x80 ? "cohort::decode: a varint is longer than 10 bytes"
                                       : "cohort::decode: a varint overflows 64 bits");
      }
      value |= (byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
  }

  // A length or count; each unit takes at least one byte of what is left.
  std::size_t length() {
    const auto size = varint();
    if (size > left()) {
      throw decode_error("cohort::decode: a length of " + std::to_string(size) + " exceeds the " +
                         std::to_string(left()) + " bytes left");
    }
    return static_cast<std::size_t>(size);
  }

  std::span<const std::byte> take(std::size_t size) {
    const auto taken = bytes_.subspan(position_, size);
    position_ += size;
    return taken;
  }

 private:
  std::span<const std::byte> bytes_;
  std::size_t position_ = 0;
  bool from_queue_ = false;
};

template <class T>
T read(reader& in) {
  if constexpr (std::same_as<T, bool>) {
    const auto byte = std::to_integer<unsigned>(in.next());
    if (byte > 1) throw decode_error("cohort::decode: a bool byte is " + std::to_string(byte));
    return byte == 1;
  } else if constexpr (is_integer<T>) {
    const auto raw = in.varint();
    if constexpr (std::is_signed_v<T>) {
      const auto value = static_cast<std::int64_t>((raw >> 1) ^ (0 - (raw & 1)));
      if (value >= std::numeric_limits<T>::min() && value <= std::numeric_limits<T>::max()) {
        return static_cast<T>(value);
      }
      throw decode_error("cohort::decode: " + std::to_string(value) + " is out of range for " +
                         type_signature<T>());
    } else {
      if (raw <= std::uint64_t{std::numeric_limits<T>::max()}) return static_cast<T>(raw);
      throw decode_error("cohort::decode: " + std::to_string(raw) + " is out of range for " +
                         type_signature<T>());
    }
  } else if constexpr (is_float<T>) {
    bits_of<T> bits = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) bits |= std::to_integer<bits_of<T>>(in.next()) << (8 * i);
    return std::bit_cast<T>(bits);
  } else if constexpr (std::same_as<T, std::string> || is_byte_vector<T>) {
    const auto bytes = in.take(in.length());
    const auto* first = reinterpret_cast<const typename T::value_type*>(bytes.data());
    return T(first, first + bytes.size());
  } else if constexpr (handle<T>) {
    return handle_codec<T>::read(in);
  } else if constexpr (is_vector<T>) {
    const auto count = in.length();
    T value;
    // Each element takes a byte at least of what is left, but may be far
    // larger in memory: reserved for no more than the bytes left, grown
    // as elements do decode.
    value.reserve(std::min(count, in.left() / sizeof(typename T::value_type)));
    for (std::size_t i = 0; i < count; ++i) value.push_back(read<typename T::value_type>(in));
    return value;
  } else {
    // Braced initialisation reads the elements in order.
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return T{read<std::tuple_element_t<I, T>>(in)...};
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  }
}

struct parts {
  std::string_view signature;
  std::span<const std::byte> payload;
};

// a == b, compared here rather than by memcmp: a forked rank decodes its
// arguments first thing, and a library call this program has not made before
// is a symbol lookup in every child, tens of microseconds each.
inline bool same_text(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// A signature as a message shows it: a byte outside printable ASCII, or a
// backslash, as \xNN. A corrupted blob's signature may hold any byte.
inline std::string printable(std::string_view text) {
  constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      out += c;
    } else {
      out += {'\\', 'x', digits[byte >> 4], digits[byte & 0xf]};
    }
  }
  return out;
}

// Splits a blob into its signature and payload; throws decode_error when the
// prefix is malformed.
inline parts split(std::span<const std::byte> blob) {
  reader in(blob);
  const auto signature = in.take(in.length());
  return {{reinterpret_cast<const char*>(signature.data()), signature.size()}, in.take(in.left())};
}

}  // namespace detail

/// An encoded value: owns [varint signature length][signature][payload].
/// Copyable and movable; a default-constructed one is empty and holds no value.
class encoded {
 public:
  encoded() = default;

  /// Adopts bytes received from elsewhere. Throws decode_error when the
  /// signature prefix is malformed; the payload is checked by decode.
  static encoded from_bytes(std::vector<std::byte> bytes) {
    detail::split(bytes);
    return encoded(std::move(bytes));
  }

  std::span<const std::byte> bytes() const noexcept { return bytes_; }
  std::size_t size() const noexcept { return bytes_.size(); }
  bool empty() const noexcept { return bytes_.empty(); }

  /// The signature of the value held; empty when none is.
  std::string_view signature() const {
    return empty() ? std::string_view{} : detail::split(bytes_).signature;
  }

  /// decode<T>(*this).
  template <crossable T>
  T as() const;

 private:
  explicit encoded(std::vector<std::byte> bytes) noexcept : bytes_(std::move(bytes)) {}

  template <crossable T>
  friend encoded encode(const T& value);
  friend struct detail::encoded_holds;

  std::vector<std::byte> bytes_;
  std::shared_ptr<const void> held_;  // the shared blocks its handles name
};

namespace detail {

/// What keeps the shared memory an encoded value names alive: the storages
/// encode() held (a std::vector<std::shared_ptr<storage_impl>>), or what a
/// process that received the value took over for it.
struct encoded_holds {
  static const std::shared_ptr<const void>& of(const encoded& value) noexcept { return value.held_; }
  static void set(encoded& value, std::shared_ptr<const void> held) noexcept { value.held_ = std::move(held); }
};

// Makes `context` the current one for as long as it lives.
class handle_scope {
 public:
  explicit handle_scope(handle_context& context) noexcept : saved_(std::exchange(current_handles, &context)) {}
  handle_scope(const handle_scope&) = delete;
  handle_scope& operator=(const handle_scope&) = delete;
  ~handle_scope() { current_handles = saved_; }

 private:
  handle_context* saved_;
};

}  // namespace detail

/// Encodes `value`. The encoded value keeps the shared memory its handles
/// name alive, so every process that decodes it while it lives finds it.
/// Throws what allocation throws, and shm_error when a handle's private
/// memory cannot be moved into shared memory.
template <crossable T>
encoded encode(const T& value) {
  const auto signature = type_signature<T>();
  std::vector<std::byte> out;
  out.reserve(detail::max_varint_size<std::uint64_t> + signature.size() + detail::size_bound(value));
  detail::write_varint(out, signature.size());
  detail::write_raw(out, signature.data(), signature.size());
  detail::handle_context context;
  {
    detail::handle_scope scope(context);
    detail::write(out, value);
  }
  encoded result(std::move(out));
  if (!context.held.empty()) {
    result.held_ = std::make_shared<std::vector<std::shared_ptr<detail::storage_impl>>>(std::move(context.held));
  }
  return result;
}

/// Decodes a blob holding a T. Throws decode_error when the blob holds
/// another type or is malformed; never reads past `blob`, and allocates no
/// more than the blob's own length can justify.
template <crossable T>
T decode(std::span<const std::byte> blob) {
  const auto [signature, payload] = detail::split(blob);
  if (const auto wanted = type_signature<T>(); !detail::same_text(signature, wanted)) {
    throw decode_error("cohort::decode: the value is " + detail::printable(signature) + ", asked for " +
                       detail::printable(wanted));
  }
  detail::reader in(payload);
  T value = detail::read<T>(in);
  if (in.left() != 0) {
    throw decode_error("cohort::decode: " + std::to_string(in.left()) +
                       " bytes follow the value");
  }
  return value;
}

/// decode<T>(value.bytes()).
template <crossable T>
T decode(const encoded& value) {
  return decode<T>(value.bytes());
}

template <crossable T>
T encoded::as() const {
  return decode<T>(bytes_);
}

}  // namespace cohort

COHORT_API_END
