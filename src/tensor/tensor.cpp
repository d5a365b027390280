// cohort::tensor: layout checks, creation, views, element-wise copy, fill
// and compare over any strides, printing, and export to DLPack.
#include "cohort/tensor.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <concepts>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <type_traits>

namespace cohort {

void detail::check_layout(cohort::dtype type, std::span<const std::int64_t> shape,
                          std::span<const std::int64_t> strides, std::int64_t offset,
                          std::size_t storage_nbytes) {
  const auto fail = [](const std::string& why) {
    throw std::invalid_argument("tensor layout: " + why);
  };
  if (shape.size() > tensor::max_ndim) {
    fail(fmt::format("{} dimensions, more than {}", shape.size(), tensor::max_ndim));
  }
  if (shape.size() != strides.size()) {
    fail(fmt::format("{} sizes but {} strides", shape.size(), strides.size()));
  }
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) fail(fmt::format("size {} in dimension {}", shape[d], d));
    if (strides[d] < 0) fail(fmt::format("stride {} in dimension {}", strides[d], d));
  }
  if (offset < 0) fail(fmt::format("storage offset {}", offset));
  if (std::ranges::find(shape, 0) != shape.end()) {
    // No element to reach; the sizes other than 0 must still multiply
    // within int64, as tensor::empty's do.
    (void)checked_numel(shape, type, "tensor layout");
    return;
  }

  // The byte just past the furthest element.
  std::int64_t end = offset;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::int64_t reach = 0;
    if (__builtin_mul_overflow(shape[d] - 1, strides[d], &reach) ||
        __builtin_add_overflow(end, reach, &end)) {
      fail("the furthest element's position overflows");
    }
  }
  if (__builtin_add_overflow(end, 1, &end) ||
      __builtin_mul_overflow(end, static_cast<std::int64_t>(element_size(type)), &end)) {
    fail("the furthest element's byte position overflows");
  }
  if (static_cast<std::uint64_t>(end) > storage_nbytes) {
    fail(fmt::format("elements reach byte {} of a storage of {} bytes", end, storage_nbytes));
  }
  // numel() and nbytes() must fit too, also for views that repeat elements
  // (stride 0), which reach few bytes however many elements they have.
  (void)checked_numel(shape, type, "tensor layout");
}

namespace {

template <class T>
struct type_tag {};

// Calls f(type_tag<T>{}) with the C++ type of `type`'s elements.
template <class F>
void visit_dtype(dtype type, F&& f) {
  switch (type) {
    case dtype::int8: return f(type_tag<std::int8_t>{});
    case dtype::int16: return f(type_tag<std::int16_t>{});
    case dtype::int32: return f(type_tag<std::int32_t>{});
    case dtype::int64: return f(type_tag<std::int64_t>{});
    case dtype::uint8: return f(type_tag<std::uint8_t>{});
    case dtype::uint16: return f(type_tag<std::uint16_t>{});
    case dtype::uint32: return f(type_tag<std::uint32_t>{});
    case dtype::uint64: return f(type_tag<std::uint64_t>{});
    case dtype::float16: return f(type_tag<float16>{});
    case dtype::bfloat16: return f(type_tag<bfloat16>{});
    case dtype::float32: return f(type_tag<float>{});
    case dtype::float64: return f(type_tag<double>{});
    case dtype::boolean: return f(type_tag<bool>{});
  }
  throw std::invalid_argument(fmt::format("invalid dtype {}", static_cast<int>(type)));
}

// Reads an element; a bool byte other than 0 reads as true.
template <class T>
T load(const std::byte* element) {
  if constexpr (std::same_as<T, bool>) {
    return *element != std::byte{0};
  } else {
    T value;
    std::memcpy(&value, element, sizeof value);
    return value;
  }
}

std::int64_t checked_dim(std::int64_t dim, std::size_t ndim, std::string_view operation) {
  const auto rank = static_cast<std::int64_t>(ndim);
  if (dim < -rank || dim >= rank) {
    throw std::out_of_range(fmt::format("tensor::{}: dimension {} out of range for a {}-d tensor",
                                        operation, dim, ndim));
  }
  return dim < 0 ? dim + rank : dim;
}

std::int64_t checked_index(std::int64_t index, std::int64_t size, std::string_view operation) {
  if (index < -size || index >= size) {
    throw std::out_of_range(fmt::format("tensor::{}: index {} out of range for a dimension of {}",
                                        operation, index, size));
  }
  return index < 0 ? index + size : index;
}

void check_dtype(dtype held, dtype asked, std::string_view operation) {
  if (held != asked) {
    throw std::invalid_argument(
        fmt::format("tensor::{}<{}>: the tensor holds {}", operation, asked, held));
  }
}

// Bytes between elements `stride` apart, of `size` bytes each; 0 where
// that overflows, which a layout allows only where no step is taken (along
// a dimension of one element, or in a tensor of none).
std::int64_t step_bytes(std::int64_t stride, std::size_t size) {
  std::int64_t bytes = 0;
  return __builtin_mul_overflow(stride, static_cast<std::int64_t>(size), &bytes) ? 0 : bytes;
}

// Elements per row (run along the last dimension), and bytes between them.
std::int64_t row_length(const tensor& t) { return t.ndim() == 0 ? 1 : t.shape().back(); }
std::int64_t row_step(const tensor& t) {
  return t.ndim() == 0 ? 0 : step_bytes(t.strides().back(), element_size(t.dtype()));
}

// Walks tensors of one shape row by row in row-major order: row(first) gets
// each tensor's first element of the row. A 0-d tensor is one row of one.
template <std::size_t N, class F>
void for_each_row(const std::array<const tensor*, N>& tensors, F&& row) {
  const tensor& lead = *tensors[0];
  if (lead.numel() == 0) return;
  const auto shape = lead.shape();
  const std::size_t outer = shape.empty() ? 0 : shape.size() - 1;
  std::array<std::byte*, N> first;
  std::array<std::int64_t, N> element_bytes;
  for (std::size_t i = 0; i < N; ++i) {
    first[i] = tensors[i]->raw_data();
    element_bytes[i] = static_cast<std::int64_t>(element_size(tensors[i]->dtype()));
  }
  detail::dim_vector index(outer);
  for (;;) {
    row(first);
    // Advance the index like an odometer, the last outer dimension fastest.
    std::size_t d = outer;
    for (; d > 0; --d) {
      const std::size_t k = d - 1;
      const bool wraps = ++index[k] == shape[k];
      const std::int64_t steps = wraps ? 1 - shape[k] : 1;
      for (std::size_t i = 0; i < N; ++i) {
        first[i] += steps * tensors[i]->strides()[k] * element_bytes[i];
      }
      if (!wraps) break;
      index[k] = 0;
    }
    if (d == 0) return;
  }
}

template <class T>
double largest_finite() {
  if constexpr (std::same_as<T, float16>) {
    return static_cast<float>(float16::from_bits(0x7BFF));
  } else if constexpr (std::same_as<T, bfloat16>) {
    return static_cast<float>(bfloat16::from_bits(0x7F7F));
  } else {
    return std::numeric_limits<T>::max();
  }
}

// `value` as an element of type T, for fill_ and full; `caller` is the one
// the user called, which an error names.
template <class T>
T convert(double value, const char* caller) {
  if constexpr (std::same_as<T, bool>) {
    return value != 0;
  } else if constexpr (std::integral<T>) {
    const double whole = std::trunc(value);
    const double limit = std::ldexp(1.0, std::numeric_limits<T>::digits);
    if (!(whole >= (std::is_signed_v<T> ? -limit : 0.0) && whole < limit)) {
      throw std::invalid_argument(
          fmt::format("{}: {} does not fit {}", caller, value, dtype_of<T>));
    }
    return static_cast<T>(whole);
  } else {
    // As torch does: infinity and NaN pass, a finite value past the
    // largest finite element is refused rather than made infinite.
    if (std::isfinite(value) && std::fabs(value) > largest_finite<T>()) {
      throw std::invalid_argument(
          fmt::format("{}: {} is beyond the largest finite {}", caller, value, dtype_of<T>));
    }
    if constexpr (std::floating_point<T>) {
      return static_cast<T>(value);
    } else {
      return T(static_cast<float>(value));
    }
  }
}

// `value`, an integer, as an element of type T; as convert() above.
template <class T, class I>
T convert_integer(I value, const char* caller) {
  if constexpr (std::same_as<T, bool>) {
    return value != 0;
  } else if constexpr (std::integral<T>) {
    if (!std::in_range<T>(value)) {
      throw std::invalid_argument(fmt::format("{}: {} does not fit {}", caller, value, dtype_of<T>));
    }
    return static_cast<T>(value);
  } else {
    const double approximate = static_cast<double>(value);
    if (std::fabs(approximate) > largest_finite<T>()) {
      throw std::invalid_argument(fmt::format("{}: {} is beyond the largest finite {}", caller, value, dtype_of<T>));
    }
    if constexpr (std::floating_point<T>) {
      return static_cast<T>(value);  // rounded once
    } else {
      return T(static_cast<float>(value));
    }
  }
}

// `value` as an element of type T, whichever number it holds.
template <class T>
T convert(scalar value, const char* caller) {
  if (value.held() == scalar::kind::signed_integer) return convert_integer<T>(value.signed_value(), caller);
  if (value.held() == scalar::kind::unsigned_integer) return convert_integer<T>(value.unsigned_value(), caller);
  return convert<T>(value.as_double(), caller);
}

// Sets every element of `t`, a tensor on the host, to `value`; `caller`
// names the function the user called in the error of a value that does not
// fit.
void fill(tensor& t, scalar value, const char* caller) {
  visit_dtype(t.dtype(), [&]<class T>(type_tag<T>) {
    const T element = convert<T>(value, caller);
    const std::int64_t length = row_length(t);
    const std::int64_t step = row_step(t);
    for_each_row(std::array<const tensor*, 1>{&t}, [&](const auto& first) {
      for (std::int64_t i = 0; i < length; ++i) {
        std::memcpy(first[0] + i * step, &element, sizeof element);
      }
    });
  });
}

// A 16-bit float's shortest form of its own, as fmt gives a float's: the
// fewest significant digits that read back, as a float rounded to T, to
// the same bits (0.1, where the float the half holds reads 0.099975586).
template <class T>
void append_half(std::string& out, T value) {
  const float exact = static_cast<float>(value);
  for (int digits = 1; digits < std::numeric_limits<float>::max_digits10; ++digits) {
    const std::string text = fmt::format("{:.{}g}", exact, digits);
    const float read = std::strtof(text.c_str(), nullptr);
    if (T(read).bits == value.bits) {
      fmt::format_to(std::back_inserter(out), "{}", read);  // "60000", not "6e+04"
      return;
    }
  }
  fmt::format_to(std::back_inserter(out), "{}", exact);
}

template <class T>
void append_element(std::string& out, const std::byte* element) {
  const T value = load<T>(element);
  if constexpr (std::same_as<T, bool>) {
    out += value ? "True" : "False";
  } else if constexpr (std::same_as<T, float16> || std::same_as<T, bfloat16>) {
    if (std::isnan(static_cast<float>(value))) {
      out += "nan";  // as torch prints every NaN, whatever its sign bit
    } else {
      append_half(out, value);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(value)) {
      out += "nan";
    } else {
      fmt::format_to(std::back_inserter(out), "{}", value);
    }
  } else {
    fmt::format_to(std::back_inserter(out), "{}", value);
  }
}

// torch's print options: past 1,000 elements, each dimension longer than
// six shows its first and last three.
constexpr std::int64_t summary_threshold = 1000;
constexpr std::int64_t summary_edge = 3;

// Dimensions `dim` onward of t, from `first`, as nested lists.
template <class T>
void append_elements(std::string& out, const tensor& t, std::size_t dim, const std::byte* first, bool summarized) {
  if (dim == t.ndim()) return append_element<T>(out, first);
  out += '[';
  const std::int64_t step = step_bytes(t.strides()[dim], sizeof(T));
  const std::int64_t size = t.shape()[dim];
  const bool cut = summarized && size > 2 * summary_edge;  // the first and last few, as torch prints them
  for (std::int64_t i = 0; i < size; ++i) {
    if (cut && i == summary_edge) {
      out += ", ...";
      i = size - summary_edge;
    }
    if (i > 0) out += ", ";
    append_elements<T>(out, t, dim + 1, first + i * step, summarized);
  }
  out += ']';
}

// What a DLManagedTensor from to_dlpack owns, itself included.
struct dlpack_owner {
  DLManagedTensor managed;
  storage bytes;
  detail::dim_vector shape;
  detail::dim_vector strides;
};

}  // namespace

namespace detail {

std::int64_t checked_numel(std::span<const std::int64_t> shape, dtype type,
                           std::string_view operation) {
  if (shape.size() > tensor::max_ndim) {
    throw std::invalid_argument(fmt::format("{}: {} dimensions, more than {}", operation,
                                            shape.size(), tensor::max_ndim));
  }
  // The sizes other than 0 must multiply within int64 wherever a 0 sits, so
  // that a shape with no elements still has contiguous strides (a clone's).
  std::int64_t nonzero = 1;
  bool overflow = false;
  bool empty = false;
  for (std::int64_t size : shape) {
    if (size < 0) {
      throw std::invalid_argument(fmt::format("{}: negative size in shape [{}]", operation,
                                              fmt::join(shape, ", ")));
    }
    if (size == 0) empty = true;
    else overflow |= __builtin_mul_overflow(nonzero, size, &nonzero);
  }
  std::int64_t bytes = 0;
  if (overflow ||
      __builtin_mul_overflow(nonzero, static_cast<std::int64_t>(element_size(type)), &bytes)) {
    throw std::invalid_argument(fmt::format("{}: shape [{}] of {} is too large", operation,
                                            fmt::join(shape, ", "), type));
  }
  return empty ? 0 : nonzero;
}

dim_vector contiguous_strides(std::span<const std::int64_t> shape) {
  dim_vector strides(shape.size());
  std::int64_t step = 1;
  for (std::size_t d = shape.size(); d > 0; --d) {
    strides[d - 1] = step;
    if (d > 1 && __builtin_mul_overflow(step, std::max<std::int64_t>(shape[d - 1], 1), &step)) {
      throw std::invalid_argument(
          fmt::format("tensor: strides of shape [{}] overflow", fmt::join(shape, ", ")));
    }
  }
  return strides;
}

}  // namespace detail

tensor::tensor() : shape_(1), strides_(1) { strides_[0] = 1; }

tensor::tensor(cohort::storage storage, cohort::dtype type, std::span<const std::int64_t> shape,
               std::span<const std::int64_t> strides, std::int64_t offset, cohort::device device)
    : tensor(unchecked{}, std::move(storage), type, offset, detail::dim_vector(shape),
             detail::dim_vector(strides), device) {
  const auto* memory = detail::device_memory_of(storage_);
  if (device.type == kDLCPU && memory == nullptr && device.id != 0) {
    throw std::invalid_argument(fmt::format("tensor: CPU device {}; the CPU is device 0", device.id));
  }
  if (device.type != kDLCPU || memory != nullptr) {
    if (memory == nullptr) {
      throw std::invalid_argument(
          fmt::format("tensor: device type {} with a storage in host memory", static_cast<int>(device.type)));
    }
    if (memory->device_type() != device.type || memory->device_index() != device.id) {
      throw std::invalid_argument(fmt::format("tensor: device {}:{} with a storage on device {}:{}",
                                              static_cast<int>(device.type), device.id, memory->device_type(),
                                              memory->device_index()));
    }
  }
  detail::check_layout(type, shape, strides, offset, storage_.nbytes());
}

tensor tensor::empty(int_list sizes, cohort::dtype type, tensor_options options) {
  const auto shape = sizes.view();
  const auto nbytes =
      static_cast<std::size_t>(detail::checked_numel(shape, type, "tensor::empty")) * element_size(type);
  auto strides = detail::contiguous_strides(shape);
  auto bytes = options.shared ? storage::allocate_shared(nbytes) : storage::allocate(nbytes);
  return tensor(unchecked{}, std::move(bytes), type, 0, detail::dim_vector(shape),
                std::move(strides));
}

tensor tensor::zeros(int_list shape, cohort::dtype type, tensor_options options) {
  tensor out = empty(shape, type, options);
  if (out.nbytes() > 0) std::memset(out.raw_data(), 0, out.nbytes());
  return out;
}

tensor tensor::full(int_list shape, scalar value, cohort::dtype type, tensor_options options) {
  tensor out = empty(shape, type, options);
  fill(out, value, "tensor::full");
  return out;
}

tensor tensor::from_bytes(std::span<const std::byte> values, cohort::dtype type,
                          std::span<const std::int64_t> shape, tensor_options options) {
  const auto count = values.size() / element_size(type);
  if (static_cast<std::size_t>(detail::checked_numel(shape, type, "tensor::from_data")) != count) {
    throw std::invalid_argument(
        fmt::format("tensor::from_data: {} values for shape [{}]", count, fmt::join(shape, ", ")));
  }
  tensor out = empty(shape, type, options);
  if (!values.empty()) std::memcpy(out.raw_data(), values.data(), values.size());
  return out;
}

std::int64_t tensor::numel() const noexcept {
  std::int64_t count = 1;
  for (std::int64_t size : shape()) count *= size;
  return count;
}

std::size_t tensor::nbytes() const noexcept {
  return static_cast<std::size_t>(numel()) * element_size(dtype_);
}

bool tensor::is_contiguous() const noexcept {
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (std::size_t d = ndim(); d > 0; --d) {
    if (shape_[d - 1] == 1) continue;
    if (strides_[d - 1] != expected) return false;
    expected *= shape_[d - 1];
  }
  return true;
}

std::byte* tensor::raw_data() const noexcept {
  // Without elements the offset may lie anywhere past the storage (its
  // bytes in int64 too); the data pointer then stops at the storage's end.
  std::int64_t at = 0;
  if (__builtin_mul_overflow(offset_, static_cast<std::int64_t>(element_size(dtype_)), &at) ||
      static_cast<std::uint64_t>(at) > storage_.nbytes()) {
    return storage_.data() + storage_.nbytes();
  }
  return storage_.data() + at;
}

void tensor::check_on_host(const char* what) const {
  if (device_.type == kDLCPU) return;
  throw std::logic_error(fmt::format(
      "tensor::{}: the tensor is on device {}:{}, which this process cannot read directly; copy it to the CPU "
      "first (tensor::to_cpu)",
      what, static_cast<int>(device_.type), device_.id));
}

std::byte* tensor::contiguous_data(cohort::dtype asked) const {
  check_on_host("data");
  check_dtype(dtype_, asked, "data");
  if (!is_contiguous()) {
    throw std::logic_error("tensor::data: the tensor is not contiguous; call contiguous() first");
  }
  return raw_data();
}

std::byte* tensor::element_at(cohort::dtype asked, std::span<const std::int64_t> index) const {
  check_on_host("at");
  check_dtype(dtype_, asked, "at");
  if (index.size() != ndim()) {
    throw std::invalid_argument(
        fmt::format("tensor::at: {} indices for a {}-d tensor", index.size(), ndim()));
  }
  std::int64_t position = offset_;
  for (std::size_t d = 0; d < ndim(); ++d) {
    position += checked_index(index[d], shape_[d], "at") * strides_[d];
  }
  return storage_.data() + position * static_cast<std::int64_t>(element_size(dtype_));
}

std::byte* tensor::only_element(cohort::dtype asked) const {
  check_on_host("item");
  check_dtype(dtype_, asked, "item");
  if (numel() != 1) {
    throw std::invalid_argument(fmt::format("tensor::item: the tensor has {} elements", numel()));
  }
  return raw_data();
}

std::int64_t tensor::moved_offset(std::int64_t index, std::size_t d, const char* what) const {
  // Only a tensor without elements gets here with a position past int64:
  // check_layout bounds the reach of one with elements by its storage.
  std::int64_t position = 0;
  if (__builtin_mul_overflow(index, strides_[d], &position) ||
      __builtin_add_overflow(offset_, position, &position)) {
    throw std::overflow_error(fmt::format(
        "tensor::{}: index {} of dimension {} lies past int64 elements (stride {}, offset {}; the tensor has no "
        "elements)",
        what, index, d, strides_[d], offset_));
  }
  return position;
}

tensor tensor::slice(std::int64_t dim, std::int64_t start, std::int64_t stop,
                     std::int64_t step) const {
  const auto d = static_cast<std::size_t>(checked_dim(dim, ndim(), "slice"));
  if (step < 1) {
    throw std::invalid_argument(fmt::format("tensor::slice: step {} is not positive", step));
  }
  const std::int64_t size = shape_[d];
  const auto clamp = [size](std::int64_t i) {
    return std::clamp<std::int64_t>(i < 0 ? i + size : i, 0, size);
  };
  start = clamp(start);
  stop = clamp(stop);
  const std::int64_t length = stop > start ? (stop - start - 1) / step + 1 : 0;
  tensor out = *this;
  out.shape_[d] = length;
  // An empty slice keeps the offset: its start may be past the last element,
  // where start * stride can overflow (a size-1 dimension has any stride).
  if (length > 0) out.offset_ = moved_offset(start, d, "slice");
  if (length > 1 && __builtin_mul_overflow(strides_[d], step, &out.strides_[d])) {
    throw std::overflow_error(fmt::format(
        "tensor::slice: stride {} times step {} overflows int64 (the tensor has no elements)",
        strides_[d], step));
  }
  return out;
}

tensor tensor::select(std::int64_t dim, std::int64_t index) const {
  const auto d = static_cast<std::size_t>(checked_dim(dim, ndim(), "select"));
  const std::int64_t position = checked_index(index, shape_[d], "select");
  detail::dim_vector shape(ndim() - 1);
  detail::dim_vector strides(ndim() - 1);
  for (std::size_t from = 0, to = 0; from < ndim(); ++from) {
    if (from == d) continue;
    shape[to] = shape_[from];
    strides[to++] = strides_[from];
  }
  return view(moved_offset(position, d, "select"), std::move(shape), std::move(strides));
}

tensor tensor::reshape(int_list asked) const {
  const auto shape = asked.view();
  if (!is_contiguous()) {
    throw std::logic_error(
        "tensor::reshape: the tensor is not contiguous; call contiguous() first (on the CPU)");
  }
  const auto invalid = [&] {
    return std::invalid_argument(fmt::format("tensor::reshape: shape [{}] does not fit {} elements",
                                             fmt::join(shape, ", "), numel()));
  };
  if (shape.size() > max_ndim) {
    throw std::invalid_argument(fmt::format("tensor::reshape: {} dimensions, more than {}", shape.size(), max_ndim));
  }
  detail::dim_vector sizes(shape);
  std::optional<std::size_t> inferred;
  std::int64_t known = 1;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == -1 && !inferred) {
      inferred = d;
    } else if (sizes[d] < 0 || __builtin_mul_overflow(known, sizes[d], &known)) {
      throw invalid();
    }
  }
  if (inferred) {
    if (known == 0 || numel() % known != 0) throw invalid();
    sizes[*inferred] = numel() / known;
  } else if (known != numel()) {
    throw invalid();
  }
  // No elements: the sizes other than 0 must still fit, as tensor::empty's
  // must, or the view could be neither cloned nor received.
  (void)detail::checked_numel(sizes.view(), dtype_, "tensor::reshape");
  auto strides = detail::contiguous_strides(sizes.view());
  return view(offset_, std::move(sizes), std::move(strides));
}

tensor tensor::transpose(std::int64_t dim0, std::int64_t dim1) const {
  // A 0-d tensor takes dims 0 and -1, as torch's does, and is itself.
  if (ndim() == 0 && (dim0 == 0 || dim0 == -1) && (dim1 == 0 || dim1 == -1)) return *this;
  const auto a = static_cast<std::size_t>(checked_dim(dim0, ndim(), "transpose"));
  const auto b = static_cast<std::size_t>(checked_dim(dim1, ndim(), "transpose"));
  tensor out = *this;
  std::swap(out.shape_[a], out.shape_[b]);
  std::swap(out.strides_[a], out.strides_[b]);
  return out;
}

tensor tensor::contiguous() const {
  if (is_contiguous()) return *this;
  check_on_host("contiguous");  // a device layer's clone keeps the layout
  return clone({.shared = is_shared()});
}

namespace {

std::atomic<detail::device_copy> device_copies[detail::device_types];

detail::device_copy copy_for(DLDeviceType type, const char* what) {
  const int t = static_cast<int>(type);
  const auto copy = detail::registrable_device_type(t) ? device_copies[t].load(std::memory_order_acquire) : nullptr;
  if (copy == nullptr) {
    throw std::logic_error(fmt::format(
        "tensor::{}: no device layer for device type {} is loaded in this process (link libcohort-cuda for CUDA)",
        what, t));
  }
  return copy;
}

}  // namespace

void detail::register_device_copy(int device_type, device_copy copy) noexcept {
  if (!registrable_device_type(device_type)) return;
  device_copies[device_type].store(copy, std::memory_order_release);
}

tensor tensor::to(cohort::device to) const {
  // As the constructor refuses it: no tensor lives on another CPU.
  if (to.type == kDLCPU && to.id != 0) {
    throw std::invalid_argument(fmt::format("tensor::to: CPU device {}; the CPU is device 0", to.id));
  }
  if (to == device_ || (to.type == kDLCPU && device_.type == kDLCPU)) return *this;
  if (device_.type != kDLCPU && to.type != kDLCPU && device_.type != to.type) {
    throw std::logic_error(fmt::format("tensor::to: from device {}:{} to device {}:{}: copy through the CPU",
                                       static_cast<int>(device_.type), device_.id, static_cast<int>(to.type),
                                       to.id));
  }
  return copy_for(to.type != kDLCPU ? to.type : device_.type, "to")(*this, to);
}

tensor tensor::clone(tensor_options options) const {
  if (device_.type != kDLCPU) return copy_for(device_.type, "clone")(*this, device_);
  tensor out = empty(shape(), dtype_, options);
  if (is_contiguous()) {
    if (nbytes() > 0) std::memcpy(out.raw_data(), raw_data(), nbytes());
    return out;
  }
  const auto size = element_size(dtype_);
  const std::int64_t length = row_length(*this);
  const std::int64_t step = row_step(*this);
  for_each_row(std::array<const tensor*, 2>{this, &out}, [&](const auto& first) {
    for (std::int64_t i = 0; i < length; ++i) {
      std::memcpy(first[1] + i * static_cast<std::int64_t>(size), first[0] + i * step, size);
    }
  });
  return out;
}

tensor& tensor::fill_(scalar value) {
  check_on_host("fill_");
  fill(*this, value, "tensor::fill_");
  return *this;
}

tensor detail::handle_codec<tensor>::read(reader& in) {
  cohort::storage s = handle_codec<cohort::storage>::read(in);
  const auto code = std::to_integer<std::uint8_t>(in.next());
  const auto bits = std::to_integer<std::uint8_t>(in.next());
  const auto type = dtype_from_code(code, bits);
  if (!type) throw decode_error("cohort::decode: a tensor of an unknown dtype");
  // A device's index is the sender's; the receiver's for the same device
  // is the storage's, which its device layer found by the device's UUID.
  const auto device_type = in.varint();
  const auto device_id = in.varint();
  const auto* memory = device_memory_of(s);
  const cohort::device device =
      memory != nullptr ? cohort::device{static_cast<DLDeviceType>(memory->device_type()), memory->device_index()}
                        : cohort::device{};
  if (device_type != static_cast<std::uint64_t>(device.type) || (memory == nullptr && device_id != 0)) {
    throw decode_error(fmt::format("cohort::decode: a tensor on device {}:{} over a storage on device {}:{}", device_type,
                                   device_id, static_cast<int>(device.type), device.id));
  }
  const auto ndim = in.varint();
  if (ndim > tensor::max_ndim) throw decode_error("cohort::decode: a tensor of more than 64 dimensions");
  const auto dim = [&in] {
    const auto v = in.varint();
    if (v > static_cast<std::uint64_t>(INT64_MAX)) throw decode_error("cohort::decode: a tensor dimension over 2^63");
    return static_cast<std::int64_t>(v);
  };
  // Read into the vectors the tensor keeps, and checked as the public
  // constructor checks, without copying them again.
  dim_vector shape(ndim), strides(ndim);
  for (std::size_t i = 0; i < ndim; ++i) shape[i] = dim();
  for (std::size_t i = 0; i < ndim; ++i) strides[i] = dim();
  const auto offset = dim();
  try {
    check_layout(*type, shape.view(), strides.view(), offset, s.nbytes());
  } catch (const std::invalid_argument& e) {
    throw decode_error(std::string("cohort::decode: ") + e.what());
  }
  return tensor(tensor::unchecked{}, std::move(s), *type, offset, std::move(shape), std::move(strides), device);
}

DLManagedTensor* tensor::to_dlpack() const {
  auto* owner = new dlpack_owner{{}, storage_, shape_, strides_};
  // The borrower's pointer stays on these bytes: a private storage is not
  // moved into shared memory (by a send on another thread) from the loan
  // on until the deleter has run, so the pointer is read after it.
  detail::lend_bytes(storage_);
  DLTensor& out = owner->managed.dl_tensor;
  out.data = raw_data();
  out.device = {device_.type, device_.id};
  out.ndim = static_cast<int>(ndim());
  out.dtype = cohort::to_dlpack(dtype_);
  out.shape = owner->shape.data();
  out.strides = owner->strides.data();
  out.byte_offset = 0;
  owner->managed.manager_ctx = owner;
  owner->managed.deleter = [](DLManagedTensor* self) {
    auto* owned = static_cast<dlpack_owner*>(self->manager_ctx);
    detail::end_loan(owned->bytes);
    delete owned;
  };
  return &owner->managed;
}

bool equal(const tensor& a, const tensor& b) {
  for (const tensor* t : {&a, &b}) {
    if (t->device().type != kDLCPU) {
      throw std::logic_error(fmt::format(
          "cohort::equal: a tensor on device {}:{}; copy it to the CPU first (tensor::to_cpu)",
          static_cast<int>(t->device().type), t->device().id));
    }
  }
  if (a.dtype() != b.dtype() || !std::ranges::equal(a.shape(), b.shape())) return false;
  bool same = true;
  visit_dtype(a.dtype(), [&]<class T>(type_tag<T>) {
    const std::int64_t length = row_length(a);
    const std::int64_t step_a = row_step(a);
    const std::int64_t step_b = row_step(b);
    for_each_row(std::array{&a, &b}, [&](const auto& first) {
      for (std::int64_t i = 0; i < length && same; ++i) {
        same = load<T>(first[0] + i * step_a) == load<T>(first[1] + i * step_b);
      }
    });
  });
  return same;
}

std::string to_string(const tensor& t) {
  if (t.device().type != kDLCPU) {
    // Its elements are not this process's to read without a copy.
    return fmt::format("tensor(<{} elements on device {}:{}>, shape=[{}], dtype={})", t.numel(),
                       static_cast<int>(t.device().type), t.device().id, fmt::join(t.shape(), ", "), t.dtype());
  }
  if (t.numel() == 0 && t.ndim() > 1) {  // as torch: its sizes, never a list per row of none
    return fmt::format("tensor([], size=({}), dtype={})", fmt::join(t.shape(), ", "), t.dtype());
  }
  std::string out = "tensor(";
  const bool summarized = t.numel() > summary_threshold;
  visit_dtype(t.dtype(),
              [&]<class T>(type_tag<T>) { append_elements<T>(out, t, 0, t.raw_data(), summarized); });
  fmt::format_to(std::back_inserter(out), ", dtype={})", t.dtype());
  return out;
}

}  // namespace cohort
