// dtensor/kernels/host/simd.hpp — runtime instruction-set dispatch for the host kernels, and the
// vectorizable float math (exp, tanh) they share.
//
//   detail::with_isa([&](auto isa) DTENSOR_SIMD_BODY { for (...) y[i] = detail::fast_tanh(x[i]); });
//   host_isa()                         // the instruction set the kernels run: avx512, avx2 or baseline
//   isa_name(host_isa())               // "avx512", "avx2", "baseline"
//   DTENSOR_HOST_ISA=baseline|avx2|avx512|amx   // environment: cap the choice (avx512: no AMX tiles for
//                                               // the bf16 GEMMs, blas_core.hpp; amx: no cap, as unset)
//   set_host_isa_cap(Isa::baseline)    // the same from code (tests and benchmarks run every path)
//
// Why this way (docs/host-kernels.md): the library is header-only and built without -march, so
// a kernel's loop is stamped out three times by templates carrying GCC/Clang `target` attributes
// (x86-64 baseline, AVX2+FMA, AVX-512) and picked once per process from cpuid. The body is a
// lambda marked always_inline: inlined into each target-attributed instance, it is vectorized
// for that instance's instruction set (a callee may be inlined into a caller whose ISA is a
// superset). Everything a body calls in its inner loop must be always_inline too (fast_exp,
// fast_tanh below), or it runs as baseline code. Loops are written so that the vectorizer needs
// no reassociation (no -ffast-math): reductions go through kLanes-wide GCC vector types
// (lane_dot, lane_max), which also fixes the summation order, so every ISA sums alike.
//
// Other compilers and non-x86 targets get the baseline instance only (a correct fallback).
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "dtensor/core/bfloat16.hpp"
#include "dtensor/core/error.hpp"

namespace dtensor::kernels::host {

enum class Isa { baseline, avx2, avx512 };

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "baseline";
  }
}

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && !defined(__CUDACC__)
#define DTENSOR_HOST_MULTI_ISA 1
#define DTENSOR_SIMD_BODY __attribute__((always_inline))
#define DTENSOR_SIMD_INLINE __attribute__((always_inline)) inline
#else
#define DTENSOR_HOST_MULTI_ISA 0
#define DTENSOR_SIMD_BODY
#define DTENSOR_SIMD_INLINE inline
#endif

namespace detail {

/// DTENSOR_HOST_ISA's cap for these kernels: baseline, avx2 or avx512 (no cap), the last also when
/// it is unset and for amx (which only the bf16 GEMMs tell from avx512: blas_core.hpp). Any other
/// spelling ("AVX2", "sse", "") is an Error naming the variable, not silently no cap.
inline Isa isa_cap_from_env() {
  const char* text = std::getenv("DTENSOR_HOST_ISA");
  if (!text) return Isa::avx512;
  const std::string_view c(text);
  if (c == "baseline") return Isa::baseline;
  if (c == "avx2") return Isa::avx2;
  if (c == "avx512" || c == "amx") return Isa::avx512;
  throw Error("DTENSOR_HOST_ISA", dtensor::detail::cat("'", c, "' is not baseline, avx2, avx512 or amx"));
}

/// The best instruction set of this CPU, capped by DTENSOR_HOST_ISA when set.
inline Isa detect_isa() {
  const Isa cap = isa_cap_from_env();  // checked on every platform, used where there is a choice
#if DTENSOR_HOST_MULTI_ISA
  __builtin_cpu_init();
  Isa best = Isa::baseline;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::avx2;
  if (best == Isa::avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    best = Isa::avx512;
  if (int(cap) < int(best)) best = cap;
  return best;
#else
  (void)cap;
  return Isa::baseline;
#endif
}

}  // namespace detail

namespace detail {
inline std::atomic<int>& isa_cap() {
  static std::atomic<int> cap{int(Isa::avx512)};
  return cap;
}
}  // namespace detail

/// The best instruction set of this CPU (capped by DTENSOR_HOST_ISA; detected once per process).
inline Isa detected_host_isa() {
  static const Isa isa = detail::detect_isa();
  return isa;
}

/// The instruction set the host kernels run: the detected one, capped by set_host_isa_cap.
inline Isa host_isa() {
  const int cap = detail::isa_cap().load(std::memory_order_relaxed);
  const Isa best = detected_host_isa();
  return int(best) < cap ? best : Isa(cap);
}

/// Caps the instruction set of later kernel calls (process-wide; for tests and benchmarks that
/// compare the paths). Isa::avx512 removes the cap.
inline void set_host_isa_cap(Isa cap) { detail::isa_cap().store(int(cap), std::memory_order_relaxed); }

namespace detail {

/// Lanes of the fixed-width partial sums: a multiple of every vector width used (16 floats =
/// one AVX-512 register, 8 doubles = one; two AVX2 registers), so every ISA sums alike.
inline constexpr int kLanes = 16;

template <Isa I>
struct IsaTag {
  static constexpr Isa value = I;
};

#if DTENSOR_HOST_MULTI_ISA
// GCC tunes for 256-bit vectors unless told; Clang takes that as min_vector_width instead (it
// rejects the whole target string when it names prefer-vector-width).
#if defined(__clang__)
#define DTENSOR_AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"), min_vector_width(512)))
#else
#define DTENSOR_AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")))
#endif
template <class Body>
DTENSOR_AVX512_TARGET void run_avx512(Body& body) {
  body(IsaTag<Isa::avx512>{});
}
template <class Body>
__attribute__((target("avx2,fma"))) void run_avx2(Body& body) {
  body(IsaTag<Isa::avx2>{});
}
#endif

/// Runs body (a lambda marked DTENSOR_SIMD_BODY taking an IsaTag) compiled for the process's ISA.
template <class Body>
void with_isa(Body&& body) {
#if DTENSOR_HOST_MULTI_ISA
  switch (host_isa()) {
    case Isa::avx512: run_avx512(body); return;
    case Isa::avx2: run_avx2(body); return;
    default: break;
  }
#endif
  body(IsaTag<Isa::baseline>{});
}

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
/// kLanes floats / doubles as one GCC/Clang vector: element-wise arithmetic in a fixed order that
/// the compiler maps onto the instance's registers (one zmm, two ymm, four or eight xmm), which
/// the loop vectorizer does not reliably do for a reduction without -ffast-math.
using FloatLanes = float __attribute__((vector_size(4 * kLanes)));
using DoubleLanes = double __attribute__((vector_size(8 * kLanes)));

/// kLanes elements from p, widened to double (an out-parameter: a vector returned by value in a
/// baseline function would change the ABI, which Clang warns about).
template <class T>
DTENSOR_SIMD_INLINE void load_lanes(const T* p, DoubleLanes& out) {
  if constexpr (std::is_same_v<T, double>) {
    std::memcpy(&out, p, sizeof out);
  } else {
    FloatLanes v;
    std::memcpy(&v, p, sizeof v);
    out = __builtin_convertvector(v, DoubleLanes);
  }
}

/// Sum of a[j] * b[j] (b == nullptr: of a[j]) in double: kLanes partial sums, then the lanes in
/// order — the same bits on every ISA. Call inside a with_isa body.
template <class A, class B>
DTENSOR_SIMD_INLINE double lane_dot(const A* a, const B* b, long n) {
  DoubleLanes acc = {};
  long j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    DoubleLanes va, vb;
    load_lanes(a + j, va);
    if (b) {
      load_lanes(b + j, vb);
      va *= vb;
    }
    acc += va;
  }
  for (int l = 0; j < n; ++j, ++l) acc[l] += double(a[j]) * (b ? double(b[j]) : 1.0);
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

/// Largest element of a float row (-inf when empty; NaNs ignored as std::max(m, x) does).
DTENSOR_SIMD_INLINE float lane_max(const float* a, long n) {
  constexpr float lowest = -__builtin_inff();
  FloatLanes acc = lowest - FloatLanes{};
  long j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    FloatLanes v;
    std::memcpy(&v, a + j, sizeof v);
    acc = acc < v ? v : acc;
  }
  float m = lowest;
  for (; j < n; ++j) m = m < a[j] ? a[j] : m;
  for (int l = 0; l < kLanes; ++l) m = m < acc[l] ? acc[l] : m;
  return m;
}
#else
// nvcc's front end does not take GCC vector types (it crashes on them): the same sums over plain
// lane arrays — the same order, so the same bits (these run on the host only; no ISA dispatch
// under nvcc).
template <class A, class B>
inline double lane_dot(const A* a, const B* b, long n) {
  double acc[kLanes] = {};
  long j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += double(a[j + l]) * (b ? double(b[j + l]) : 1.0);
  for (int l = 0; j < n; ++j, ++l) acc[l] += double(a[j]) * (b ? double(b[j]) : 1.0);
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}
inline float lane_max(const float* a, long n) {
  float m = -__builtin_inff();
  for (long j = 0; j < n; ++j) m = m < a[j] ? a[j] : m;
  return m;
}
#endif

/// exp(x) in float: Cody-Waite reduction x = n ln2 + r, a degree-6 polynomial for e^r on
/// |r| <= ln2 / 2, and 2^n through the exponent bits. Relative error a few ulp over
/// [-87.3, 88.3]; below it gives 0 (exp(-inf) = 0, as masking needs), above it saturates at
/// exp(88.3) (no inf: 2^n must stay a normal float).
/// Branch-free, so loops over it vectorize.
/// c ? a : b by bit masks. Why not the ternary: GCC moves a floating-point operation that follows
/// a float select into the select's branches, and under -ftrapping-math (the default) will not
/// speculate it back, so the loop keeps a branch and is not vectorized — on the AVX2 and baseline
/// instances (AVX-512's masked operations escape it). Integer masks cannot trap: the same bits,
/// vectorized on every ISA (fast_exp's scalar GELU was 22 % of an AVX2 CPU's step, docs/benchmarks.md).
DTENSOR_SIMD_INLINE float select_bits(bool c, float a, float b) {
  const std::int32_t m = -std::int32_t(c);
  return std::bit_cast<float>((std::bit_cast<std::int32_t>(a) & m) | (std::bit_cast<std::int32_t>(b) & ~m));
}

DTENSOR_SIMD_INLINE float fast_exp(float x) {
  x = select_bits(x < -87.3f, -87.3f, x);  // the range, as x < lo ? lo : (x > hi ? hi : x)
  x = select_bits(x > 88.3f, 88.3f, x);
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + round_magic;
  const float n = t - round_magic;
  float r = x - n * 0.693359375f;  // ln2 split in a short high part and the rest (Cody-Waite)
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t bits = (std::bit_cast<std::int32_t>(t) - std::bit_cast<std::int32_t>(round_magic) + 127) << 23;
  const float result = p * std::bit_cast<float>(bits);
  return select_bits(x <= -87.3f, 0.0f, result);
}

/// The element types whose row kernels run the vectorized float code: float, and bfloat16 widened
/// to float (exact), computed as float and rounded once on store — compute_t's contract.
template <class T>
inline constexpr bool float_rows = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;

/// A row of T as float: the row itself for float, else widened into `scratch` (n floats; exact).
/// Call inside a with_isa body (the widening vectorizes there).
template <class T>
DTENSOR_SIMD_INLINE const float* float_row(const T* __restrict p, float* __restrict scratch, long n) {
  if constexpr (std::is_same_v<T, float>) {
    return p;
  } else {
    for (long j = 0; j < n; ++j) scratch[j] = float(p[j]);
    return scratch;
  }
}
/// Where a float kernel writes a row of T: the row itself for float, else `scratch`, which
/// round_row() then stores.
template <class T>
DTENSOR_SIMD_INLINE float* float_out(T* p, float* scratch) {
  if constexpr (std::is_same_v<T, float>) return p;
  else return scratch;
}
/// Stores the float row that float_out() handed out into p, rounded once (nothing for float).
template <class T>
DTENSOR_SIMD_INLINE void round_row(const float* __restrict s, T* __restrict p, long n) {
  if constexpr (!std::is_same_v<T, float>)
    for (long j = 0; j < n; ++j) p[j] = T(s[j]);
}

/// tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error ~1e-7 (what GELU needs; not relative near 0).
DTENSOR_SIMD_INLINE float fast_tanh(float x) { return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f); }

}  // namespace detail
}  // namespace dtensor::kernels::host
