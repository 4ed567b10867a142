// dtensor/core/float8.hpp — the two 8-bit floating-point storage types of FP8 training.
//
//   float8_e4m3 a(3.3f);          // 3.25: E4M3FN, bias 7, max 448, no infinities
//   float8_e5m2 g(-1e6f);         // -57344: E5M2, bias 15, IEEE-like, saturated
//   float(a);                     // exact: every code is a float
//   float8_e4m3::from_bits(0x7e)  // 448
//
// The formats are those of the OCP 8-bit floating point specification (OFP8, rev. 1.0) and of
// NVIDIA's tensor cores (sm_89/sm_90, CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2):
//
//   E4M3 (E4M3FN): S.EEEE.MMM, bias 7, subnormals, no infinities; S.1111.111 is NaN, so the
//                  largest value is S.1111.110 = 1.75 * 2^8 = 448; min normal 2^-6, min
//                  subnormal 2^-9.
//   E5M2:          S.EEEEE.MM, bias 15, IEEE-754 style: exponent 11111 is inf (mantissa 0) or
//                  NaN; max 1.75 * 2^15 = 57344; min normal 2^-14, min subnormal 2^-16.
//
// Conversion from float is NVIDIA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...), the
// conversion cuBLASLt and Transformer Engine quantize with (PTX cvt.rn.satfinite.{e4m3,e5m2}x2):
// round to nearest, ties to even, then saturate: a finite value that rounds beyond the largest
// one, and an infinity, become +-max (so E5M2 never produces inf from a conversion); every NaN
// becomes the positive NaN 0x7f (CUDA's host path canonicalises the NaN, dropping its sign); a
// value at or below half the smallest subnormal becomes a zero of its sign. The conversion is
// bit for bit that of CUDA's <cuda_fp8.hpp> (checked over every float, docs/fp8.md).
//
// These are storage types, not Elements (core/dtype.hpp): no Tensor, DTensor or collective
// holds FP8. FP8 values exist inside an FP8 GEMM (kernels/host/gemm_fp8.hpp), quantized from a
// float or bfloat16 tensor with a per-tensor scale (nn/fp8_recipe.hpp).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <ostream>

namespace dtensor {

namespace detail {

/// An FP8 format: exponent bits, mantissa bits, and whether it is "finite" (E4M3FN: the top
/// exponent holds normal values; only all-ones is NaN) or IEEE-like (E5M2: top exponent is inf/NaN).
template <int ExpBits, int ManBits, bool FiniteOnly>
struct Fp8Format {
  static constexpr int exp_bits = ExpBits, man_bits = ManBits;
  static constexpr bool finite_only = FiniteOnly;
  static constexpr int bias = (1 << (ExpBits - 1)) - 1;
  static constexpr int emin = 1 - bias;  // exponent of the smallest normal
  // The largest finite value's exponent field and mantissa.
  static constexpr std::uint32_t max_exp_field = FiniteOnly ? (1u << ExpBits) - 1 : (1u << ExpBits) - 2;
  static constexpr std::uint32_t max_mantissa = FiniteOnly ? (1u << ManBits) - 2 : (1u << ManBits) - 1;
  static constexpr std::uint8_t max_code = std::uint8_t((max_exp_field << ManBits) | max_mantissa);
  static constexpr std::uint8_t nan_code = 0x7f;  // E4M3: S.1111.111; E5M2: a quiet NaN
};

using E4M3 = Fp8Format<4, 3, true>;
using E5M2 = Fp8Format<5, 2, false>;

/// Round-to-nearest-even of m / 2^s (s in 1..31).
constexpr std::uint32_t round_shift_rne(std::uint32_t m, int s) {
  const std::uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

/// float -> FP8 code: round to nearest even, saturate to +-max, NaN -> 0x7f (see the synopsis).
template <class F>
constexpr std::uint8_t float_to_fp8(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return F::nan_code;
  if (a == 0x7f800000u) return std::uint8_t(sign | F::max_code);  // satfinite: inf -> max
  const int e = int(a >> 23) - 127;
  if (e < -126) return sign;  // zero or a float subnormal: far below half the smallest FP8 subnormal
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;  // 24-bit significand, value m * 2^(e-23)
  if (e < F::emin) {
    // Subnormal range: quantum 2^(emin - M). The rounded count is the code itself (a count of
    // 2^M, rounded up from below, is exponent field 1, mantissa 0: the smallest normal).
    const int s = 23 - F::man_bits + (F::emin - e);
    if (s > 31) return sign;
    return std::uint8_t(sign | round_shift_rne(m, s));
  }
  std::uint32_t r = round_shift_rne(m, 23 - F::man_bits);  // in [2^M, 2^(M+1)]
  int ef = e + F::bias;
  if (r == (1u << (F::man_bits + 1))) {
    r >>= 1;
    ++ef;
  }
  const std::uint32_t mant = r - (1u << F::man_bits);
  if (ef > int(F::max_exp_field) || (ef == int(F::max_exp_field) && mant > F::max_mantissa))
    return std::uint8_t(sign | F::max_code);  // satfinite
  return std::uint8_t(sign | (std::uint32_t(ef) << F::man_bits) | mant);
}

/// FP8 code -> float, exact.
template <class F>
constexpr float fp8_to_float(std::uint8_t code) {
  const std::uint32_t sign = std::uint32_t(code & 0x80u) << 24;
  const std::uint32_t ef = (code & 0x7fu) >> F::man_bits, mant = code & ((1u << F::man_bits) - 1u);
  if constexpr (F::finite_only) {
    if ((code & 0x7fu) == 0x7fu) return std::bit_cast<float>(sign | 0x7fc00000u);
  } else {
    if (ef == (1u << F::exp_bits) - 1u) return std::bit_cast<float>(sign | (mant == 0 ? 0x7f800000u : 0x7fc00000u));
  }
  if (ef == 0) {
    // mant * 2^(emin - M): an exact product (mant < 2^M, the power of two a normal float).
    const float quantum = std::bit_cast<float>(std::uint32_t(127 + F::emin - F::man_bits) << 23);
    const float v = float(mant) * quantum;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((ef - F::bias + 127) << 23) | (mant << (23 - F::man_bits)));
}

}  // namespace detail

/// One byte holding an FP8 value of Format (detail::E4M3 or detail::E5M2).
template <class Format>
struct float8 {
  using format = Format;
  std::uint8_t bits = 0;

  constexpr float8() = default;
  constexpr float8(float f) : bits(detail::float_to_fp8<Format>(f)) {}  // NOLINT: implicit like bfloat16
  constexpr operator float() const { return detail::fp8_to_float<Format>(bits); }

  static constexpr float8 from_bits(std::uint8_t b) {
    float8 r;
    r.bits = b;
    return r;
  }
  /// The largest finite value (448 for E4M3, 57344 for E5M2): fp8_max of the scaling recipe.
  static constexpr float max_value() { return detail::fp8_to_float<Format>(Format::max_code); }

  friend constexpr bool operator==(float8 a, float8 b) { return float(a) == float(b); }
  friend std::ostream& operator<<(std::ostream& os, float8 v) { return os << float(v); }
};

/// E4M3FN: forward tensors (activations, weights) in FP8 training.
using float8_e4m3 = float8<detail::E4M3>;
/// E5M2: gradients (wider range, one mantissa bit less).
using float8_e5m2 = float8<detail::E5M2>;

static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1, "FP8 types must be one byte");
static_assert(float8_e4m3::max_value() == 448.f && float8_e5m2::max_value() == 57344.f);

}  // namespace dtensor

template <class Format>
class std::numeric_limits<dtensor::float8<Format>> {
  using T = dtensor::float8<Format>;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = !Format::finite_only;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_denorm_loss = false;
  static constexpr int digits = Format::man_bits + 1;
  static constexpr T max() { return T::from_bits(Format::max_code); }
  static constexpr T lowest() { return T::from_bits(std::uint8_t(0x80u | Format::max_code)); }
  static constexpr T min() { return T::from_bits(std::uint8_t(1u << Format::man_bits)); }  // smallest normal
  static constexpr T denorm_min() { return T::from_bits(0x01); }
  static constexpr T epsilon() {
    return T::from_bits(std::uint8_t(std::uint32_t(Format::bias - Format::man_bits) << Format::man_bits));
  }
  static constexpr T infinity() { return Format::finite_only ? T() : T::from_bits(0x7c); }  // T() as for ints
  static constexpr T quiet_NaN() { return T::from_bits(Format::nan_code); }
};
