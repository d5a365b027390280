#include "cohort/tensor.hpp"

#include <doctest/doctest.h>
#include <fmt/ranges.h>

#include <array>
#include <cmath>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

using namespace cohort;

namespace {

// "[3, 2]": shapes and strides in a form doctest prints when a check fails.
std::string dims(std::span<const std::int64_t> values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

template <class T>
tensor make(std::initializer_list<T> values, std::initializer_list<std::int64_t> shape) {
  return tensor::from_data<T>(std::span(values.begin(), values.size()), shape);
}

// 0, 1, ... n-1 as int64, in `shape`.
tensor counting(std::int64_t n, std::initializer_list<std::int64_t> shape) {
  std::vector<std::int64_t> values;
  for (std::int64_t i = 0; i < n; ++i) values.push_back(i);
  return tensor::from_data<std::int64_t>(values, shape);
}

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

static_assert(dtype_of<std::int8_t> == dtype::int8 && dtype_of<std::uint64_t> == dtype::uint64);
static_assert(dtype_of<float16> == dtype::float16 && dtype_of<bfloat16> == dtype::bfloat16);
static_assert(dtype_of<float> == dtype::float32 && dtype_of<double> == dtype::float64);
static_assert(dtype_of<bool> == dtype::boolean);
static_assert(element<std::int32_t> && !element<char> && !element<long double> && !element<int*>);
static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2);
static_assert(float16(1.0f).bits == 0x3C00 && bfloat16(1.0f).bits == 0x3F80);  // constexpr
static_assert(std::is_nothrow_move_constructible_v<tensor> &&
              std::is_nothrow_move_assignable_v<tensor>);
// Braces make an int_list through a constructor, never as an aggregate
// or an initializer_list, neither of which g++ 12 builds right inside co_await.
static_assert(!std::is_aggregate_v<int_list>);
static_assert(std::is_convertible_v<std::vector<std::int64_t>&, int_list> &&
              std::is_convertible_v<std::span<const std::int64_t>, int_list> &&
              std::is_convertible_v<std::size_t, int_list>);
static_assert(!std::is_convertible_v<double, int_list> && !std::is_convertible_v<std::vector<int>&, int_list>);

}  // namespace

TEST_SUITE("tensor") {

TEST_CASE("dtypes have torch's names, their sizes and DLPack's codes") {
  CHECK(to_string(dtype::int64) == "int64");
  CHECK(to_string(dtype::bfloat16) == "bfloat16");
  CHECK(to_string(dtype::boolean) == "bool");
  CHECK(fmt::format("{}", dtype::uint16) == "uint16");
  CHECK(element_size(dtype::int8) == 1);
  CHECK(element_size(dtype::uint16) == 2);
  CHECK(element_size(dtype::float16) == 2);
  CHECK(element_size(dtype::float32) == 4);
  CHECK(element_size(dtype::int64) == 8);
  CHECK(element_size(dtype::boolean) == 1);

  const DLDataType int64 = to_dlpack(dtype::int64);
  CHECK((int64.code == kDLInt && int64.bits == 64 && int64.lanes == 1));
  const DLDataType bf16 = to_dlpack(dtype::bfloat16);
  CHECK((bf16.code == kDLBfloat && bf16.bits == 16));
  const DLDataType boolean = to_dlpack(dtype::boolean);
  CHECK((boolean.code == 6 && boolean.bits == 8));
  CHECK(dtype_from_code(kDLUInt, 32) == dtype::uint32);
  CHECK(dtype_from_code(kDLFloat, 16) == dtype::float16);
}

TEST_CASE("every dtype comes back from DLPack and from its raw code") {
  for (int i = 0; i <= static_cast<int>(dtype::boolean); ++i) {
    const auto type = static_cast<dtype>(i);
    CAPTURE(to_string(type));
    CHECK(dtype_from_dlpack(to_dlpack(type)) == type);
    CHECK(dtype_from_code(dtype_code(type), dtype_bits(type)) == type);
  }
}

TEST_CASE("vector lanes and types cohort lacks have no dtype") {
  CHECK_FALSE(dtype_from_dlpack({kDLFloat, 32, 4}));
  CHECK_FALSE(dtype_from_dlpack({kDLFloat, 8, 1}));
  CHECK_FALSE(dtype_from_dlpack({kDLComplex, 64, 1}));
  CHECK_FALSE(dtype_from_dlpack({kDLOpaqueHandle, 64, 1}));
  CHECK_FALSE(dtype_from_code(kDLInt, 128));
  CHECK_FALSE(dtype_from_code(6, 1));
  CHECK_FALSE(dtype_from_code(200, 8));
}

TEST_CASE("float16 converts known bit patterns both ways") {
  CHECK(float16(1.0f).bits == 0x3C00);
  CHECK(float16(-2.0f).bits == 0xC000);
  CHECK(float16(0.5f).bits == 0x3800);
  CHECK(float16(65504.0f).bits == 0x7BFF);
  CHECK(float16(-0.0f).bits == 0x8000);
  CHECK(float16(std::ldexp(1.0f, -14)).bits == 0x0400);  // smallest normal
  CHECK(float16(std::ldexp(1.0f, -24)).bits == 0x0001);  // smallest subnormal
  CHECK(float16(1023 * std::ldexp(1.0f, -24)).bits == 0x03FF);
  CHECK(float16(std::numeric_limits<float>::infinity()).bits == 0x7C00);
  CHECK(float16(-std::numeric_limits<float>::infinity()).bits == 0xFC00);
  CHECK(float16(1e6f).bits == 0x7C00);
  CHECK(std::isnan(static_cast<float>(float16(std::numeric_limits<float>::quiet_NaN()))));

  CHECK(static_cast<float>(float16::from_bits(0x3C00)) == 1.0f);
  CHECK(static_cast<float>(float16::from_bits(0xC000)) == -2.0f);
  CHECK(static_cast<float>(float16::from_bits(0x7BFF)) == 65504.0f);
  CHECK(static_cast<float>(float16::from_bits(0x0001)) == std::ldexp(1.0f, -24));
  CHECK(static_cast<float>(float16::from_bits(0x8001)) == -std::ldexp(1.0f, -24));
  CHECK(static_cast<float>(float16::from_bits(0x3555)) == 1365.0f / 4096);
  CHECK(static_cast<float>(float16::from_bits(0xFC00)) ==
        -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(static_cast<float>(float16::from_bits(0x7E00))));
}

TEST_CASE("float16 rounds to nearest with ties to even, subnormals included") {
  const auto ulp_of_one = std::ldexp(1.0f, -10);
  CHECK(float16(1 + ulp_of_one / 2).bits == 0x3C00);      // tie, 0x3C00 is even
  CHECK(float16(1 + 3 * ulp_of_one / 2).bits == 0x3C02);  // tie, up to even
  CHECK(float16(1 + ulp_of_one / 2 + std::ldexp(1.0f, -20)).bits == 0x3C01);  // past the tie
  CHECK(float16(65519.0f).bits == 0x7BFF);
  CHECK(float16(65520.0f).bits == 0x7C00);  // the tie above the largest rounds to infinity

  const auto tiny = std::ldexp(1.0f, -24);
  CHECK(float16(tiny / 2).bits == 0x0000);  // tie between 0 and the smallest
  CHECK(float16(tiny / 2 * (1 + std::ldexp(1.0f, -10))).bits == 0x0001);
  CHECK(float16(3 * tiny / 2).bits == 0x0002);
  CHECK(float16(tiny / 4).bits == 0x0000);
  CHECK(float16(-tiny / 4).bits == 0x8000);
  CHECK(float16(1023.5f * tiny).bits == 0x0400);  // tie at the top of the subnormals
}

TEST_CASE("bfloat16 keeps a float's top half, rounding ties to even") {
  CHECK(bfloat16(1.0f).bits == 0x3F80);
  CHECK(bfloat16(-1.0f).bits == 0xBF80);
  const auto ulp_of_one = std::ldexp(1.0f, -7);
  CHECK(bfloat16(1 + ulp_of_one / 2).bits == 0x3F80);
  CHECK(bfloat16(1 + 3 * ulp_of_one / 2).bits == 0x3F82);
  CHECK(bfloat16(1 + ulp_of_one / 2 + std::ldexp(1.0f, -20)).bits == 0x3F81);
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7F80);
  CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7F80);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(static_cast<float>(bfloat16(std::bit_cast<float>(0x7F800001u)))));
  CHECK(static_cast<float>(bfloat16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("half-precision numbers compare by value") {
  CHECK(float16(0.0f) == float16(-0.0f));
  CHECK(bfloat16(0.0f) == bfloat16(-0.0f));
  CHECK_FALSE(float16(NAN) == float16(NAN));
  CHECK_FALSE(bfloat16(NAN) == bfloat16(NAN));
  CHECK_FALSE(float16(1.0f) == float16(2.0f));
}

TEST_CASE("zeros, full and from_data hold the values asked for") {
  const auto z = tensor::zeros({2, 3}, dtype::float32);
  CHECK(dims(z.shape()) == "[2, 3]");
  CHECK(dims(z.strides()) == "[3, 1]");
  CHECK(z.numel() == 6);
  CHECK(z.nbytes() == 24);
  CHECK(z.storage_offset() == 0);
  CHECK(z.is_contiguous());
  CHECK(z.device() == device{kDLCPU, 0});
  for (float v : z.data<float>()) CHECK(v == 0.0f);

  CHECK(tensor::full({2, 2}, 7, dtype::int16).at<std::int16_t>({1, 1}) == 7);
  CHECK(tensor::full({1}, 2.9, dtype::int32).item<std::int32_t>() == 2);
  CHECK(tensor::full({1}, -1.5, dtype::int64).item<std::int64_t>() == -1);
  CHECK(tensor::full({1}, 2.0, dtype::boolean).item<bool>());
  CHECK(tensor::full({1}, 1.0, dtype::float16).item<float16>().bits == 0x3C00);
  CHECK(tensor::full({1}, 1.0, dtype::bfloat16).item<bfloat16>().bits == 0x3F80);
  CHECK(tensor::full({1}, 0.25, dtype::float64).item<double>() == 0.25);

  const auto t = make<std::int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.at<std::int64_t>({0, 1}) == 2);
  CHECK(t.at<std::int64_t>({1, 2}) == 6);
  CHECK(t.at<std::int64_t>({-1, -3}) == 4);
  CHECK(dims(tensor::from_data<float>(std::vector<float>{1, 2, 3}).shape()) == "[3]");
}

TEST_CASE("shapes and indices are integers in braces, of any integer type, or ranges of int64") {
  CHECK(tensor::zeros({}, dtype::float32).ndim() == 0);
  CHECK(tensor::zeros({}, dtype::float32).numel() == 1);
  const std::size_t rows = 2;
  const std::uint8_t columns = 3;
  CHECK(dims(tensor::zeros({rows, columns}, dtype::int8).shape()) == "[2, 3]");
  const std::vector<std::int64_t> shape{3, 2};
  const auto t = tensor::full(shape, 1, dtype::int64);
  CHECK(dims(t.shape()) == "[3, 2]");
  CHECK(dims(tensor::empty(t.shape(), dtype::int64).shape()) == "[3, 2]");
  CHECK(dims(t.reshape(std::array<std::int64_t, 2>{2, 3}).shape()) == "[2, 3]");
  const std::vector<std::int64_t> index{2, 1};
  CHECK(counting(6, {3, 2}).at<std::int64_t>(index) == 5);
  // Seven sizes, more than an int_list holds inline, survive its copies.
  const int_list seven{1, 2, 1, 2, 1, 2, 3};
  const int_list copy = seven;
  CHECK(dims(tensor::empty(copy, dtype::uint8).shape()) == "[1, 2, 1, 2, 1, 2, 3]");
}

// from_data's braces may make a shape or options: a shape when they hold
// integers or nothing, as when they made an initializer_list.
TEST_CASE("from_data takes braces of integers as the shape and designated braces as the options") {
  const std::vector<float> six{0, 1, 2, 3, 4, 5};
  const std::vector<float> one{9};
  CHECK(dims(tensor::from_data<float>(six, {6}).shape()) == "[6]");
  CHECK(dims(tensor::from_data<float>(six, {2, 3}).shape()) == "[2, 3]");
  CHECK(tensor::from_data<float>(one, {}).ndim() == 0);
  CHECK_THROWS_AS(tensor::from_data<float>(six, {5}), std::invalid_argument);
  const auto shared = tensor::from_data<float>(six, {.shared = true});
  CHECK(dims(shared.shape()) == "[6]");
  CHECK(shared.is_shared());
  const tensor_options options{.shared = true};
  CHECK(tensor::from_data<float>(six, options).is_shared());
  CHECK_FALSE(tensor::from_data<float>(six).is_shared());
}

TEST_CASE("full refuses a value an integer dtype cannot hold") {
  CHECK(tensor::full({1}, 255, dtype::uint8).item<std::uint8_t>() == 255);
  CHECK(tensor::full({1}, -128, dtype::int8).item<std::int8_t>() == -128);
  CHECK(tensor::full({1}, -0x1p63, dtype::int64).item<std::int64_t>() ==
        std::numeric_limits<std::int64_t>::min());
  CHECK_THROWS_AS(tensor::full({1}, 256, dtype::uint8), std::invalid_argument);
  CHECK_THROWS_AS(tensor::full({1}, -1, dtype::uint8), std::invalid_argument);
  CHECK_THROWS_AS(tensor::full({1}, 0x1p63, dtype::int64), std::invalid_argument);
  CHECK_THROWS_AS(tensor::full({1}, NAN, dtype::int32), std::invalid_argument);
}

// Before, full and fill_ took a double: int64 values past 2^53 were
// rounded, and INT64_MAX, rounded up to 2^63, was refused.
TEST_CASE("integer values fill integer tensors exactly, past 2^53 too, and are refused by range alone") {
  constexpr std::int64_t odd = (std::int64_t{1} << 53) + 1;
  CHECK(tensor::full({1}, odd, dtype::int64).item<std::int64_t>() == odd);
  for (const std::int64_t v : {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()}) {
    CAPTURE(v);
    auto t = tensor::zeros({3}, dtype::int64);
    t.fill_(v);
    CHECK(t.at<std::int64_t>({2}) == v);
  }
  CHECK(tensor::full({1}, std::numeric_limits<std::uint64_t>::max(), dtype::uint64).item<std::uint64_t>() ==
        std::numeric_limits<std::uint64_t>::max());
  CHECK_THROWS_WITH_AS(tensor::full({1}, std::numeric_limits<std::int64_t>::max(), dtype::int32),
                       "tensor::full: 9223372036854775807 does not fit int32", std::invalid_argument);
  CHECK_THROWS_WITH_AS(tensor::full({1}, std::numeric_limits<std::uint64_t>::max(), dtype::int64),
                       "tensor::full: 18446744073709551615 does not fit int64", std::invalid_argument);
  CHECK_THROWS_WITH_AS(tensor::full({1}, -1, dtype::uint64), "tensor::full: -1 does not fit uint64",
                       std::invalid_argument);
  // Into floating dtypes and bool as before: rounded, refused past the largest finite, != 0.
  CHECK(tensor::full({1}, odd, dtype::float64).item<double>() == 0x1p53);
  CHECK_THROWS_WITH_AS(tensor::full({1}, 70000, dtype::float16),
                       "tensor::full: 70000 is beyond the largest finite float16", std::invalid_argument);
  CHECK(tensor::full({1}, 2, dtype::boolean).item<bool>());
  CHECK(tensor::full({1}, std::int8_t{-3}, dtype::float32).item<float>() == -3.0f);
}

// Before, full's refusal named fill_, a function the caller never called.
TEST_CASE("a refused value's error names the function called, full or fill_") {
  CHECK_THROWS_WITH_AS(tensor::full({2}, 1000, dtype::int8), "tensor::full: 1000 does not fit int8",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(tensor::full({1}, 1e300, dtype::float32),
                       "tensor::full: 1e+300 is beyond the largest finite float32", std::invalid_argument);
  auto t = tensor::full({2}, 1, dtype::int8);
  CHECK_THROWS_WITH_AS(t.fill_(1000), "tensor::fill_: 1000 does not fit int8", std::invalid_argument);
  CHECK(t.at<std::int8_t>({1}) == 1);
}

// Before, a finite value past a floating dtype's range filled infinities.
TEST_CASE("full refuses a finite value past a floating dtype's largest, and takes infinity and NaN") {
  CHECK(tensor::full({1}, 65504, dtype::float16).item<float16>().bits == 0x7BFF);
  CHECK(tensor::full({1}, -0x1.FEp127, dtype::bfloat16).item<bfloat16>().bits == 0xFF7F);
  CHECK(tensor::full({1}, std::numeric_limits<float>::max(), dtype::float32).item<float>() ==
        std::numeric_limits<float>::max());
  CHECK_THROWS_AS(tensor::full({1}, 65505, dtype::float16), std::invalid_argument);
  CHECK_THROWS_AS(tensor::full({1}, -0x1.FFp127, dtype::bfloat16), std::invalid_argument);
  CHECK_THROWS_AS(tensor::full({1}, 1e300, dtype::float32), std::invalid_argument);
  auto t = tensor::full({2}, 1, dtype::float32);
  CHECK_THROWS_AS(t.fill_(-1e39), std::invalid_argument);
  CHECK(t.at<float>({1}) == 1.0f);
  CHECK(tensor::full({1}, INFINITY, dtype::float16).item<float16>().bits == 0x7C00);
  CHECK(std::isinf(tensor::full({1}, -INFINITY, dtype::float32).item<float>()));
  CHECK(std::isnan(static_cast<float>(tensor::full({1}, NAN, dtype::bfloat16).item<bfloat16>())));
  CHECK(tensor::full({1}, 1e300, dtype::float64).item<double>() == 1e300);
}

// Before, a value outside the enum was taken, and its element size read
// past the end of the table of dtypes.
TEST_CASE("a dtype outside the enum is refused by the constructor, the factories and the names") {
  const auto bad = static_cast<dtype>(200);
  const std::int64_t shape[] = {2}, strides[] = {1};
  CHECK_THROWS_AS(tensor(storage::allocate(16), bad, shape, strides), std::invalid_argument);
  CHECK_THROWS_AS(tensor::empty({2}, bad), std::invalid_argument);
  CHECK_THROWS_AS(tensor::full({2}, 1, bad), std::invalid_argument);
  CHECK_THROWS_AS((void)element_size(bad), std::invalid_argument);
  CHECK_THROWS_AS((void)to_string(bad), std::invalid_argument);
  CHECK(element_size(dtype::boolean) == 1);
}

// Before, a CPU tensor with another device index was made and sent, and its
// receiver's decode refused it, naming two equal device types.
TEST_CASE("a CPU tensor on a device index other than 0 is refused where it is made") {
  const std::int64_t shape[] = {2}, strides[] = {1};
  for (const int id : {1, -1}) {
    CAPTURE(id);
    CHECK_THROWS_WITH_AS(tensor(storage::allocate_shared(8), dtype::float32, shape, strides, 0, device{kDLCPU, id}),
                         doctest::Contains("the CPU is device 0"), std::invalid_argument);
  }
  CHECK(tensor(storage::allocate_shared(8), dtype::float32, shape, strides, 0, device{kDLCPU, 0}).numel() == 2);
}

TEST_CASE("shapes that are negative, too deep, too large or miss the values are refused") {
  CHECK_THROWS_AS(make<std::int32_t>({1, 2, 3, 4, 5}, {2, 3}), std::invalid_argument);
  CHECK_THROWS_AS(tensor::empty({-1}, dtype::int8), std::invalid_argument);
  CHECK_THROWS_AS(tensor::empty({std::int64_t{1} << 62, 4}, dtype::int8), std::invalid_argument);
  CHECK_THROWS_AS(tensor::empty({std::int64_t{1} << 61}, dtype::int64), std::invalid_argument);
  CHECK_THROWS_AS(tensor::empty({0, std::int64_t{1} << 62, 4}, dtype::int8), std::invalid_argument);
  // A shape with no elements whose other sizes fit has contiguous strides, so it clones.
  const tensor none = tensor::empty({0, std::int64_t{1} << 31, 4}, dtype::int8);
  CHECK(none.numel() == 0);
  CHECK(none.clone().numel() == 0);
  const std::vector<std::int64_t> deep(65, 1);
  CHECK_THROWS_AS(tensor::empty(deep, dtype::int8), std::invalid_argument);
  CHECK(tensor::empty(std::span(deep).first(64), dtype::int8).numel() == 1);
}

TEST_CASE("shared options and share_memory put the storage in shared memory") {
  CHECK_FALSE(tensor::empty({4}, dtype::float32).is_shared());
  CHECK(tensor::empty({4}, dtype::float32, {.shared = true}).is_shared());
  auto t = tensor::zeros({4}, dtype::float32);
  const auto view = t.slice(0, 1, 3);
  t.share_memory();
  CHECK(t.is_shared());
  CHECK(view.is_shared());
}

TEST_CASE("data() spans a contiguous tensor's elements and refuses others") {
  auto t = tensor::zeros({2, 2}, dtype::int32);
  const auto elements = t.data<std::int32_t>();
  CHECK(elements.size() == 4);
  elements[3] = 42;
  CHECK(t.at<std::int32_t>({1, 1}) == 42);
  CHECK_THROWS_AS(t.data<float>(), std::invalid_argument);
  CHECK_THROWS_AS(t.transpose(0, 1).data<std::int32_t>(), std::logic_error);
}

TEST_CASE("at() counts negative indices from the end and checks bounds and dtype") {
  auto t = counting(6, {2, 3});
  CHECK(t.at<std::int64_t>({-2, -1}) == 2);
  CHECK_THROWS_AS(t.at<std::int64_t>({2, 0}), std::out_of_range);
  CHECK_THROWS_AS(t.at<std::int64_t>({0, -4}), std::out_of_range);
  CHECK_THROWS_AS(t.at<std::int64_t>({0}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(t.at<double>({0, 0}), doctest::Contains("holds int64"),
                       std::invalid_argument);
}

TEST_CASE("item() reads the one element of a tensor of any shape") {
  CHECK(tensor::full({1, 1}, 3, dtype::float64).item<double>() == 3.0);
  const auto scalar = tensor::full({}, 5, dtype::uint32);
  CHECK(scalar.ndim() == 0);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.item<std::uint32_t>() == 5);
  CHECK(scalar.at<std::uint32_t>({}) == 5);
  CHECK_THROWS_AS(tensor::zeros({2}, dtype::float64).item<double>(), std::invalid_argument);
}

TEST_CASE("views share the storage, and a write through a view is seen by the base") {
  auto base = tensor::zeros({3, 4}, dtype::int32);
  const long copies = base.storage().use_count();
  auto row = base.select(0, 1);
  CHECK(same_storage(base, row));
  CHECK(base.storage().use_count() == copies + 1);
  row.at<std::int32_t>({2}) = 9;
  CHECK(base.at<std::int32_t>({1, 2}) == 9);
  base.transpose(0, 1).slice(0, 3, 4).at<std::int32_t>({0, 2}) = 7;
  CHECK(base.at<std::int32_t>({2, 3}) == 7);
}

TEST_CASE("slice follows Python's rules for negative and out-of-range bounds") {
  const auto t = counting(10, {10});
  const auto stepped = t.slice(0, 2, 8, 3);
  CHECK(dims(stepped.shape()) == "[2]");
  CHECK(dims(stepped.strides()) == "[3]");
  CHECK(stepped.storage_offset() == 2);
  CHECK(stepped.at<std::int64_t>({1}) == 5);

  const auto tail = t.slice(0, -3, 100);
  CHECK(dims(tail.shape()) == "[3]");
  CHECK(tail.storage_offset() == 7);
  CHECK(dims(t.slice(0, -100, 2).shape()) == "[2]");
  CHECK(t.slice(0, 8, 2).numel() == 0);
  CHECK(t.slice(0, 10, 20).numel() == 0);
  CHECK(dims(t.slice(0, 0, 10, 4).shape()) == "[3]");
  CHECK_THROWS_AS(t.slice(0, 0, 5, 0), std::invalid_argument);
  CHECK_THROWS_AS(t.slice(1, 0, 5), std::out_of_range);

  const auto m = counting(12, {3, 4}).slice(-1, 1, 3);
  CHECK(dims(m.shape()) == "[3, 2]");
  CHECK(dims(m.strides()) == "[4, 1]");
  CHECK(m.storage_offset() == 1);
  CHECK(m.at<std::int64_t>({2, 1}) == 10);
  CHECK_FALSE(m.is_contiguous());

  const auto rows = counting(12, {3, 4}).slice(0, 1, 3);
  CHECK(dims(rows.shape()) == "[2, 4]");
  CHECK(rows.storage_offset() == 4);
  CHECK(rows.is_contiguous());
}

TEST_CASE("select drops a dimension and moves the offset") {
  const auto t = counting(24, {2, 3, 4});
  const auto middle = t.select(1, 2);
  CHECK(dims(middle.shape()) == "[2, 4]");
  CHECK(dims(middle.strides()) == "[12, 1]");
  CHECK(middle.storage_offset() == 8);
  const auto last = t.select(-1, -1);
  CHECK(dims(last.shape()) == "[2, 3]");
  CHECK(dims(last.strides()) == "[12, 4]");
  CHECK(last.storage_offset() == 3);
  CHECK(last.at<std::int64_t>({1, 2}) == 23);
  CHECK(t.select(0, 1).select(0, 1).select(0, 1).item<std::int64_t>() == 17);
  CHECK_THROWS_AS(t.select(1, 3), std::out_of_range);
  CHECK_THROWS_AS(t.select(3, 0), std::out_of_range);
}

TEST_CASE("views of a tensor without elements refuse offsets and strides past int64, and cross") {
  // A tensor without elements may have any strides: none of them reaches a byte.
  constexpr std::int64_t big = std::int64_t{1} << 62;
  const auto bytes = storage::allocate_shared(16);
  const std::vector<std::int64_t> shape{0, 3};
  const tensor empty(bytes, dtype::int32, shape, std::vector<std::int64_t>{1, big});
  // Index 2 of dimension 1 lies 2^63 elements in, and a step of 2 makes a stride of 2^63.
  CHECK_THROWS_AS(empty.select(1, 2), std::overflow_error);
  CHECK_THROWS_AS(empty.slice(1, 2, 3), std::overflow_error);
  CHECK_THROWS_AS(empty.slice(1, 0, 3, 2), std::overflow_error);

  // What fits is a view as usual, and a receiver accepts it as sent.
  const tensor second = empty.select(1, 1);
  CHECK(second.storage_offset() == big);
  const tensor back = decode<tensor>(encode(second));
  CHECK(back.storage_offset() == big);
  CHECK(dims(back.shape()) == "[0]");
  CHECK(back.storage().same(bytes));

  // Its data stays on the storage, though its offset lies far past it.
  CHECK(second.raw_data() == bytes.data() + bytes.nbytes());
  const tensor near(bytes, dtype::int32, shape, std::vector<std::int64_t>{1, 1}, 2);
  CHECK(near.raw_data() == bytes.data() + 8);
  DLManagedTensor* managed = second.to_dlpack();
  CHECK(managed->dl_tensor.data == bytes.data() + bytes.nbytes());
  managed->deleter(managed);
}

TEST_CASE("transpose swaps sizes and strides") {
  const auto t = counting(6, {2, 3});
  const auto swapped = t.transpose(0, -1);
  CHECK(dims(swapped.shape()) == "[3, 2]");
  CHECK(dims(swapped.strides()) == "[1, 3]");
  CHECK_FALSE(swapped.is_contiguous());
  CHECK(swapped.at<std::int64_t>({2, 1}) == 5);
  CHECK(swapped.at<std::int64_t>({1, 0}) == 1);
  // A 0-d tensor takes 0 and -1, as torch's does, and stays as it is.
  const auto scalar = tensor::full({}, 4, dtype::int64);
  CHECK(scalar.transpose(0, -1).ndim() == 0);
  CHECK(scalar.transpose(-1, 0).item<std::int64_t>() == 4);
  CHECK_THROWS_AS(scalar.transpose(0, 1), std::out_of_range);
}

TEST_CASE("reshape infers one size and keeps the storage and offset") {
  const auto t = counting(12, {12});
  const auto m = t.reshape({3, -1});
  CHECK(dims(m.shape()) == "[3, 4]");
  CHECK(dims(m.strides()) == "[4, 1]");
  CHECK(same_storage(t, m));
  CHECK(m.at<std::int64_t>({2, 3}) == 11);

  const auto row = m.select(0, 1).reshape({2, 2});
  CHECK(row.storage_offset() == 4);
  CHECK(row.at<std::int64_t>({1, 1}) == 7);

  CHECK_THROWS_AS(t.reshape({5, -1}), std::invalid_argument);
  CHECK_THROWS_AS(t.reshape({-1, -1}), std::invalid_argument);
  CHECK_THROWS_AS(t.reshape({4, 4}), std::invalid_argument);
  CHECK_THROWS_AS(t.reshape({-2, -6}), std::invalid_argument);
  CHECK(dims(tensor::empty({0}, dtype::int8).reshape({2, 0, 3}).shape()) == "[2, 0, 3]");
  CHECK_THROWS_AS(tensor::empty({0}, dtype::int8).reshape({-1, 0}), std::invalid_argument);
  // Too many dimensions is said as such, not as a count that does not fit.
  const std::vector<std::int64_t> ones(tensor::max_ndim + 1, 1);
  CHECK_THROWS_WITH_AS(tensor::full({1}, 1, dtype::int8).reshape(ones), "tensor::reshape: 65 dimensions, more than 64",
                       std::invalid_argument);
  // No elements, and sizes whose product, 0 aside, is past int64's bytes:
  // refused as tensor::empty refuses them (before, made, then neither
  // cloned nor received).
  const std::vector<std::int64_t> huge{0, std::int64_t{1} << 62};
  CHECK_THROWS_WITH_AS(tensor::empty({0}, dtype::float64).reshape(huge),
                       "tensor::reshape: shape [0, 4611686018427387904] of float64 is too large",
                       std::invalid_argument);
  CHECK_THROWS_AS(tensor::empty({0}, dtype::float64, {.shared = true}).reshape(huge), std::invalid_argument);
}

TEST_CASE("reshape of a non-contiguous tensor throws; its contiguous() copy reshapes") {
  const auto swapped = counting(6, {2, 3}).transpose(0, 1);
  CHECK_THROWS_WITH_AS(swapped.reshape({6}), doctest::Contains("not contiguous"),
                       std::logic_error);
  const auto flat = swapped.contiguous().reshape({6});
  const std::vector<std::int64_t> expected{0, 3, 1, 4, 2, 5};
  for (std::int64_t i = 0; i < 6; ++i) CHECK(flat.at<std::int64_t>({i}) == expected[i]);
}

TEST_CASE("contiguous() of a contiguous tensor is the tensor itself") {
  const auto t = counting(6, {2, 3});
  CHECK(same_storage(t.contiguous(), t));
  CHECK_FALSE(same_storage(t.transpose(0, 1).contiguous(), t));
}

TEST_CASE("a clone of a column view is contiguous, equal and separate") {
  auto t = counting(12, {3, 4});
  const auto column = t.select(1, 2);
  CHECK(dims(column.strides()) == "[4]");
  auto copy = column.clone();
  CHECK(copy.is_contiguous());
  CHECK(dims(copy.strides()) == "[1]");
  CHECK(copy == column);
  CHECK_FALSE(same_storage(copy, t));
  CHECK(copy.data<std::int64_t>()[2] == 10);
  copy.at<std::int64_t>({0}) = -1;
  CHECK(t.at<std::int64_t>({0, 2}) == 2);
  CHECK(column.clone({.shared = true}).is_shared());
}

TEST_CASE("a clone of a strided 3-d view holds its elements in row-major order") {
  const auto t = counting(24, {2, 3, 4});
  const auto view = t.slice(2, 0, 4, 2).transpose(0, 1);  // [3, 2, 2]
  const auto copy = view.clone();
  CHECK(dims(copy.shape()) == "[3, 2, 2]");
  const auto elements = copy.data<std::int64_t>();
  std::size_t n = 0;
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 2; ++j) {
      for (std::int64_t k = 0; k < 2; ++k) CHECK(elements[n++] == j * 12 + i * 4 + k * 2);
    }
  }
}

TEST_CASE("equality compares dtype, shape and elements, whatever the layouts") {
  const auto a = make<std::int32_t>({1, 2, 3, 4}, {2, 2});
  const auto b = make<std::int32_t>({1, 3, 2, 4}, {2, 2}).transpose(0, 1);
  CHECK(a == b);
  CHECK(equal(b, a));
  CHECK_FALSE(a == make<std::int32_t>({1, 2, 3, 5}, {2, 2}));
  CHECK_FALSE(a == make<std::int32_t>({1, 2, 3, 4}, {4}));
  CHECK_FALSE(a == make<std::int64_t>({1, 2, 3, 4}, {2, 2}));
  CHECK(tensor::empty({0, 3}, dtype::float32) == tensor::empty({0, 3}, dtype::float32));

  const auto nan = tensor::full({2}, NAN, dtype::float32);
  CHECK_FALSE(nan == nan);
  CHECK(tensor::full({2}, -0.0, dtype::float64) == tensor::zeros({2}, dtype::float64));
  CHECK(tensor::full({2}, -0.0, dtype::float16) == tensor::zeros({2}, dtype::float16));
}

TEST_CASE("fill_ writes through a strided view and nowhere else") {
  auto t = tensor::zeros({3, 3}, dtype::int16);
  t.select(1, 0).fill_(5);
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) CHECK(t.at<std::int16_t>({i, j}) == (j == 0 ? 5 : 0));
  }
}

// Such strides made the byte step along the dimension overflow int64
// (undefined behaviour, seen only by a sanitizer: the step was then
// multiplied by index 0 alone); now it is never computed past int64.
TEST_CASE("a dimension of one element may have any stride: fill_, == and printing take no step along it") {
  auto bytes = storage::allocate(64);
  std::memset(bytes.data(), 0, 64);
  const std::int64_t wide[] = {1, 3}, wide_strides[] = {INT64_MAX, 1};
  const std::int64_t tall[] = {3, 1}, tall_strides[] = {1, INT64_MAX};
  tensor row(bytes, dtype::float32, wide, wide_strides, 0);
  tensor column(bytes, dtype::float32, tall, tall_strides, 0);
  row.fill_(2);
  CHECK(row == row.clone());
  CHECK(fmt::format("{}", row) == "tensor([[2, 2, 2]], dtype=float32)");
  CHECK(fmt::format("{}", column) == "tensor([[2], [2], [2]], dtype=float32)");
  CHECK(column == column.clone());
}

// Before, a 16-bit float printed the float it holds, to the float's own
// digits ("0.099975586"), and a NaN with its sign bit set printed "-nan".
TEST_CASE("16-bit floats print their own shortest form, and every NaN prints as nan, as torch's do") {
  CHECK(fmt::format("{}", tensor::full({2}, 0.1, dtype::float16)) == "tensor([0.1, 0.1], dtype=float16)");
  CHECK(fmt::format("{}", tensor::full({1}, 1e38, dtype::bfloat16)) == "tensor([1e+38], dtype=bfloat16)");
  CHECK(fmt::format("{}", tensor::full({1}, 60000, dtype::float16)) == "tensor([60000], dtype=float16)");
  CHECK(fmt::format("{}", tensor::full({1}, -0.0, dtype::float16)) == "tensor([-0], dtype=float16)");
  for (const auto type : {dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64}) {
    CHECK(fmt::format("{}", tensor::full({1}, -std::nan(""), type)).starts_with("tensor([nan]"));
  }
  // Every finite half, each way: what prints reads back to the same bits,
  // in no more significant digits than the float it holds prints in.
  const auto significant = [](std::string text) {
    text = text.substr(0, text.find('e'));
    std::erase_if(text, [](char c) { return c == '-' || c == '.'; });
    const auto first = text.find_first_not_of('0');
    return first == std::string::npos ? std::size_t{1} : text.find_last_not_of('0') - first + 1;
  };
  int wrong = 0;
  const auto check = [&]<class T>(T value) {
    const float exact = static_cast<float>(value);
    if (!std::isfinite(exact)) return;
    const T values[] = {value};
    const std::string text = fmt::format("{}", tensor::from_data(std::span<const T>(values)));
    const std::string shown = text.substr(8, text.find(']') - 8);  // between "tensor([" and "]"
    if (T(std::strtof(shown.c_str(), nullptr)).bits != value.bits || significant(shown) > significant(fmt::format("{}", exact))) {
      ++wrong;
    }
  };
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    check(float16::from_bits(static_cast<std::uint16_t>(bits)));
    check(bfloat16::from_bits(static_cast<std::uint16_t>(bits)));
  }
  CHECK(wrong == 0);
}

TEST_CASE("tensors print like torch's, on one line") {
  CHECK(fmt::format("{}", tensor::full({}, 2.5, dtype::float32)) == "tensor(2.5, dtype=float32)");
  CHECK(fmt::format("{}", tensor::empty({0}, dtype::int64)) == "tensor([], dtype=int64)");
  CHECK(fmt::format("{}", tensor::empty({2, 0}, dtype::float32)) == "tensor([], size=(2, 0), dtype=float32)");
  // Sizes around a 0 are not walked: a hundred million rows of nothing print at once.
  CHECK(fmt::format("{}", tensor::empty({100'000'000, 0, 3}, dtype::int8)) ==
        "tensor([], size=(100000000, 0, 3), dtype=int8)");
  const auto m = make<std::int64_t>({1, 2, 3, 4}, {2, 2});
  CHECK(fmt::format("{}", m) == "tensor([[1, 2], [3, 4]], dtype=int64)");
  CHECK(fmt::format("{}", m.transpose(0, 1)) == "tensor([[1, 3], [2, 4]], dtype=int64)");
  CHECK(fmt::format("{}", make<bool>({true, false}, {2})) == "tensor([True, False], dtype=bool)");
  CHECK(fmt::format("{}", make<std::int8_t>({-1, 2}, {2})) == "tensor([-1, 2], dtype=int8)");
  CHECK(fmt::format("{}", make<std::uint8_t>({255}, {1})) == "tensor([255], dtype=uint8)");
  CHECK(fmt::format("{}", make<double>({0.1, -3}, {2})) == "tensor([0.1, -3], dtype=float64)");
  CHECK(fmt::format("{}", make<float16>({float16(1.5f)}, {1})) == "tensor([1.5], dtype=float16)");
  CHECK(to_string(tensor()) == "tensor([], dtype=float32)");
  // Past 1,000 elements, as torch summarizes: the first and last three of
  // each dimension longer than six (10^7 elements once made 50 MB of text).
  CHECK(fmt::format("{}", counting(10'000, {10'000})) == "tensor([0, 1, 2, ..., 9997, 9998, 9999], dtype=int64)");
  CHECK(fmt::format("{}", counting(10'000, {1'000, 10})) ==
        "tensor([[0, 1, 2, ..., 7, 8, 9], [10, 11, 12, ..., 17, 18, 19], [20, 21, 22, ..., 27, 28, 29], ..., "
        "[9970, 9971, 9972, ..., 9977, 9978, 9979], [9980, 9981, 9982, ..., 9987, 9988, 9989], "
        "[9990, 9991, 9992, ..., 9997, 9998, 9999]], dtype=int64)");
  CHECK(fmt::format("{}", counting(1'000, {1'000})).find("...") == std::string::npos);  // 1,000: every one
  CHECK(fmt::format("{}", tensor::full({10'000'000}, 1, dtype::int8)) == "tensor([1, 1, 1, ..., 1, 1, 1], dtype=int8)");
}

TEST_CASE("to_dlpack describes the view and keeps the storage until its deleter runs") {
  auto t = make<std::int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  auto view = t.slice(1, 1, 3);
  const storage keep = t.storage();
  const long copies = keep.use_count();

  DLManagedTensor* managed = view.to_dlpack();
  CHECK(keep.use_count() == copies + 1);
  const DLTensor& dl = managed->dl_tensor;
  CHECK(dl.data == t.raw_data() + 4);
  CHECK(dl.byte_offset == 0);
  CHECK(dl.ndim == 2);
  CHECK((dl.shape[0] == 2 && dl.shape[1] == 2));
  CHECK((dl.strides[0] == 3 && dl.strides[1] == 1));
  CHECK((dl.dtype.code == kDLInt && dl.dtype.bits == 32 && dl.dtype.lanes == 1));
  CHECK((dl.device.device_type == kDLCPU && dl.device.device_id == 0));

  t = tensor();
  view = tensor();
  CHECK(keep.use_count() == 2);
  CHECK(static_cast<const std::int32_t*>(dl.data)[3] == 4);
  managed->deleter(managed);
  CHECK(keep.use_count() == 1);
}

TEST_CASE("a 0-d tensor goes to DLPack with no dimensions") {
  DLManagedTensor* managed = tensor::full({}, 1.5, dtype::float64).to_dlpack();
  CHECK(managed->dl_tensor.ndim == 0);
  CHECK(*static_cast<const double*>(managed->dl_tensor.data) == 1.5);
  managed->deleter(managed);
}

TEST_CASE("check_layout accepts layouts that fit the storage") {
  using detail::check_layout;
  const std::vector<std::int64_t> shape{2, 3};
  CHECK_NOTHROW(check_layout(dtype::int64, shape, std::vector<std::int64_t>{3, 1}, 0, 48));
  CHECK_NOTHROW(check_layout(dtype::int64, shape, std::vector<std::int64_t>{1, 2}, 0, 48));
  CHECK_NOTHROW(check_layout(dtype::int64, shape, std::vector<std::int64_t>{3, 1}, 2, 64));
  CHECK_NOTHROW(check_layout(dtype::int64, shape, std::vector<std::int64_t>{0, 0}, 0, 8));
  CHECK_NOTHROW(check_layout(dtype::int16, {}, {}, 3, 8));
  CHECK_NOTHROW(check_layout(dtype::int8, std::vector<std::int64_t>{1},
                             std::vector<std::int64_t>{int64_max}, 0, 1));
  // No elements need no bytes, wherever they would start.
  CHECK_NOTHROW(check_layout(dtype::int64, std::vector<std::int64_t>{0, 5},
                             std::vector<std::int64_t>{5, 1}, 1000, 0));
}

TEST_CASE("check_layout rejects each layout a sender could get wrong") {
  using detail::check_layout;
  const auto rejects = [](const std::vector<std::int64_t>& shape,
                          const std::vector<std::int64_t>& strides, std::int64_t offset,
                          std::size_t nbytes, const char* why) {
    CAPTURE(why);
    CHECK_THROWS_WITH_AS(check_layout(dtype::int64, shape, strides, offset, nbytes),
                         doctest::Contains(why), std::invalid_argument);
  };
  rejects(std::vector<std::int64_t>(65, 1), std::vector<std::int64_t>(65, 1), 0, 8,
          "65 dimensions");
  rejects({2, 3}, {3}, 0, 48, "2 sizes but 1 strides");
  rejects({2, -3}, {3, 1}, 0, 48, "size -3 in dimension 1");
  rejects({2, 3}, {-3, 1}, 0, 48, "stride -3 in dimension 0");
  rejects({2, 3}, {3, 1}, -1, 48, "storage offset -1");
  rejects({2, 3}, {3, 1}, 0, 47, "reach byte 48 of a storage of 47 bytes");
  rejects({2, 3}, {3, 1}, 1, 48, "reach byte 56");
  rejects({3}, {int64_max / 2 + 1}, 0, 8, "overflows");                // (3 - 1) * stride
  rejects({2}, {1}, int64_max, 8, "overflows");                        // offset + 1
  rejects({std::int64_t{1} << 61}, {1}, 0, 8, "overflows");            // the bytes of 2^61 int64s
  rejects({2, 2}, {int64_max / 2, int64_max / 2}, 2, 8, "overflows");  // the sum of the reaches
  // Views that repeat one element reach 8 bytes; numel() and nbytes() must still fit.
  rejects({std::int64_t{1} << 32, std::int64_t{1} << 32}, {0, 0}, 0, 8, "is too large");  // the element count
  rejects({std::int64_t{1} << 61}, {0}, 0, 8, "is too large");                          // their bytes
  // No elements, but sizes whose product before the 0 passes int64: numel() would overflow.
  rejects({std::int64_t{1} << 62, 4, 0}, {0, 0, 0}, 0, 8, "is too large");
  // The same sizes with the 0 first: refused alike, where a 0 sits does not matter.
  rejects({0, std::int64_t{1} << 62, 4}, {0, 0, 0}, 0, 8, "is too large");
}

TEST_CASE("the tensor constructor checks its layout and device") {
  const auto bytes = storage::allocate(16);
  const std::vector<std::int64_t> shape{2, 2};
  const tensor t(bytes, dtype::int32, shape, std::vector<std::int64_t>{1, 2});
  CHECK(same_storage(t, tensor(bytes, dtype::int32, shape, std::vector<std::int64_t>{2, 1})));
  CHECK(dims(t.strides()) == "[1, 2]");
  CHECK_THROWS_AS(tensor(bytes, dtype::int32, shape, std::vector<std::int64_t>{2, 1}, 1),
                  std::invalid_argument);
  CHECK_THROWS_AS(tensor(bytes, dtype::int64, shape, std::vector<std::int64_t>{2, 1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      tensor(bytes, dtype::int32, shape, std::vector<std::int64_t>{2, 1}, 0, {kDLCUDA, 0}),
      std::invalid_argument);
}

TEST_CASE("tensors of up to six dimensions hold their shape inline, deeper ones on the heap") {
  const auto inside = [](const tensor& t) {
    const auto* at = reinterpret_cast<const std::byte*>(t.shape().data());
    const auto* self = reinterpret_cast<const std::byte*>(&t);
    return at >= self && at < self + sizeof t;
  };
  const auto small = tensor::empty({5}, dtype::float32);
  const tensor copy = small;
  CHECK(inside(small));
  CHECK(inside(copy));
  CHECK(inside(tensor::empty({1, 2, 1, 2, 1, 2}, dtype::int8)));

  const auto deep = tensor::zeros({1, 2, 1, 2, 1, 2, 3}, dtype::int8);
  CHECK_FALSE(inside(deep));
  auto deep_copy = deep;
  CHECK(deep_copy.shape().data() != deep.shape().data());
  deep_copy = deep_copy.transpose(0, 6);
  CHECK(dims(deep.shape()) == "[1, 2, 1, 2, 1, 2, 3]");
  CHECK(dims(deep_copy.shape()) == "[3, 2, 1, 2, 1, 2, 1]");
  CHECK(deep_copy.clone() == deep_copy);
}

TEST_CASE("a default tensor is an empty float32 vector without storage") {
  const tensor t;
  CHECK(dims(t.shape()) == "[0]");
  CHECK(t.dtype() == dtype::float32);
  CHECK(t.numel() == 0);
  CHECK(t.storage().nbytes() == 0);
}

// Before, a moved-from tensor kept no shape at all: a 0-d tensor of one
// element over no storage, which printing or cloning read through null.
TEST_CASE("a tensor moved from, by construction or assignment, is a default tensor, and works as one") {
  for (const bool assign : {false, true}) {
    CAPTURE(assign);
    tensor from = tensor::full({2, 3}, 5, dtype::int64, {.shared = true});
    const auto assigned = [&from] {
      tensor t;
      t = std::move(from);
      return t;
    };
    const tensor to = assign ? assigned() : tensor(std::move(from));
    CHECK(to == tensor::full({2, 3}, 5, dtype::int64));
    CHECK(dims(from.shape()) == "[0]");
    CHECK(dims(from.strides()) == "[1]");
    CHECK(from.dtype() == dtype::float32);
    CHECK(from.numel() == 0);
    CHECK(from.nbytes() == 0);
    CHECK(from.storage_offset() == 0);
    CHECK(from.storage().nbytes() == 0);
    CHECK(from.clone().numel() == 0);
    CHECK(to_string(from) == to_string(tensor()));
    CHECK(from == tensor());
  }
}

}  // TEST_SUITE

TEST_CASE("a tensor of 1 to 64 dimensions crosses as a view of the same storage with its layout") {
  // Handles of many dimensions outgrow the stack run a writer gathers them in.
  for (std::size_t ndim : {std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{64}}) {
    CAPTURE(ndim);
    std::vector<std::int64_t> shape(ndim, 1);
    shape.front() = 4;
    const tensor base = tensor::zeros(shape, dtype::int32, {.shared = true});
    const tensor view = base.slice(0, 1, 4);
    const tensor back = decode<tensor>(encode(view));
    CHECK(back.storage().same(base.storage()));
    CHECK(dims(back.shape()) == dims(view.shape()));
    CHECK(dims(back.strides()) == dims(view.strides()));
    CHECK(back.storage_offset() == view.storage_offset());
    CHECK(back.dtype() == dtype::int32);
  }
}

namespace device_storage_tests {

// Memory of a device the core library knows only through device_memory:
// here, host bytes that pretend to be CUDA device 3's.
class pretend_device final : public detail::device_memory {
 public:
  explicit pretend_device(std::size_t n) : bytes_(n) {}
  std::byte* data() const noexcept override { return const_cast<std::byte*>(bytes_.data()); }
  std::size_t nbytes() const noexcept override { return bytes_.size(); }
  int device_type() const noexcept override { return kDLCUDA; }
  int device_index() const noexcept override { return 3; }
  std::size_t handle_bound() const noexcept override { return 4; }
  void write(std::vector<std::byte>& out) const override { out.insert(out.end(), 4, std::byte{7}); }

 private:
  std::vector<std::byte> bytes_;
};

// The copy a device layer registers, here between host bytes and
// pretend_device memory; counts its calls.
int pretend_copies = 0;
tensor pretend_copy(const tensor& t, device to) {
  ++pretend_copies;
  const auto& from = t.storage();
  storage bytes = to.type == kDLCPU ? storage::allocate(from.nbytes())
                                    : detail::make_device_storage(std::make_shared<pretend_device>(from.nbytes()));
  std::memcpy(bytes.data(), from.data(), from.nbytes());
  return tensor(std::move(bytes), t.dtype(), t.shape(), t.strides(), t.storage_offset(), to);
}

}  // namespace device_storage_tests

TEST_CASE("a tensor over a device's storage keeps to its device and is not read on the host") {
  using device_storage_tests::pretend_device;
  const storage s = detail::make_device_storage(std::make_shared<pretend_device>(24));
  CHECK(s.is_shared());
  CHECK(s.nbytes() == 24);
  const std::int64_t shape[] = {2, 3};
  const std::int64_t strides[] = {3, 1};
  // The device must be the storage's.
  CHECK_THROWS_AS(tensor(s, dtype::float32, shape, strides, 0, device{kDLCUDA, 0}), std::invalid_argument);
  CHECK_THROWS_AS(tensor(s, dtype::float32, shape, strides), std::invalid_argument);
  CHECK_THROWS_AS(tensor(storage::allocate(24), dtype::float32, shape, strides, 0, device{kDLCUDA, 3}),
                  std::invalid_argument);
  const tensor t(s, dtype::float32, shape, strides, 0, device{kDLCUDA, 3});
  CHECK(t.device() == device{kDLCUDA, 3});
  CHECK(t.is_shared());
  CHECK_THROWS_AS(t.data<float>(), std::logic_error);
  CHECK_THROWS_AS(t.at<float>({0, 0}), std::logic_error);
  CHECK_THROWS_AS(t.clone(), std::logic_error);
  CHECK_THROWS_AS(tensor(t).fill_(1), std::logic_error);
  CHECK_THROWS_AS((void)equal(t, t), std::logic_error);
  CHECK(to_string(t) == "tensor(<6 elements on device 2:3>, shape=[2, 3], dtype=float32)");
  // Views keep the device; DLPack names it.
  CHECK(t.select(0, 1).device() == device{kDLCUDA, 3});
  DLManagedTensor* exported = t.to_dlpack();
  CHECK(exported->dl_tensor.device.device_type == kDLCUDA);
  CHECK(exported->dl_tensor.device.device_id == 3);
  CHECK(exported->dl_tensor.data == s.data());
  exported->deleter(exported);
  // It crosses as its device layer writes it; a process without that layer
  // says so rather than guessing.
  const auto bytes = encode(t);
  try {
    (void)decode<tensor>(bytes);
    FAIL("decoded without a device layer");
  } catch (const decode_error& e) {
    CHECK(std::string(e.what()).find("no device layer for it is loaded") != std::string::npos);
  }
}

TEST_CASE("tensor::to, to_cpu and a device tensor's clone go to the device's layer, or say none is loaded") {
  using device_storage_tests::pretend_copies;
  using device_storage_tests::pretend_copy;
  const tensor host = tensor::full({2, 3}, 1.5, dtype::float32);
  // The CPU is where a CPU tensor already is.
  CHECK(host.to(device{}).storage().same(host.storage()));
  CHECK(host.to_cpu().storage().same(host.storage()));
  // No layer for CUDA in this process.
  try {
    (void)host.to(device{kDLCUDA, 3});
    FAIL("copied to a device without its layer");
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()).find("no device layer for device type 2") != std::string::npos);
  }

  detail::register_device_copy(kDLCUDA, &pretend_copy);
  struct unregister {
    ~unregister() { detail::register_device_copy(kDLCUDA, nullptr); }
  } registered;
  pretend_copies = 0;
  const tensor on_device = host.to(device{kDLCUDA, 3});
  CHECK(pretend_copies == 1);
  CHECK(on_device.device() == device{kDLCUDA, 3});
  CHECK(!on_device.storage().same(host.storage()));
  CHECK(on_device.to(device{kDLCUDA, 3}).storage().same(on_device.storage()));
  CHECK(pretend_copies == 1);
  const tensor copy = on_device.clone();
  CHECK(pretend_copies == 2);
  CHECK(copy.device() == device{kDLCUDA, 3});
  CHECK(!copy.storage().same(on_device.storage()));
  const tensor back = copy.to_cpu();
  CHECK(pretend_copies == 3);
  CHECK(back.device() == device{});
  CHECK(equal(back, host));
  // Before, any CPU index was taken as the CPU, though no tensor can be
  // made on another: both are refused as the constructor refuses them.
  for (const tensor& from : {host, on_device}) {
    CHECK_THROWS_WITH_AS((void)from.to(device{kDLCPU, 2}), "tensor::to: CPU device 2; the CPU is device 0",
                         std::invalid_argument);
  }
  // Between two device types there is no one layer to ask.
  CHECK_THROWS_AS((void)on_device.to(device{kDLROCM, 0}), std::logic_error);
  // A layer's copy keeps the layout: contiguous() does not ask it.
  CHECK(on_device.contiguous().storage().same(on_device.storage()));
  CHECK_THROWS_AS((void)on_device.transpose(0, 1).contiguous(), std::logic_error);
  CHECK(pretend_copies == 3);
  detail::register_device_copy(kDLCUDA, nullptr);
  CHECK_THROWS_AS((void)on_device.to_cpu(), std::logic_error);
}
