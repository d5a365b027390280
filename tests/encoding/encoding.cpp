#include "cohort/encoding.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

using namespace cohort;
using namespace std::string_literals;

namespace {

struct point {
  int x;
  int y;
};

static_assert(crossable<bool> && crossable<char> && crossable<signed char> &&
              crossable<unsigned char> && crossable<short> && crossable<unsigned short> &&
              crossable<int> && crossable<unsigned> && crossable<long> && crossable<unsigned long> &&
              crossable<long long> && crossable<unsigned long long> && crossable<std::int8_t> &&
              crossable<std::uint64_t>);
static_assert(crossable<float> && crossable<double> && crossable<std::string>);
static_assert(crossable<std::vector<std::byte>> && crossable<std::vector<unsigned char>>);
static_assert(crossable<std::vector<std::vector<std::string>>>);
static_assert(crossable<std::tuple<>> && crossable<std::tuple<int, std::string, std::vector<double>>>);
static_assert(crossable<std::pair<std::string, std::vector<std::pair<bool, float>>>>);

static_assert(!crossable<std::map<int, int>>);
static_assert(!crossable<const char*>);
static_assert(!crossable<int*>);
static_assert(!crossable<point>);
static_assert(!crossable<long double>);
static_assert(!crossable<std::string_view>);
static_assert(!crossable<int&> && !crossable<const int>);
static_assert(!crossable<wchar_t> && !crossable<char8_t> && !crossable<char16_t> &&
              !crossable<char32_t>);
static_assert(!crossable<std::byte>);
static_assert(!crossable<std::vector<point>> && !crossable<std::tuple<int, point>>);
static_assert(!crossable<std::vector<std::tuple<>>>);

// The largest single allocation since the last reset, counted by the
// replacements of operator new below (this program's only ones).
std::atomic<std::size_t> largest_allocation = 0;

template <class T>
T round_trip(const T& value) {
  return decode<T>(encode(value));
}

std::vector<std::byte> bytes_of(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int value : values) out.push_back(static_cast<std::byte>(value));
  return out;
}

// A blob with a one-byte signature length, as any signature here has.
std::vector<std::byte> blob(std::string_view signature, const std::vector<std::byte>& payload) {
  std::vector<std::byte> out{static_cast<std::byte>(signature.size())};
  for (char c : signature) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<std::byte> payload_of(const encoded& value) {
  const auto bytes = value.bytes().subspan(1 + value.signature().size());
  return {bytes.begin(), bytes.end()};
}

template <class T>
bool same_bits(T a, T b) {
  using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return std::bit_cast<bits>(a) == std::bit_cast<bits>(b);
}

}  // namespace

void* operator new(std::size_t size) {
  std::size_t seen = largest_allocation.load(std::memory_order_relaxed);
  while (size > seen && !largest_allocation.compare_exchange_weak(seen, size, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

TEST_SUITE("encoding") {

TEST_CASE_TEMPLATE("every integer width keeps its zero, minus one, minimum and maximum", T,
                   char, signed char, unsigned char, short, unsigned short, int, unsigned, long,
                   unsigned long, long long, unsigned long long) {
  for (T value : {T{0}, T{1}, static_cast<T>(-1), std::numeric_limits<T>::min(),
                  std::numeric_limits<T>::max()}) {
    CHECK(round_trip(value) == value);
  }
}

TEST_CASE("the 64-bit extremes come back exactly") {
  CHECK(round_trip(std::numeric_limits<std::int64_t>::min()) ==
        std::numeric_limits<std::int64_t>::min());
  CHECK(round_trip(std::numeric_limits<std::int64_t>::max()) ==
        std::numeric_limits<std::int64_t>::max());
  CHECK(round_trip(std::numeric_limits<std::uint64_t>::max()) ==
        std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("booleans come back") {
  CHECK(round_trip(true));
  CHECK_FALSE(round_trip(false));
}

TEST_CASE_TEMPLATE("floating point keeps NaN, signed zero, infinities and denormals", T, float,
                   double) {
  using limits = std::numeric_limits<T>;
  CHECK(std::isnan(round_trip(limits::quiet_NaN())));
  CHECK(same_bits(round_trip(limits::quiet_NaN()), limits::quiet_NaN()));
  CHECK(std::signbit(round_trip(T(-0.0))));
  CHECK(round_trip(T(-0.0)) == T(0));
  CHECK(round_trip(limits::infinity()) == limits::infinity());
  CHECK(round_trip(-limits::infinity()) == -limits::infinity());
  CHECK(round_trip(limits::denorm_min()) == limits::denorm_min());
  CHECK(round_trip(limits::lowest()) == limits::lowest());
  CHECK(round_trip(limits::max()) == limits::max());
  CHECK(round_trip(T(0.1)) == T(0.1));
}

TEST_CASE("floating point is stored as little-endian IEEE-754 bits") {
  CHECK(payload_of(encode(1.0f)) == bytes_of({0x00, 0x00, 0x80, 0x3f}));
  CHECK(payload_of(encode(-2.0)) == bytes_of({0, 0, 0, 0, 0, 0, 0x00, 0xc0}));
}

TEST_CASE("an empty string comes back empty") {
  CHECK(round_trip(std::string()).empty());
}

TEST_CASE("a string with embedded NULs comes back whole") {
  CHECK(round_trip("a\0b\0\0c"s) == "a\0b\0\0c"s);
  std::string large(300'000, '\0');
  for (std::size_t i = 0; i < large.size(); i += 7) large[i] = static_cast<char>('a' + i % 26);
  CHECK(round_trip(large) == large);
}

TEST_CASE("byte vectors come back, empty or a mebibyte long") {
  CHECK(round_trip(std::vector<std::byte>{}).empty());
  std::vector<std::byte> mebibyte(1 << 20);
  for (std::size_t i = 0; i < mebibyte.size(); ++i) mebibyte[i] = static_cast<std::byte>(i * 31);
  CHECK(round_trip(mebibyte) == mebibyte);
  CHECK(encode(mebibyte).size() == 1 + 1 + 3 + mebibyte.size());
  const std::vector<unsigned char> chars{0, 1, 255};
  CHECK(round_trip(chars) == chars);
}

TEST_CASE("the two byte vector types read each other") {
  const std::vector<unsigned char> chars{0, 7, 255};
  CHECK(decode<std::vector<std::byte>>(encode(chars)) == bytes_of({0, 7, 255}));
  CHECK(decode<std::vector<unsigned char>>(encode(bytes_of({0, 7, 255}))) == chars);
}

TEST_CASE("nested vectors of tuples of strings come back") {
  using value_type = std::vector<std::tuple<std::string, std::vector<std::pair<int, std::string>>, double>>;
  const value_type value{
      {"first", {{-1, "x"}, {2, ""}}, 1.5},
      {"", {}, -0.25},
      {"th\0ird"s, {{std::numeric_limits<int>::min(), "z"}}, 1e300},
  };
  CHECK(round_trip(value) == value);
  CHECK(round_trip(std::vector<std::vector<int>>{{}, {1}, {2, 3}}) ==
        std::vector<std::vector<int>>{{}, {1}, {2, 3}});
  CHECK(round_trip(std::vector<bool>{true, false, true}) == std::vector<bool>{true, false, true});
}

TEST_CASE("pairs and tuples come back, the empty tuple too") {
  CHECK(round_trip(std::pair<std::string, std::uint16_t>{"port", 8080}) ==
        std::pair<std::string, std::uint16_t>{"port", 8080});
  CHECK(round_trip(std::tuple<std::tuple<int>>{std::tuple<int>{5}}) ==
        std::tuple<std::tuple<int>>{std::tuple<int>{5}});
  CHECK(round_trip(std::tuple<>{}) == std::tuple<>{});
  CHECK(payload_of(encode(std::tuple<>{})).empty());
}

TEST_CASE("signatures name each type compactly") {
  CHECK(type_signature<bool>() == "b");
  CHECK(type_signature<std::int8_t>() == "i1");
  CHECK(type_signature<std::int16_t>() == "i2");
  CHECK(type_signature<int>() == "i4");
  CHECK(type_signature<std::int64_t>() == "i8");
  CHECK(type_signature<std::uint8_t>() == "u1");
  CHECK(type_signature<std::uint64_t>() == "u8");
  CHECK(type_signature<char>() == (std::is_signed_v<char> ? "i1" : "u1"));
  CHECK(type_signature<float>() == "f4");
  CHECK(type_signature<double>() == "f8");
  CHECK(type_signature<std::string>() == "s");
  CHECK(type_signature<std::vector<std::byte>>() == "y");
  CHECK(type_signature<std::vector<unsigned char>>() == "y");
  CHECK(type_signature<std::vector<std::vector<int>>>() == "vvi4");
  CHECK(type_signature<std::tuple<>>() == "t()");
  CHECK(type_signature<std::pair<int, std::string>>() == "t(i4s)");
  CHECK(type_signature<std::tuple<int, std::string>>() == "t(i4s)");
  CHECK(encode(std::vector<std::tuple<bool, double>>{}).signature() == "vt(bf8)");
}

TEST_CASE("small integers take one payload byte") {
  for (std::uint64_t value : {0ULL, 1ULL, 127ULL}) CHECK(payload_of(encode(value)).size() == 1);
  for (std::int64_t value : {0LL, -1LL, 63LL, -64LL}) CHECK(payload_of(encode(value)).size() == 1);
  CHECK(payload_of(encode(std::uint64_t{128})).size() == 2);
  CHECK(payload_of(encode(std::int64_t{64})).size() == 2);
  CHECK(payload_of(encode(std::numeric_limits<std::uint64_t>::max())).size() == 10);
}

TEST_CASE("a 1000-byte string costs its bytes and a two-byte length") {
  CHECK(payload_of(encode(std::string(1000, 'x'))).size() == 1002);
}

TEST_CASE("the blob is the signature length, the signature, then the payload") {
  const auto value = encode(std::int32_t{-2});
  CHECK(std::vector<std::byte>(value.bytes().begin(), value.bytes().end()) ==
        bytes_of({2, 'i', '4', 3}));
}

TEST_CASE("decoding as another type throws naming both") {
  CHECK_THROWS_WITH_AS(decode<std::string>(encode(42)), "cohort::decode: the value is i4, asked for s",
                       decode_error);
  CHECK_THROWS_AS(decode<std::int64_t>(encode(42)), decode_error);
  CHECK_THROWS_AS(encode(std::pair<int, int>{}).as<std::tuple<int>>(), decode_error);
}

// Before, the signature's bytes went into the message as they were: a
// terminal showed "the value is T, asked for T" for "T\x01".
TEST_CASE("a corrupted signature is named with its unprintable bytes escaped") {
  std::string what;
  try {
    (void)decode<std::string>(blob(std::string_view("s\x01\x1b[2J\x9f", 7), bytes_of({0})));
  } catch (const decode_error& e) {
    what = e.what();
  }
  CHECK(what.find("the value is s\\x01\\x1b[2J\\x9f,") != std::string::npos);
  CHECK(what.find("asked for s") != std::string::npos);
  CHECK(std::all_of(what.begin(), what.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
}

TEST_CASE("every strict prefix of a valid blob throws") {
  const auto value = encode(std::vector<std::tuple<std::string, std::int64_t, double>>{
      {"alpha", -300, 2.5}, {"", 1LL << 40, -0.0}});
  const auto whole = value.bytes();
  for (std::size_t size = 0; size < whole.size(); ++size) {
    CAPTURE(size);
    CHECK_THROWS_AS((decode<std::vector<std::tuple<std::string, std::int64_t, double>>>(
                        whole.first(size))),
                    decode_error);
  }
}

TEST_CASE("trailing bytes after the value throw") {
  auto bytes = blob("i4", bytes_of({2, 0}));
  CHECK_THROWS_WITH_AS(decode<int>(bytes), "cohort::decode: 1 bytes follow the value", decode_error);
}

TEST_CASE("a length far beyond the input throws before allocating") {
  // 2^40 as a varint.
  const auto huge = bytes_of({0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 1, 2, 3});
  CHECK_THROWS_AS(decode<std::vector<std::byte>>(blob("y", huge)), decode_error);
  CHECK_THROWS_AS(decode<std::string>(blob("s", huge)), decode_error);
  CHECK_THROWS_AS(decode<std::vector<std::string>>(blob("vs", huge)), decode_error);
  CHECK_THROWS_AS(decode<std::vector<std::int64_t>>(blob("vi8", bytes_of({4, 1, 2, 3}))),
                  decode_error);
}

TEST_CASE("a count of many elements reserves no more than the bytes left, whatever each element's size") {
  // One mebibyte claiming as many strings (each 32 bytes in memory), the
  // first of which is malformed: a reserve for the count took 32 MiB.
  std::vector<std::byte> payload{std::byte{0x80}, std::byte{0x80}, std::byte{0x40}};  // 2^20
  payload.resize(payload.size() + (std::size_t{1} << 20), std::byte{0xff});
  const auto malformed = blob("vs", payload);
  largest_allocation = 0;
  CHECK_THROWS_AS(decode<std::vector<std::string>>(malformed), decode_error);
  CHECK(largest_allocation.load() <= payload.size());
  // Well-formed, such a count decodes whole.
  std::fill(payload.begin() + 3, payload.end(), std::byte{0});
  CHECK(decode<std::vector<std::string>>(blob("vs", payload)).size() == std::size_t{1} << 20);
}

TEST_CASE("a malformed varint throws") {
  CHECK_THROWS_WITH_AS(decode<std::uint64_t>(blob("u8", bytes_of({0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                                                   0x80, 0x80, 0x80, 0x80, 0x01}))),
                       "cohort::decode: a varint is longer than 10 bytes", decode_error);
  CHECK_THROWS_WITH_AS(decode<std::uint64_t>(blob("u8", bytes_of({0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                                                   0xff, 0xff, 0xff, 0x02}))),
                       "cohort::decode: a varint overflows 64 bits", decode_error);
}

TEST_CASE("an integer out of range for the type asked for throws") {
  CHECK_THROWS_WITH_AS(decode<std::int8_t>(blob("i1", payload_of(encode(std::int64_t{300})))),
                       "cohort::decode: 300 is out of range for i1", decode_error);
  CHECK_THROWS_AS(decode<std::int8_t>(blob("i1", payload_of(encode(std::int64_t{-129})))),
                  decode_error);
  CHECK_THROWS_AS(decode<std::uint8_t>(blob("u1", payload_of(encode(std::uint64_t{256})))),
                  decode_error);
  CHECK_THROWS_AS(decode<std::int32_t>(blob("i4", payload_of(encode(std::int64_t{1LL << 31})))),
                  decode_error);
  CHECK(decode<std::int8_t>(blob("i1", payload_of(encode(std::int64_t{-128})))) == -128);
}

TEST_CASE("a bool byte other than 0 or 1 throws") {
  CHECK_THROWS_WITH_AS(decode<bool>(blob("b", bytes_of({2}))), "cohort::decode: a bool byte is 2",
                       decode_error);
}

TEST_CASE("bytes from elsewhere are adopted once their prefix checks out") {
  const auto original = encode(std::pair<std::string, int>{"rank", 3});
  const auto adopted =
      encoded::from_bytes({original.bytes().begin(), original.bytes().end()});
  CHECK(adopted.signature() == "t(si4)");
  CHECK(adopted.as<std::pair<std::string, int>>() == std::pair<std::string, int>{"rank", 3});
  CHECK_THROWS_AS(encoded::from_bytes({}), decode_error);
  CHECK_THROWS_AS(encoded::from_bytes(bytes_of({5, 'i', '4'})), decode_error);
  CHECK_THROWS_AS(encoded::from_bytes(bytes_of({0x80})), decode_error);
}

TEST_CASE("an encoded value copies and moves like the bytes it owns") {
  auto first = encode("payload"s);
  const auto copy = first;
  const auto moved = std::move(first);
  CHECK(copy.as<std::string>() == "payload");
  CHECK(moved.as<std::string>() == "payload");
  CHECK(encoded{}.empty());
  CHECK(encoded{}.signature().empty());
  CHECK_THROWS_AS(decode<int>(encoded{}), decode_error);
}

}  // TEST_SUITE("encoding")
