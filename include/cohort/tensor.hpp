// cohort::tensor: a typed, strided view of a storage's bytes (torch's Tensor
// on the CPU), its element types, and the exchange with DLPack.
#pragma once

#include "cohort/export.hpp"

#include "cohort/storage.hpp"

#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

COHORT_API_BEGIN

namespace cohort {

/// The type of a tensor's elements.
enum class dtype : std::uint8_t {
  int8,
  int16,
  int32,
  int64,
  uint8,
  uint16,
  uint32,
  uint64,
  float16,
  bfloat16,
  float32,
  float64,
  boolean,
};

/// DLPack's type code for bool (one byte, 0 or 1). It came after DLPack 0.6,
/// whose header this build may have.
inline constexpr std::uint8_t dlpack_bool_code = 6;

namespace detail {

struct dtype_info {
  std::string_view name;
  std::uint8_t code;  // DLPack's type code
  std::uint8_t bits;
};

// Indexed by dtype.
inline constexpr std::array<dtype_info, 13> dtypes{{
    {"int8", kDLInt, 8},
    {"int16", kDLInt, 16},
    {"int32", kDLInt, 32},
    {"int64", kDLInt, 64},
    {"uint8", kDLUInt, 8},
    {"uint16", kDLUInt, 16},
    {"uint32", kDLUInt, 32},
    {"uint64", kDLUInt, 64},
    {"float16", kDLFloat, 16},
    {"bfloat16", kDLBfloat, 16},
    {"float32", kDLFloat, 32},
    {"float64", kDLFloat, 64},
    {"bool", dlpack_bool_code, 8},
}};

/// A dtype's entry; std::invalid_argument for a value outside the enum (a
/// cast of any byte is one), which no tensor is made with.
constexpr const dtype_info& info(dtype type) {
  const auto i = static_cast<std::size_t>(type);
  if (i >= dtypes.size()) throw std::invalid_argument(fmt::format("cohort: dtype {} is none of cohort::dtype's", i));
  return dtypes[i];
}

}  // namespace detail

/// Bytes per element: 1, 2, 4 or 8.
constexpr std::size_t element_size(dtype type) { return detail::info(type).bits / 8; }
/// torch's name: "int64", "bfloat16", "bool".
constexpr std::string_view to_string(dtype type) { return detail::info(type).name; }
/// DLPack's type code (kDLInt, kDLUInt, kDLFloat, kDLBfloat, dlpack_bool_code).
constexpr std::uint8_t dtype_code(dtype type) { return detail::info(type).code; }
/// Bits per element.
constexpr std::uint8_t dtype_bits(dtype type) { return detail::info(type).bits; }

/// The dtype with DLPack type code `code` and `bits` bits; nullopt for any
/// other pair. How a receiver checks a dtype it was sent as raw bytes.
constexpr std::optional<dtype> dtype_from_code(std::uint8_t code, std::uint8_t bits) {
  for (std::size_t i = 0; i < detail::dtypes.size(); ++i) {
    if (detail::dtypes[i].code == code && detail::dtypes[i].bits == bits)
      return static_cast<dtype>(i);
  }
  return std::nullopt;
}

/// One lane.
constexpr DLDataType to_dlpack(dtype type) { return {dtype_code(type), dtype_bits(type), 1}; }
/// nullopt for vector types (lanes other than 1) and for types cohort lacks.
constexpr std::optional<dtype> dtype_from_dlpack(DLDataType type) {
  if (type.lanes != 1) return std::nullopt;
  return dtype_from_code(type.code, type.bits);
}

/// An IEEE 754 half-precision number, held as its bits.
struct float16 {
  std::uint16_t bits = 0;

  constexpr float16() = default;
  /// Rounds to nearest, ties to even; beyond ±65504 gives ±infinity, below
  /// 2^-14 a subnormal or zero; NaN stays NaN.
  constexpr explicit float16(float value) noexcept : bits(from_float(value)) {}
  static constexpr float16 from_bits(std::uint16_t value) noexcept {
    float16 out;
    out.bits = value;
    return out;
  }
  /// Exact.
  constexpr explicit operator float() const noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1F;
    const std::uint32_t mantissa = bits & 0x3FF;
    if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000 | mantissa << 13);
    if (exponent == 0) {
      const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
      return sign != 0 ? -magnitude : magnitude;
    }
    return std::bit_cast<float>(sign | (exponent + 112) << 23 | mantissa << 13);
  }
  /// By value: -0 equals +0, NaN equals nothing.
  friend constexpr bool operator==(float16 a, float16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }

 private:
  static constexpr std::uint16_t from_float(float value) noexcept {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (f >> 16) & 0x8000;
    const std::uint32_t magnitude = f & 0x7FFFFFFF;
    std::uint32_t half;
    if (magnitude > 0x7F800000) {
      half = 0x7E00 | (magnitude >> 13 & 0x3FF);  // quiet, keeping the payload's top bits
    } else if (magnitude >= 0x477FF000) {
      half = 0x7C00;  // 65520 and up: halfway to 2^16 or past it
    } else if (magnitude >= 0x38800000) {
      // Normal: rebias the exponent; adding just under half a unit of the
      // last place, plus the kept lowest bit, rounds ties to even.
      half = (magnitude - 0x38000000 + 0xFFF + (magnitude >> 13 & 1)) >> 13;
    } else if (magnitude >= 0x33000000) {
      // Subnormal: the significand, with its leading one, in units of 2^-24.
      const std::uint32_t significand = (magnitude & 0x7FFFFF) | 0x800000;
      const std::uint32_t shift = 126 - (magnitude >> 23);
      const std::uint32_t rest = significand & ((1u << shift) - 1);
      const std::uint32_t tie = 1u << (shift - 1);
      half = significand >> shift;
      if (rest > tie || (rest == tie && (half & 1) != 0)) ++half;
    } else {
      half = 0;  // under 2^-25, half the smallest subnormal
    }
    return static_cast<std::uint16_t>(sign | half);
  }
};

/// A bfloat16 number: the top half of a float's bits.
struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() = default;
  /// Rounds to nearest, ties to even; NaN stays NaN.
  constexpr explicit bfloat16(float value) noexcept : bits(from_float(value)) {}
  static constexpr bfloat16 from_bits(std::uint16_t value) noexcept {
    bfloat16 out;
    out.bits = value;
    return out;
  }
  /// Exact.
  constexpr explicit operator float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  /// By value: -0 equals +0, NaN equals nothing.
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }

 private:
  static constexpr std::uint16_t from_float(float value) noexcept {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    if ((f & 0x7FFFFFFF) > 0x7F800000) return static_cast<std::uint16_t>(f >> 16 | 0x0040);
    return static_cast<std::uint16_t>((f + 0x7FFF + (f >> 16 & 1)) >> 16);
  }
};

namespace detail {

template <class T>
inline constexpr std::optional<dtype> dtype_for = std::nullopt;
template <> inline constexpr std::optional<dtype> dtype_for<std::int8_t> = dtype::int8;
template <> inline constexpr std::optional<dtype> dtype_for<std::int16_t> = dtype::int16;
template <> inline constexpr std::optional<dtype> dtype_for<std::int32_t> = dtype::int32;
template <> inline constexpr std::optional<dtype> dtype_for<std::int64_t> = dtype::int64;
template <> inline constexpr std::optional<dtype> dtype_for<std::uint8_t> = dtype::uint8;
template <> inline constexpr std::optional<dtype> dtype_for<std::uint16_t> = dtype::uint16;
template <> inline constexpr std::optional<dtype> dtype_for<std::uint32_t> = dtype::uint32;
template <> inline constexpr std::optional<dtype> dtype_for<std::uint64_t> = dtype::uint64;
template <> inline constexpr std::optional<dtype> dtype_for<float16> = dtype::float16;
template <> inline constexpr std::optional<dtype> dtype_for<bfloat16> = dtype::bfloat16;
template <> inline constexpr std::optional<dtype> dtype_for<float> = dtype::float32;
template <> inline constexpr std::optional<dtype> dtype_for<double> = dtype::float64;
template <> inline constexpr std::optional<dtype> dtype_for<bool> = dtype::boolean;

}  // namespace detail

/// A C++ type a tensor's elements may have: the fixed-width integers,
/// float16, bfloat16, float, double and bool.
template <class T>
concept element = detail::dtype_for<T>.has_value();

/// The dtype of elements of type T.
template <element T>
inline constexpr dtype dtype_of = *detail::dtype_for<T>;

/// Where a tensor's bytes live: the CPU, or a CUDA device (kDLCUDA and
/// this process's index of it), whose tensors cohort/cuda/tensor.hpp makes.
struct device {
  DLDeviceType type = kDLCPU;
  int id = 0;

  bool operator==(const device&) const = default;
};

namespace detail {

/// A tensor's sizes or strides. Up to six are held inline, so tensors of the
/// usual ranks are made and copied without allocating; more go to the heap.
class dim_vector {
 public:
  static constexpr std::size_t inline_capacity = 6;

  dim_vector() noexcept = default;
  /// `size` zeros.
  explicit dim_vector(std::size_t size) : size_(size) {
    if (size > inline_capacity) heap_ = std::make_unique<std::int64_t[]>(size);
  }
  explicit dim_vector(std::span<const std::int64_t> values) : dim_vector(values.size()) {
    std::copy(values.begin(), values.end(), data());
  }
  dim_vector(const dim_vector& other) : dim_vector(other.view()) {}
  /// Leaves `other` empty.
  dim_vector(dim_vector&& other) noexcept
      : inline_(other.inline_), heap_(std::move(other.heap_)), size_(other.size_) {
    other.size_ = 0;
  }
  dim_vector& operator=(const dim_vector& other) { return *this = dim_vector(other); }
  dim_vector& operator=(dim_vector&& other) noexcept {
    inline_ = other.inline_;
    heap_ = std::move(other.heap_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  std::size_t size() const noexcept { return size_; }
  std::int64_t* data() noexcept { return heap_ ? heap_.get() : inline_.data(); }
  const std::int64_t* data() const noexcept { return heap_ ? heap_.get() : inline_.data(); }
  std::int64_t& operator[](std::size_t i) noexcept { return data()[i]; }
  std::int64_t operator[](std::size_t i) const noexcept { return data()[i]; }
  std::span<const std::int64_t> view() const noexcept { return {data(), size_}; }
  /// Holds `value` alone.
  void assign_one(std::int64_t value) noexcept {
    heap_.reset();
    inline_[0] = value;
    size_ = 1;
  }

 private:
  std::array<std::int64_t, inline_capacity> inline_{};
  std::unique_ptr<std::int64_t[]> heap_;
  std::size_t size_ = 0;
};

/// Checks that a layout fits its storage, for tensors built from
/// descriptors another process sent. Throws std::invalid_argument, naming
/// the fault, for more than 64 dimensions, shape and strides of different
/// lengths, a negative size, stride or offset, a furthest element whose byte
/// position overflows int64, or one past `storage_nbytes`. A layout with no
/// elements needs no bytes.
void check_layout(dtype type, std::span<const std::int64_t> shape,
                  std::span<const std::int64_t> strides, std::int64_t offset,
                  std::size_t storage_nbytes);

/// The element count of a new contiguous tensor of `shape`, whose bytes
/// must fit int64. Throws std::invalid_argument, its message starting with
/// `operation` ("tensor::empty"), for more than 64 dimensions, a negative
/// size, or bytes that overflow.
std::int64_t checked_numel(std::span<const std::int64_t> shape, dtype type, std::string_view operation);
/// Row-major strides of `shape`, a size of 0 counting as 1 (as torch's).
/// Throws std::invalid_argument when they overflow.
dim_vector contiguous_strides(std::span<const std::int64_t> shape);

}  // namespace detail

/// A value for full() and fill_(), as torch's Scalar: an integer of any
/// type is held exactly (bool as 0 or 1), a floating-point value as a
/// double. So int64 values past 2^53 fill an int64 tensor as they are.
class scalar {
 public:
  template <std::integral T>
  constexpr scalar(T value) noexcept  // NOLINT: converts, as a number argument does
      : kind_(std::is_signed_v<T> ? kind::signed_integer : kind::unsigned_integer),
        signed_(std::is_signed_v<T> ? static_cast<std::int64_t>(value) : 0),
        unsigned_(std::is_signed_v<T> ? 0 : static_cast<std::uint64_t>(value)) {}
  template <std::floating_point T>
  constexpr scalar(T value) noexcept : kind_(kind::floating), floating_(static_cast<double>(value)) {}  // NOLINT

  enum class kind { signed_integer, unsigned_integer, floating };
  constexpr kind held() const noexcept { return kind_; }
  constexpr std::int64_t signed_value() const noexcept { return signed_; }
  constexpr std::uint64_t unsigned_value() const noexcept { return unsigned_; }
  /// The value as a double (rounded, for an integer past 2^53).
  constexpr double as_double() const noexcept {
    return kind_ == kind::floating         ? floating_
           : kind_ == kind::signed_integer ? static_cast<double>(signed_)
                                           : static_cast<double>(unsigned_);
  }

 private:
  kind kind_;
  std::int64_t signed_ = 0;
  std::uint64_t unsigned_ = 0;
  double floating_ = 0;
};

/// How a new tensor's storage is made.
struct tensor_options {
  /// In shared memory (storage::allocate_shared), to send to other
  /// processes without a copy; private memory otherwise.
  bool shared = false;
};
// The `= {}` default arguments below are made inside the co_await
// expressions that call them, where g++ 12 destroys an aggregate twice
// (cohort/compiler.hpp): harmless only while destroying one does nothing.
static_assert(std::is_trivially_destructible_v<tensor_options>,
              "tensor_options must stay trivially destructible: g++ 12 destroys its `= {}` default "
              "argument twice inside co_await; make the defaults overloads (as spawn's options are) "
              "before giving it a member that owns memory");

/// Integers given as a tensor's shape or as an index into one: in braces,
/// `tensor::zeros({2, 3}, dtype::float32)`, `t.at<float>({0, 1})`, `{}` for
/// none (a 0-d shape), each converted to int64; or any contiguous range of
/// int64 (a std::vector, a std::array, another tensor's shape()). The
/// braces call a constructor rather than make a std::initializer_list,
/// which g++ 12 cannot compile inside a co_await expression
/// (cohort/compiler.hpp), so a tensor may be made right in
/// `co_await q.push(tensor::zeros({2, 3}, dtype::float32))`. A list made of
/// integers holds them (up to six without allocating); one made from a
/// range refers to it, and is valid while the range is.
class int_list {
 public:
  int_list() noexcept = default;
  template <std::integral... I>
    requires(sizeof...(I) > 0)
  int_list(I... values) : owned_(sizeof...(I)) {
    std::size_t i = 0;
    ((owned_[i++] = static_cast<std::int64_t>(values)), ...);
  }
  template <class R>
    requires std::convertible_to<R&&, std::span<const std::int64_t>>
  int_list(R&& values) noexcept : borrowed_(std::forward<R>(values)) {}

  std::span<const std::int64_t> view() const noexcept {
    return borrowed_.empty() ? owned_.view() : borrowed_;
  }

 private:
  std::span<const std::int64_t> borrowed_;
  detail::dim_vector owned_;
};

/// A typed, strided view of a storage: torch's Tensor on the CPU, without
/// arithmetic. Sizes, strides and the storage offset count elements. Copies
/// and views (slice, select, transpose, reshape) share the storage, so a
/// write through one is seen through all; clone() copies the elements.
/// Shapes of up to six dimensions are held inline: making or copying such a
/// tensor allocates nothing besides its storage. At most 64 dimensions.
///
/// Thread-safety is the storage's: distinct tensors may be used from
/// distinct threads, and writes to shared elements need the caller's
/// synchronisation. A moved-from tensor is what tensor() makes.
class tensor {
 public:
  static constexpr std::size_t max_ndim = 64;

  /// A float32 tensor of shape [0], without storage.
  tensor();
  tensor(const tensor&) = default;
  tensor& operator=(const tensor&) = default;
  /// Leaves `other` as tensor() makes it, never a tensor of one element
  /// over no storage.
  tensor(tensor&& other) noexcept
      : storage_(std::move(other.storage_)),
        offset_(other.offset_),
        shape_(std::move(other.shape_)),
        strides_(std::move(other.strides_)),
        dtype_(other.dtype_),
        device_(other.device_) {
    other.make_empty();
  }
  tensor& operator=(tensor&& other) noexcept {
    if (this != &other) {
      storage_ = std::move(other.storage_);
      offset_ = other.offset_;
      shape_ = std::move(other.shape_);
      strides_ = std::move(other.strides_);
      dtype_ = other.dtype_;
      device_ = other.device_;
      other.make_empty();
    }
    return *this;
  }
  /// A view of `storage`; throws std::invalid_argument when the layout does
  /// not fit it (detail::check_layout), or when the device is not the
  /// storage's (the CPU for host memory).
  tensor(cohort::storage storage, cohort::dtype type, std::span<const std::int64_t> shape,
         std::span<const std::int64_t> strides, std::int64_t offset = 0,
         cohort::device device = {});

  /// Contiguous and uninitialised. Throws std::invalid_argument for a
  /// negative size, more than 64 dimensions or a size that overflows, and
  /// what the storage's allocation throws.
  static tensor empty(int_list shape, cohort::dtype type, tensor_options options = {});
  /// Contiguous, every element 0 (false, +0.0).
  static tensor zeros(int_list shape, cohort::dtype type, tensor_options options = {});
  /// Contiguous, every element `value` as fill_() converts it.
  static tensor full(int_list shape, scalar value, cohort::dtype type, tensor_options options = {});
  /// A contiguous copy of `values` in row-major order. Throws
  /// std::invalid_argument when the shape does not hold values.size().
  template <element T>
  static tensor from_data(std::span<const T> values, int_list shape, tensor_options options = {}) {
    return from_bytes(std::as_bytes(values), dtype_of<T>, shape.view(), options);
  }
  /// One dimension of values.size(). The options' type is a template
  /// parameter so that `from_data(values, {6})` and `from_data(values, {})`,
  /// which could make either an int_list or options, are the shapes above:
  /// the overload with the deduced type is the less specialized.
  template <element T, std::same_as<tensor_options> Options = tensor_options>
  static tensor from_data(std::span<const T> values, Options options = {}) {
    const auto size = static_cast<std::int64_t>(values.size());
    return from_bytes(std::as_bytes(values), dtype_of<T>, std::span(&size, 1), options);
  }

  std::size_t ndim() const noexcept { return shape_.size(); }
  std::span<const std::int64_t> shape() const noexcept { return shape_.view(); }
  std::span<const std::int64_t> strides() const noexcept { return strides_.view(); }
  /// The number of elements: 1 for a 0-d tensor.
  std::int64_t numel() const noexcept;
  /// Where the first element is in the storage, in elements.
  std::int64_t storage_offset() const noexcept { return offset_; }
  cohort::dtype dtype() const noexcept { return dtype_; }
  cohort::device device() const noexcept { return device_; }
  /// The bytes of the elements: numel() * element_size(dtype()).
  std::size_t nbytes() const noexcept;
  /// Row-major with no gaps, as torch counts it: sizes of 1 may have any
  /// stride, and a tensor without elements is contiguous.
  bool is_contiguous() const noexcept;
  bool is_shared() const noexcept { return storage_.is_shared(); }
  /// Moves the storage into shared memory (storage::share_memory): every
  /// tensor over it sees the shared bytes. Throws shm_error.
  void share_memory() { storage_.share_memory(); }
  const cohort::storage& storage() const noexcept { return storage_; }
  /// The first element's byte. Valid while the storage is and until
  /// share_memory() moves it. A tensor without elements whose offset lies
  /// past its storage points at the storage's end.
  std::byte* raw_data() const noexcept;

  /// The elements in order, for contiguous tensors. Throws std::logic_error
  /// for a non-contiguous one, std::invalid_argument when T is not the
  /// dtype. Valid as raw_data() is.
  template <element T>
  std::span<T> data() const {
    return {reinterpret_cast<T*>(contiguous_data(dtype_of<T>)), static_cast<std::size_t>(numel())};
  }
  /// The element at `index` (one per dimension, negative counting from the
  /// end). Throws std::invalid_argument when T is not the dtype or the index
  /// has the wrong length, std::out_of_range for an index out of range. A
  /// bool element must hold 0 or 1.
  template <element T>
  T& at(int_list index) {
    return *reinterpret_cast<T*>(element_at(dtype_of<T>, index.view()));
  }
  template <element T>
  const T& at(int_list index) const {
    return *reinterpret_cast<const T*>(element_at(dtype_of<T>, index.view()));
  }
  /// The one element of a tensor of any shape with numel() 1. Throws
  /// std::invalid_argument when T is not the dtype or there is not exactly
  /// one element. A bool element must hold 0 or 1, as for at().
  template <element T>
  T item() const {
    return *reinterpret_cast<const T*>(only_element(dtype_of<T>));
  }

  /// Python's [start:stop:step] along `dim`: negative dims, start and stop
  /// count from the end, and start and stop clamp to the dimension. Throws
  /// std::out_of_range for a bad dim, std::invalid_argument for step < 1,
  /// and std::overflow_error when the view's offset or stride would pass
  /// int64 (only a tensor without elements has strides that large).
  tensor slice(std::int64_t dim, std::int64_t start, std::int64_t stop,
               std::int64_t step = 1) const;
  /// The view at `index` along `dim`, without that dimension. Throws
  /// std::out_of_range for a bad dim or index, std::overflow_error as slice.
  tensor select(std::int64_t dim, std::int64_t index) const;
  /// A view with `shape` (one size may be -1, inferred). Throws
  /// std::logic_error for a non-contiguous tensor (call contiguous() first)
  /// and std::invalid_argument for a shape of another element count or of
  /// more than max_ndim dimensions.
  tensor reshape(int_list shape) const;
  /// A view with dimensions `dim0` and `dim1` swapped (a 0-d tensor takes
  /// 0 and -1, as in torch, and is returned as it is). Throws
  /// std::out_of_range for a bad dim.
  tensor transpose(std::int64_t dim0, std::int64_t dim1) const;
  /// This tensor when contiguous; otherwise a contiguous clone, in shared
  /// memory when this one is. Throws std::logic_error for a non-contiguous
  /// tensor on a device (copy it to the CPU first).
  tensor contiguous() const;
  /// For a CPU tensor, a contiguous copy of the elements in new storage.
  /// For a tensor on a device, a copy on the same device, made by its device
  /// layer on that device's current stream, keeping the storage's layout
  /// (the options do not apply: device memory is always shareable).
  tensor clone(tensor_options options = {}) const;

  /// This tensor on `to`: itself when it is there already, otherwise a copy
  /// made by the device layer of the side that is not the CPU
  /// (libcohort-cuda for kDLCUDA) on that device's current stream; a copy to
  /// the CPU is complete when it returns, a copy to a device is ordered on
  /// the stream. Throws std::logic_error when no layer for the device is
  /// loaded in this process, or for a copy between two non-CPU device types,
  /// std::invalid_argument for a CPU other than device 0, and what the layer
  /// throws (cohort::cuda::error or no_device, std::invalid_argument for a
  /// device index out of range).
  tensor to(cohort::device to) const;
  /// to(device{kDLCPU, 0}).
  tensor to_cpu() const { return to(cohort::device{}); }

  /// Sets every element, through views too, to `value` converted to the
  /// dtype: floating values truncate toward zero into integers, bool is
  /// value != 0, float16 and bfloat16 round from float; an integer value
  /// goes into an integer dtype exactly. Throws std::invalid_argument,
  /// changing nothing, when the value does not fit an integer dtype, or
  /// when it is finite and beyond a floating dtype's largest finite value
  /// (as torch refuses it; infinity and NaN are taken).
  tensor& fill_(scalar value);

  /// A DLPack tensor over the same bytes, for another framework to borrow.
  /// Its data points at the first element, with byte_offset 0 (as torch
  /// exports). It holds a copy of the storage, so the bytes stay until the
  /// borrower calls its deleter, once; the deleter frees it all. Until
  /// then a private tensor over the same storage cannot be sent (or
  /// otherwise moved into shared memory: std::logic_error), since that
  /// would move the bytes from under the borrower; a shared one can.
  DLManagedTensor* to_dlpack() const;

 private:
  friend struct detail::handle_codec<tensor>;
  struct unchecked {};
  tensor(unchecked, cohort::storage storage, cohort::dtype type, std::int64_t offset,
         detail::dim_vector shape, detail::dim_vector strides, cohort::device device = {}) noexcept
      : storage_(std::move(storage)),
        offset_(offset),
        shape_(std::move(shape)),
        strides_(std::move(strides)),
        dtype_(type),
        device_(device) {}
  /// Another view of this storage.
  tensor view(std::int64_t offset, detail::dim_vector shape, detail::dim_vector strides) const {
    return tensor(unchecked{}, storage_, dtype_, offset, std::move(shape), std::move(strides),
                  device_);
  }
  static tensor from_bytes(std::span<const std::byte> values, cohort::dtype type,
                           std::span<const std::int64_t> shape, tensor_options options);
  /// Throws std::logic_error naming `what` for a tensor not on the CPU.
  void check_on_host(const char* what) const;
  std::byte* contiguous_data(cohort::dtype asked) const;
  std::byte* element_at(cohort::dtype asked, std::span<const std::int64_t> index) const;
  std::byte* only_element(cohort::dtype asked) const;
  // As tensor() makes it, its storage already let go of.
  void make_empty() noexcept {
    offset_ = 0;
    shape_.assign_one(0);
    strides_.assign_one(1);
    dtype_ = cohort::dtype::float32;
    device_ = {};
  }
  // offset_ moved by `index` steps along dimension d; throws std::overflow_error.
  std::int64_t moved_offset(std::int64_t index, std::size_t d, const char* what) const;

  cohort::storage storage_;
  std::int64_t offset_ = 0;
  detail::dim_vector shape_;
  detail::dim_vector strides_;
  cohort::dtype dtype_ = cohort::dtype::float32;
  cohort::device device_;
};

/// Same dtype, same shape and equal elements, whatever the layouts. Floats
/// compare by value, as torch.equal: -0 equals +0, NaN equals nothing.
bool equal(const tensor& a, const tensor& b);
inline bool operator==(const tensor& a, const tensor& b) { return equal(a, b); }
/// Whether both view one storage.
inline bool same_storage(const tensor& a, const tensor& b) noexcept {
  return a.storage().same(b.storage());
}

/// As torch prints on one line: "tensor([[1, 2], [3, 4]], dtype=int64)",
/// "tensor(2.5, dtype=float32)", "tensor([], dtype=bool)"; bools print as
/// True and False, floats in the shortest form that reads back to the
/// same value of their own dtype (a float16 0.1 as "0.1"), every NaN as
/// "nan". Past 1,000 elements, as
/// torch summarizes, each dimension longer than six shows its first and
/// last three around "...": "tensor([0, 1, 2, ..., 9997, 9998, 9999], dtype=int64)".
std::string to_string(const tensor& t);

namespace detail {

/// What copies tensors to, from and within devices of one DLPack type:
/// registered by the device layer as it loads (libcohort-cuda for kDLCUDA).
/// Called with a tensor on the layer's device and `to` the CPU or one of its
/// devices, or with a CPU tensor and `to` one of its devices; a copy to the
/// tensor's own device is a new copy.
using device_copy = tensor (*)(const tensor& t, cohort::device to);
/// Registers the copy for `device_type` (1..63); a second registration
/// replaces the first, and null removes it.
void register_device_copy(int device_type, device_copy copy) noexcept;

/// A tensor crosses as its storage's handle (moved into shared memory
/// first when private) and its layout: [dtype code][bits][device type]
/// [device id][ndim][shape...][strides...][offset]. A receiver checks the
/// dtype, the device, ndim <= 64 and the layout against the storage
/// (check_layout) before it builds the tensor; a bad one is a decode_error.
template <>
struct handle_codec<tensor> {
  static std::string signature() { return "T"; }
  static std::size_t size_bound(const tensor& t) {
    return handle_codec<cohort::storage>::size_bound(t.storage()) + 2 +
           3 * max_varint_size<std::uint64_t> + (2 * t.ndim() + 1) * max_varint_size<std::uint64_t>;
  }
  static void write(std::vector<std::byte>& out, const tensor& t) {
    handle_codec<cohort::storage>::write(out, t.storage());
    byte_run run(out, size_bound(t) - handle_codec<cohort::storage>::size_bound(t.storage()));
    run.byte(dtype_code(t.dtype()));
    run.byte(dtype_bits(t.dtype()));
    run.varint(static_cast<std::uint64_t>(t.device().type));
    run.varint(static_cast<std::uint64_t>(t.device().id));
    run.varint(t.ndim());
    for (auto d : t.shape()) run.varint(static_cast<std::uint64_t>(d));
    for (auto s : t.strides()) run.varint(static_cast<std::uint64_t>(s));
    run.varint(static_cast<std::uint64_t>(t.storage_offset()));
  }
  /// Checks everything it reads (see check_layout); throws decode_error.
  static tensor read(reader& in);
};

}  // namespace detail

}  // namespace cohort

/// The dtype's name, as to_string.
template <>
struct fmt::formatter<cohort::dtype> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(cohort::dtype type, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(cohort::to_string(type), ctx);
  }
};

/// The tensor as cohort::to_string prints it.
template <>
struct fmt::formatter<cohort::tensor> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(const cohort::tensor& t, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(cohort::to_string(t), ctx);
  }
};

COHORT_API_END
