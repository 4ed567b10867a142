#include <catch2/catch.hpp>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/core/float8.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <string_view>

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_tensor {

// dtensor's, not OpenBLAS's global typedef (cblas.h), which another file of the group may include first.
using dtensor::bfloat16;
using namespace dtensor;

TEST_CASE("tensor factories, access and copies", "[core]") {
  auto a = arange<float>(Shape<2>{3, 4});
  CHECK(a.numel() == 12);
  CHECK(a(1, 2) == 6.f);
  Tensor<float, 2> b = a;
  b(0, 0) = 42.f;
  CHECK(a(0, 0) == 0.f);
  CHECK_FALSE(equal(a, b));
  CHECK(equal(a, Tensor<float, 2>(a)));
  auto z = zeros<double>(Shape<3>{2, 0, 5});
  CHECK(z.numel() == 0);
  CHECK(equal(z, zeros<double>(Shape<3>{2, 0, 5})));
  auto o = ones<std::int64_t>(Shape<1>{4});
  CHECK(o[3] == 1);
}

TEST_CASE("slice and box copies", "[core]") {
  auto a = arange<int>(Shape<3>{4, 5, 6});
  auto s = a.slice(1, 2, 3);
  REQUIRE(s.shape() == Shape<3>{4, 3, 6});
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 6; ++k) CHECK(s(i, j, k) == a(i, j + 2, k));
  auto t = a.slice(2, 1, 4);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 4; ++k) REQUIRE(t(i, j, k) == a(i, j, k + 1));
  CHECK_THROWS_WITH(a.slice(0, 3, 2), Catch::Contains("Tensor::slice") && Catch::Contains("[4, 5, 6]"));
}

TEST_CASE("seeded random tensors are reproducible", "[core]") {
  auto u = uniform<float>(Shape<1>{100}, 7, -1, 1);
  CHECK(equal(u, uniform<float>(Shape<1>{100}, 7, -1, 1)));
  CHECK_FALSE(equal(u, uniform<float>(Shape<1>{100}, 8, -1, 1)));
  for (Extent i = 0; i < 100; ++i) CHECK((u[i] >= -1 && u[i] < 1));
  auto n = normal<double>(Shape<1>{10001}, 3);
  double mean = 0;
  for (Extent i = 0; i < n.numel(); ++i) mean += n[i];
  CHECK(std::abs(mean / 10001) < 0.05);
}

namespace {

template <class F8>
bool is_nan_code(std::uint8_t c) {
  return std::isnan(float(F8::from_bits(c)));
}

/// The oracle of a float -> FP8 conversion, by brute force over the 256 codes: the nearest finite
/// value (ties: the even code), clamped to +-max beyond it, a zero keeping the input's sign.
template <class F8>
std::uint8_t nearest_code(float x) {
  if (std::isnan(x)) return 0x7f;
  const double max = F8::max_value();
  if (std::abs(double(x)) >= max) return (x < 0 ? 0x80 : 0x00) | std::numeric_limits<F8>::max().bits;
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = F8::from_bits(std::uint8_t(c));
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
    const double d = std::abs(double(v) - double(x));
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return std::uint8_t(best);
}

template <class F8>
void check_every_code_round_trips() {
  for (int c = 0; c < 256; ++c) {
    const auto code = std::uint8_t(c);
    const float v = F8::from_bits(code);
    INFO("code " << c << " value " << v);
    if (is_nan_code<F8>(code)) CHECK(F8(v).bits == 0x7f);                      // any NaN becomes the positive NaN
    else if (std::isinf(v)) CHECK(F8(v).bits == (code & 0x80 ? 0xfb : 0x7b));  // satfinite: inf -> max
    else CHECK(F8(v).bits == code);                                            // exact, -0 included
  }
}

}  // namespace

TEST_CASE("FP8 E4M3: the OCP values, every code round-trips, ties to even, saturation", "[core][fp8]") {
  using F = float8_e4m3;
  // OCP OFP8 (rev. 1.0), E4M3: max 448 = S.1111.110, min normal 2^-6, min subnormal 2^-9, NaN S.1111.111.
  CHECK(float(F::from_bits(0x7e)) == 448.f);
  CHECK(float(F::from_bits(0xfe)) == -448.f);
  CHECK(float(F::from_bits(0x08)) == std::ldexp(1.f, -6));
  CHECK(float(F::from_bits(0x07)) == 0.875f * std::ldexp(1.f, -6));  // max subnormal
  CHECK(float(F::from_bits(0x01)) == std::ldexp(1.f, -9));
  CHECK(float(F::from_bits(0x38)) == 1.f);
  CHECK(std::isnan(float(F::from_bits(0x7f))));
  CHECK(std::isnan(float(F::from_bits(0xff))));
  CHECK(std::signbit(float(F::from_bits(0x80))));
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += is_nan_code<F>(std::uint8_t(c));
  CHECK(nans == 2);  // no infinities, 2 NaNs: 254 finite values
  CHECK(float(std::numeric_limits<F>::max()) == 448.f);
  CHECK(float(std::numeric_limits<F>::min()) == 0.015625f);
  CHECK(float(std::numeric_limits<F>::denorm_min()) == 0.001953125f);
  CHECK(float(std::numeric_limits<F>::epsilon()) == 0.125f);
  check_every_code_round_trips<F>();

  CHECK(float(F(1.0625f)) == 1.f);  // halfway 1 | 1.125: to the even mantissa
  CHECK(float(F(1.0625001f)) == 1.125f);
  CHECK(float(F(1.1875f)) == 1.25f);  // halfway 1.125 | 1.25: up to even
  CHECK(float(F(-3.3f)) == -3.25f);
  CHECK(float(F(240.f)) == 240.f);
  CHECK(float(F(248.f)) == 256.f);  // halfway 240 | 256 (binade change): to even
  // Subnormals: quantum 2^-9.
  const float q = std::ldexp(1.f, -9);
  CHECK(float(F(0.5f * q)) == 0.f);  // halfway 0 | q: to 0
  CHECK(std::signbit(float(F(-0.5f * q))));
  CHECK(float(F(0.50001f * q)) == q);
  CHECK(float(F(1.5f * q)) == 2 * q);
  CHECK(float(F(2.5f * q)) == 2 * q);
  CHECK(F(7.5f * q).bits == 0x08);  // rounds up into the smallest normal
  CHECK(F(1e-30f).bits == 0x00);
  CHECK(F(std::numeric_limits<float>::denorm_min()).bits == 0x00);
  // Saturation (satfinite): beyond 448, and infinities, become +-448; NaN the NaN.
  CHECK(float(F(460.f)) == 448.f);
  CHECK(float(F(464.f)) == 448.f);  // halfway 448 | (480: NaN code): 448
  CHECK(float(F(1e30f)) == 448.f);
  CHECK(float(F(std::numeric_limits<float>::infinity())) == 448.f);
  CHECK(float(F(-std::numeric_limits<float>::infinity())) == -448.f);
  CHECK(F(std::numeric_limits<float>::quiet_NaN()).bits == 0x7f);
  CHECK(F(-std::numeric_limits<float>::quiet_NaN()).bits == 0x7f);
}

TEST_CASE("FP8 E5M2: the OCP values, every code round-trips, ties to even, saturation", "[core][fp8]") {
  using F = float8_e5m2;
  // OCP OFP8, E5M2: max 57344 = S.11110.11, min normal 2^-14, min subnormal 2^-16, inf S.11111.00.
  CHECK(float(F::from_bits(0x7b)) == 57344.f);
  CHECK(float(F::from_bits(0x04)) == std::ldexp(1.f, -14));
  CHECK(float(F::from_bits(0x03)) == 0.75f * std::ldexp(1.f, -14));
  CHECK(float(F::from_bits(0x01)) == std::ldexp(1.f, -16));
  CHECK(float(F::from_bits(0x3c)) == 1.f);
  CHECK(float(F::from_bits(0x7c)) == std::numeric_limits<float>::infinity());
  CHECK(float(F::from_bits(0xfc)) == -std::numeric_limits<float>::infinity());
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += is_nan_code<F>(std::uint8_t(c));
  CHECK(nans == 6);
  CHECK(std::numeric_limits<F>::has_infinity);
  CHECK(float(std::numeric_limits<F>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(float(std::numeric_limits<F>::epsilon()) == 0.25f);
  check_every_code_round_trips<F>();

  CHECK(float(F(1.125f)) == 1.f);   // halfway 1 | 1.25: to even
  CHECK(float(F(1.375f)) == 1.5f);  // halfway 1.25 | 1.5: to even
  CHECK(float(F(-0.3f)) == -0.3125f);
  const float q = std::ldexp(1.f, -16);
  CHECK(float(F(0.5f * q)) == 0.f);
  CHECK(float(F(1.5f * q)) == 2 * q);
  CHECK(F(3.5f * q).bits == 0x04);      // into the smallest normal
  CHECK(float(F(61440.f)) == 57344.f);  // halfway 57344 | inf: saturated
  CHECK(float(F(1e10f)) == 57344.f);
  CHECK(float(F(std::numeric_limits<float>::infinity())) == 57344.f);
  CHECK(float(F(-std::numeric_limits<float>::infinity())) == -57344.f);
  CHECK(F(std::numeric_limits<float>::quiet_NaN()).bits == 0x7f);
}

TEST_CASE("FP8 conversion is the nearest value, ties to even, over a sweep of floats", "[core][fp8]") {
  // An independent oracle (nearest_code: brute force over the codes) against the bit-level
  // conversion, over random floats spanning both formats' ranges and their rounding boundaries.
  std::mt19937 gen(42);
  std::uniform_int_distribution<int> expo(-20, 17);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::size_t mismatches4 = 0, mismatches5 = 0;
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(mant(gen), expo(gen)) * (i % 2 ? -1.f : 1.f);
    if (i % 4 == 0) {  // exact midpoints between neighbouring E4M3 / E5M2 values
      const float a = float8_e4m3(x), b = float8_e4m3::from_bits(std::uint8_t(float8_e4m3(x).bits + 1));
      if (std::isfinite(b)) x = 0.5f * (a + b);
    }
    mismatches4 += float8_e4m3(x).bits != nearest_code<float8_e4m3>(x);
    mismatches5 += float8_e5m2(x).bits != nearest_code<float8_e5m2>(x);
  }
  CHECK(mismatches4 == 0);
  CHECK(mismatches5 == 0);
}

TEST_CASE("bfloat16 rounds to nearest even", "[core]") {
  CHECK(float(bfloat16(1.0f)) == 1.0f);
  CHECK(float(bfloat16(1.00390625f)) == 1.0f);      // halfway, rounds to even
  CHECK(float(bfloat16(1.01171875f)) == 1.015625f);  // halfway, rounds up to even
  CHECK(float(bfloat16(3.f) + bfloat16(4.f)) == 7.f);
  auto c = compare(full<bfloat16>(Shape<1>{3}, bfloat16(2.f)), full<bfloat16>(Shape<1>{3}, bfloat16(2.01f)), {.rtol = 1e-2});
  CHECK(c.ok);
}

TEST_CASE("compare reports where tensors differ", "[core]") {
  auto a = arange<double>(Shape<2>{2, 2});
  auto b = a;
  b(1, 1) += 1e-3;
  auto c = compare(a, b, {.rtol = 1e-6});
  CHECK_FALSE(c.ok);
  CHECK(c.where == 3);
  CHECK(compare(a, b, {.atol = 1e-2}).ok);
  CHECK_FALSE(compare(a, zeros<double>(Shape<2>{2, 3})).ok);
}

TEST_CASE("detail::cat writes each piece as std::ostream << piece does (text, integers, chars, bool, floats)",
          "[core]") {
  const auto streamed = [](const auto&... parts) {
    std::ostringstream s;
    (s << ... << parts);
    return s.str();
  };
  const char* text = "ptr";
  char arr[] = "arr";
  const std::string str = "str";
  const std::string_view view = "view";
  const std::int64_t neg = -5;
  const unsigned long big = 18446744073709551615ul;
  const short small = -3;
  const signed char sc = 'A';
  const unsigned char uc = 'B';
  const std::uint8_t u8 = 67;
  const Shape<2> shape{3, 4};
  const auto c = dtensor::detail::cat("lit ", text, arr, str, view, neg, big, 7, small, 'c', sc, uc, u8, true, false,
                                      1.0 / 3, 2.5f, 1e300, -0.0, bfloat16(1.5f), to_string(shape), ' ');
  CHECK(c == streamed("lit ", text, arr, str, view, neg, big, 7, small, 'c', sc, uc, u8, true, false, 1.0 / 3, 2.5f,
                      1e300, -0.0, bfloat16(1.5f), to_string(shape), ' '));
  CHECK(c.starts_with("lit ptrarrstrview-5184467440737095516157-3cABC10"));
  CHECK(dtensor::detail::cat() == "");
}

TEST_CASE("detail::check throws detail::cat's message of its pieces, naming the op and the rank", "[core]") {
  struct Where {
    int rank() const { return 3; }
  };
  const char* null_text = nullptr;
  const Shape<2> shape{3, 4};
  const auto message_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  CHECK(message_of([&] { dtensor::detail::check(true, "op", "never ", to_string(shape)); }) == "no throw");
  CHECK(message_of([&] {
          dtensor::detail::check(false, "op", "a ", to_string(shape), " b ", null_text, -7, " ", 0.5, bfloat16(1.5f));
        }) == "dtensor: op: a " + to_string(shape) + " b -7 0.51.5");
  CHECK(message_of([&] { dtensor::detail::check(false, "op", Where{}, "at ", std::size_t(9)); }) ==
        "dtensor: op on rank 3: at 9");
  CHECK(message_of([&] { dtensor::detail::check(false, "op"); }) == "dtensor: op: ");
}

}  // namespace test_tensor
