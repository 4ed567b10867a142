// dtensor/core/bfloat16.hpp — the bfloat16 storage type (8 exponent bits, 7 mantissa bits).
//
// Arithmetic converts to float and back with round-to-nearest-even, the rounding of every
// hardware bf16 unit, so host results match what a GPU produces element for element.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <ostream>

namespace dtensor {

struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() = default;
  constexpr bfloat16(float f) : bits(round_to_bf16(f)) {}  // NOLINT: implicit like a builtin
  constexpr operator float() const { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

  static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 r;
    r.bits = b;
    return r;
  }

  friend constexpr bool operator==(bfloat16 a, bfloat16 b) { return float(a) == float(b); }
  friend constexpr auto operator<=>(bfloat16 a, bfloat16 b) { return float(a) <=> float(b); }
  friend constexpr bfloat16 operator+(bfloat16 a, bfloat16 b) { return float(a) + float(b); }
  friend constexpr bfloat16 operator-(bfloat16 a, bfloat16 b) { return float(a) - float(b); }
  friend constexpr bfloat16 operator*(bfloat16 a, bfloat16 b) { return float(a) * float(b); }
  friend constexpr bfloat16 operator/(bfloat16 a, bfloat16 b) { return float(a) / float(b); }
  constexpr bfloat16& operator+=(bfloat16 o) { return *this = *this + o; }
  constexpr bfloat16& operator-=(bfloat16 o) { return *this = *this - o; }
  constexpr bfloat16& operator*=(bfloat16 o) { return *this = *this * o; }
  constexpr bfloat16& operator/=(bfloat16 o) { return *this = *this / o; }
  constexpr bfloat16 operator-() const { return from_bits(bits ^ 0x8000u); }
  friend std::ostream& operator<<(std::ostream& os, bfloat16 v) { return os << float(v); }

 private:
  static constexpr std::uint16_t round_to_bf16(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
      return std::uint16_t((u >> 16) | 0x40u);  // keep NaN a (quiet) NaN
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return std::uint16_t((u + rounding) >> 16);
  }
};

static_assert(sizeof(bfloat16) == 2, "bfloat16 must be two bytes");

}  // namespace dtensor

template <>
class std::numeric_limits<dtensor::bfloat16> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr dtensor::bfloat16 lowest() { return dtensor::bfloat16::from_bits(0xff7f); }
  static constexpr dtensor::bfloat16 max() { return dtensor::bfloat16::from_bits(0x7f7f); }
  static constexpr dtensor::bfloat16 min() { return dtensor::bfloat16::from_bits(0x0080); }
  static constexpr dtensor::bfloat16 infinity() { return dtensor::bfloat16::from_bits(0x7f80); }
  static constexpr dtensor::bfloat16 quiet_NaN() { return dtensor::bfloat16::from_bits(0x7fc0); }
  static constexpr dtensor::bfloat16 epsilon() { return dtensor::bfloat16::from_bits(0x3c00); }
};
