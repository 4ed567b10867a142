// GEMM, matmul, bmm and linear on host: against naive double loops, the portable path against
// CBLAS (when built with it), backwards against finite differences, and shape errors.
#include "test_kernels_host_util.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/kernels/host/gemm_fp8.hpp"
#include "dtensor/kernels/host/matmul.hpp"
#include "dtensor/nn/fp8_recipe.hpp"

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_kernels_host_gemm {

using namespace dtensor;
namespace kh = dtensor::kernels::host;

namespace {

struct Case {
  Extent m, n, k;
};

/// Stored operand of op extents [r, c] (stored transposed when trans), row pitch = cols + pad.
template <class T>
std::vector<T> make_operand(Extent r, Extent c, bool trans, Extent pad, std::uint64_t seed, Extent& ld) {
  const Extent sr = trans ? c : r, sc = trans ? r : c;
  ld = std::max<Extent>(1, sc + pad);
  auto vals = uniform<double>(Shape<1>{std::max<Extent>(1, sr * ld)}, seed, -1, 1);
  std::vector<T> v(std::size_t(std::max<Extent>(1, sr * ld)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = T(vals[Extent(i)]);
  return v;
}

template <class T>
T at(const std::vector<T>& a, bool trans, Extent ld, Extent i, Extent j) {
  return trans ? a[std::size_t(j * ld + i)] : a[std::size_t(i * ld + j)];
}

/// Runs gemm_fn on random operands and compares with a double loop; returns max error / bound.
template <class T, class Gemm>
void check_gemm(Gemm gemm_fn, Case cs, bool ta, bool tb, double alpha, double beta, double tol) {
  const auto [m, n, k] = cs;
  Extent lda, ldb;
  auto A = make_operand<T>(m, k, ta, 3, 1, lda);
  auto B = make_operand<T>(k, n, tb, 2, 2, ldb);
  const Extent ldc = std::max<Extent>(1, n + 1);
  std::vector<T> C(std::size_t(std::max<Extent>(1, m * ldc)));
  for (std::size_t i = 0; i < C.size(); ++i) C[i] = beta == 0 ? std::numeric_limits<T>::quiet_NaN() : T(0.25 * double(i % 7) - 0.5);
  const std::vector<T> C0 = C;
  gemm_fn(ta, tb, T(alpha), A.data(), B.data(), T(beta), C.data(), m, n, k, lda, ldb, ldc);
  double worst = 0;
  for (Extent i = 0; i < m; ++i)
    for (Extent j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (Extent p = 0; p < k; ++p) {
        const double x = double(at(A, ta, lda, i, p)) * double(at(B, tb, ldb, p, j));
        s += x;
        mag += std::abs(x);
      }
      const double c0 = beta == 0 ? 0.0 : double(C0[std::size_t(i * ldc + j)]);
      const double ref = alpha * s + beta * c0;
      const double err = std::abs(double(C[std::size_t(i * ldc + j)]) - ref) / (std::abs(alpha) * mag + std::abs(beta * c0) + 1e-30);
      worst = std::max(worst, std::isnan(err) ? 1e30 : err);
    }
  // The padding column of C is never written.
  for (Extent i = 0; i < m; ++i)
    if (ldc > n) CHECK((std::isnan(double(C0[std::size_t(i * ldc + n)])) ? std::isnan(double(C[std::size_t(i * ldc + n)])) : C[std::size_t(i * ldc + n)] == C0[std::size_t(i * ldc + n)]));
  INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " alpha=" << alpha << " beta=" << beta);
  CHECK(worst <= tol);
}

const std::vector<Case> cases = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {70, 37, 300}, {5, 1100, 3}, {4, 3, 0}, {0, 3, 4}};

}  // namespace

TEMPLATE_TEST_CASE("gemm matches a double loop for every transpose, alpha, beta", "[kernels][gemm]", float, double) {
  const double tol = std::is_same_v<TestType, float> ? 1e-5 : 1e-13;
  for (const auto& cs : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.7, -0.3}, std::pair{0.0, 2.0}}) {
          check_gemm<TestType>(kh::gemm<TestType>, cs, ta, tb, alpha, beta, tol);
          check_gemm<TestType>(kh::detail::gemm_portable<TestType>, cs, ta, tb, alpha, beta, tol);
        }
}

TEST_CASE("gemm through CBLAS equals the portable loop", "[kernels][gemm]") {
  INFO("built with CBLAS: " << kh::has_cblas());
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Extent m = 67, n = 129, k = 301;
      auto a = uniform<float>(Shape<2>{ta ? k : m, ta ? m : k}, 3, -1, 1);
      auto b = uniform<float>(Shape<2>{tb ? n : k, tb ? k : n}, 4, -1, 1);
      Tensor<float, 2> c1(Shape<2>{m, n}), c2(Shape<2>{m, n});
      kh::gemm<float>(ta, tb, 1.f, a.data(), b.data(), 0.f, c1.data(), m, n, k, a.extent(1), b.extent(1), n);
      kh::detail::gemm_portable<float>(ta, tb, 1.f, a.data(), b.data(), 0.f, c2.data(), m, n, k, a.extent(1), b.extent(1), n);
      const auto d = compare(c1, c2, {.rtol = 1e-5, .atol = 1e-5});
      INFO(d.message);
      CHECK(d.ok);
      if (!kh::has_cblas()) CHECK(equal(c1, c2));
    }
}

TEMPLATE_TEST_CASE("gemm on intra-op threads gives the one-thread bits, split by C's rows", "[kernels][gemm]", float,
                   double) {
  // With a pool (IntraOpThreads) and a one-thread BLAS a large GEMM runs as one BLAS call per
  // block of C's rows, also where n > m; each element is still one sum over all of k.
  // Shapes: the models' (1024 tokens; y = x W^T, dx = dy W, dW = dy^T x, fc2's dW with n > m),
  // uneven extents whose blocks do not divide, pitches above the extents, and ones too small to
  // split. (A Zen 3's OpenBLAS failed the first with blocks at multiples of 16 rows, and the third
  // when n > m split C's columns: kernels/host/gemm.hpp, split_block_align.)
  const std::vector<Case> shapes = {{1024, 512, 128},  {512, 128, 1024}, {333, 1025, 97}, {1000, 77, 301},
                                    {384, 1536, 1024}, {130, 2000, 40},  {64, 64, 64},    {7, 900, 900}};
  for (const auto& cs : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.5, 0.75}}) {
          const auto [m, n, k] = cs;
          Extent lda, ldb;
          const auto A = make_operand<TestType>(m, k, ta, 3, 31, lda);
          const auto B = make_operand<TestType>(k, n, tb, 1, 32, ldb);
          const Extent ldc = n + 2;
          std::vector<TestType> C0(std::size_t(m * ldc));
          for (std::size_t i = 0; i < C0.size(); ++i) C0[i] = TestType(0.125 * double(i % 11) - 0.5);
          auto one = C0;
          kh::gemm<TestType>(ta, tb, TestType(alpha), A.data(), B.data(), TestType(beta), one.data(), m, n, k, lda, ldb,
                             ldc);
          for (int threads : {2, 3}) {
            kh::IntraOpThreads scope(threads);
            auto split = C0;
            kh::gemm<TestType>(ta, tb, TestType(alpha), A.data(), B.data(), TestType(beta), split.data(), m, n, k, lda,
                               ldb, ldc);
            INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " beta=" << beta
                      << " threads=" << threads);
            REQUIRE(std::memcmp(one.data(), split.data(), one.size() * sizeof(TestType)) == 0);  // padding too
          }
        }
#ifdef DTENSOR_HAS_CBLAS
  // Which of them split (so that the comparison above compared split runs): the models' shapes on
  // 2 and 3 threads, not the small ones, not without a pool.
  auto splits = [](Case cs, int threads) {
    const auto [m, n, k] = cs;
    std::vector<TestType> a(std::size_t(m * k), TestType(1)), b(std::size_t(k * n), TestType(1)), c(std::size_t(m * n));
    std::optional<kh::IntraOpThreads> scope;
    if (threads > 1) scope.emplace(threads);
    return kh::detail::cblas_gemm_split<TestType>(false, false, TestType(1), a.data(), b.data(), TestType(0), c.data(),
                                                  m, n, k, k, n, n);
  };
  CHECK(splits({1024, 512, 128}, 2));
  CHECK(splits({512, 128, 1024}, 3));
  CHECK(splits({333, 1025, 97}, 2));  // n > m: by rows too
  CHECK(splits({384, 1536, 1024}, 3));
  CHECK_FALSE(splits({130, 2000, 40}, 2));  // fewer rows than two blocks of 96; columns are never split
  CHECK_FALSE(splits({1024, 512, 128}, 1));
  CHECK_FALSE(splits({64, 64, 64}, 2));
  CHECK_FALSE(splits({7, 900, 900}, 2));
#endif
}

TEST_CASE("the portable gemm is deterministic", "[kernels][gemm]") {
  auto a = normal<float>(Shape<2>{45, 300}, 5), b = normal<float>(Shape<2>{300, 70}, 6);
  Tensor<float, 2> c1(Shape<2>{45, 70}), c2(Shape<2>{45, 70});
  kh::detail::gemm_portable<float>(false, false, 1.f, a.data(), b.data(), 0.f, c1.data(), 45, 70, 300, 300, 70, 70);
  kh::detail::gemm_portable<float>(false, false, 1.f, a.data(), b.data(), 0.f, c2.data(), 45, 70, 300, 300, 70, 70);
  CHECK(equal(c1, c2));
}

TEST_CASE("bfloat16 gemm multiplies in float and rounds once", "[kernels][gemm]") {
  auto a = kt::cast<dtensor::bfloat16>(uniform<double>(Shape<2>{9, 13}, 7, -1, 1));
  auto b = kt::cast<dtensor::bfloat16>(uniform<double>(Shape<2>{11, 13}, 8, -1, 1));  // used transposed
  auto c = kh::matmul(a, b, false, true);
  REQUIRE(c.shape() == Shape<2>{9, 11});
  for (Extent i = 0; i < 9; ++i)
    for (Extent j = 0; j < 11; ++j) {
      float s = 0;
      for (Extent p = 0; p < 13; ++p) s += float(a(i, p)) * float(b(j, p));
      CHECK(std::abs(float(c(i, j)) - s) <= 1e-2f * (1 + std::abs(s)));
    }
}

// ---- bf16 kernels (kernels/host/gemm_bf16.hpp; issue 46) -------------------------------------

namespace {

using Bf16 = dtensor::bfloat16;
using Bf16GemmFn = void (*)(bool, bool, Bf16, const Bf16*, const Bf16*, Bf16, Bf16*, Extent, Extent, Extent, Extent,
                            Extent, Extent);

struct Bf16Variant {
  kh::Bf16Gemm kind;
  Bf16GemmFn fn;
  bool available;  // on this CPU (and, for AMX, with the OS's permission)
};

std::vector<Bf16Variant> bf16_variants() {
  const auto cpu = kh::detail::cpu_blas_features();
  const bool bf16 = cpu.level == kh::detail::BlasLevel::avx512 && cpu.avx512_bf16;
  std::vector<Bf16Variant> v{{kh::Bf16Gemm::widen_sgemm, kh::detail::gemm_bf16_widen, true}};
#if DTENSOR_HOST_MULTI_ISA
  v.push_back({kh::Bf16Gemm::avx512_bf16, kh::detail::gemm_bf16_avx512, bf16});
  v.push_back({kh::Bf16Gemm::amx, kh::detail::gemm_bf16_amx, bf16 && cpu.amx && kh::detail::amx_permitted()});
#endif
  (void)bf16;
  return v;
}

/// One bf16 GEMM against the double sum of the bf16 inputs (alpha and beta as bf16 too). Bound: C
/// is the fp32 sum rounded to bf16 once, so |C - ref| <= 2^-8 |ref| (the rounding: half an ulp of
/// 8 significant bits) + k 2^-23 (|alpha| sum |a b| + |beta c|) (fp32 accumulation over k terms,
/// with room). Also: beta == 0 does not read C (NaN there), the pitch's padding is not written.
void check_bf16_gemm(const Bf16Variant& v, Case cs, bool ta, bool tb, double alpha_d, double beta_d) {
  const auto [m, n, k] = cs;
  Extent lda, ldb;
  auto A = make_operand<Bf16>(m, k, ta, 3, 11, lda);
  auto B = make_operand<Bf16>(k, n, tb, 5, 12, ldb);
  const Extent ldc = n + 2;
  std::vector<Bf16> C(std::size_t(std::max<Extent>(1, m * ldc)));
  for (std::size_t i = 0; i < C.size(); ++i)
    C[i] = beta_d == 0 ? Bf16(std::numeric_limits<float>::quiet_NaN()) : Bf16(float(0.25 * double(i % 7) - 0.5));
  const std::vector<Bf16> C0 = C;
  const Bf16 alpha{float(alpha_d)}, beta{float(beta_d)};
  v.fn(ta, tb, alpha, A.data(), B.data(), beta, C.data(), m, n, k, lda, ldb, ldc);
  double worst = 0;  // error / bound
  for (Extent i = 0; i < m; ++i) {
    for (Extent j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (Extent p = 0; p < k; ++p) {
        const double x = double(at(A, ta, lda, i, p)) * double(at(B, tb, ldb, p, j));
        s += x;
        mag += std::abs(x);
      }
      const double c0 = beta_d == 0 ? 0.0 : double(C0[std::size_t(i * ldc + j)]);
      const double ref = double(alpha) * s + double(beta) * c0;
      const double bound =
          std::ldexp(std::abs(ref), -8) +
          double(k + 2) * std::ldexp(std::abs(double(alpha)) * mag + std::abs(double(beta) * c0), -23) + 1e-30;
      const double err = std::abs(double(C[std::size_t(i * ldc + j)]) - ref) / bound;
      worst = std::max(worst, std::isnan(err) ? 1e30 : err);
    }
    for (Extent j = n; j < ldc; ++j)  // the pitch's padding keeps its bits
      CHECK(C[std::size_t(i * ldc + j)].bits == C0[std::size_t(i * ldc + j)].bits);
  }
  INFO(kh::bf16_gemm_name(v.kind) << ": m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
                                  << " alpha=" << alpha_d << " beta=" << beta_d << " worst error / bound " << worst);
  CHECK(worst <= 1.0);
}

}  // namespace

TEST_CASE("bf16 GEMM kernels (AMX, AVX512-BF16, widened sgemm) against a double sum of the bf16 inputs",
          "[kernels][gemm][bf16]") {
  const std::vector<Case> shapes = {{1, 1, 1},    {7, 13, 33},  {13, 7, 1},    {33, 100, 13},
                                    {100, 33, 7}, {1, 100, 64}, {100, 1, 100}, {70, 37, 300},
                                    {33, 65, 97}, {4, 3, 0},    {0, 3, 4},     {3, 0, 4}};
  for (const auto& v : bf16_variants()) {
    if (!v.available) {
      WARN("skipped: " << kh::bf16_gemm_name(v.kind) << " (this CPU or OS lacks it)");
      continue;
    }
    for (const auto& cs : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{1.0, 1.0}, std::pair{0.7, -0.3},
                                     std::pair{-1.5, 0.0}, std::pair{0.0, 2.0}})
            check_bf16_gemm(v, cs, ta, tb, alpha, beta);
  }
}

TEST_CASE("bf16 GEMM kernels: a row's or a column's values do not depend on how C is split", "[kernels][gemm][bf16]") {
  // Ranks hold uneven row (or column) blocks of the same product, and a rank's intra-op threads
  // split its rows: each output sums over k in one order. (300 rows: 10 blocks of 32, enough work
  // for parallel_for to split them.)
  const Extent m = 300, n = 70, k = 130;
  Extent lda, ldb;
  const auto A = make_operand<Bf16>(m, k, false, 0, 21, lda);
  const auto B = make_operand<Bf16>(k, n, true, 0, 22, ldb);
  for (const auto& v : bf16_variants()) {
    if (!v.available) continue;
    INFO(kh::bf16_gemm_name(v.kind));
    std::vector<Bf16> whole(m * n), parts(m * n);
    v.fn(false, true, Bf16(1.f), A.data(), B.data(), Bf16(0.f), whole.data(), m, n, k, lda, ldb, n);
    // rows 0 .. 37 and 37 .. 100; then columns 0 .. 45 and 45 .. 70 of rows 0 .. 37 again
    v.fn(false, true, Bf16(1.f), A.data(), B.data(), Bf16(0.f), parts.data(), 37, n, k, lda, ldb, n);
    v.fn(false, true, Bf16(1.f), A.data() + 37 * lda, B.data(), Bf16(0.f), parts.data() + 37 * n, m - 37, n, k, lda,
         ldb, n);
    for (std::size_t i = 0; i < whole.size(); ++i) REQUIRE(whole[i].bits == parts[i].bits);
    {
      kh::IntraOpThreads threads(3);
      std::fill(parts.begin(), parts.end(), Bf16(0.f));
      v.fn(false, true, Bf16(1.f), A.data(), B.data(), Bf16(0.f), parts.data(), m, n, k, lda, ldb, n);
      for (std::size_t i = 0; i < whole.size(); ++i) REQUIRE(whole[i].bits == parts[i].bits);
    }
    v.fn(false, true, Bf16(1.f), A.data(), B.data() + 45 * ldb, Bf16(0.f), parts.data() + 45, 37, n - 45, k, lda, ldb,
         n);
    for (std::size_t i = 0; i < whole.size(); ++i) REQUIRE(whole[i].bits == parts[i].bits);
  }
}

#if DTENSOR_HOST_MULTI_ISA
TEST_CASE("bf16 GEMM packing: every element of the stated tile layouts, zero padding included",
          "[kernels][gemm][bf16]") {
  // The packing (vector loads, pair interleaves, 16 x 16 transposes) against the layout formulas of
  // gemm_bf16.hpp, element by element, over sizes that end inside a tile, a pair of k and a
  // 16-lane half, with pitches; the packing buffers start full of a marker, so a missed store shows.
  const auto cpu = kh::detail::cpu_blas_features();
  if (!(cpu.level == kh::detail::BlasLevel::avx512 && cpu.avx512_bf16)) {
    WARN("skipped: this CPU lacks AVX512-BF16");
    return;
  }
  using kh::detail::kBf16TileK;
  using kh::detail::kBf16TileRows;
  constexpr std::uint16_t marker = 0xdead;
  for (Extent k : {1, 2, 31, 33, 70})
    for (Extent rows : {1, 17, 32, 45})
      for (bool trans : {false, true}) {
        INFO("k=" << k << " rows/columns=" << rows << " trans=" << trans);
        const Extent kp = kh::detail::round_up(k, kBf16TileK), chunks = kp / kBf16TileK;
        Extent lda, ldb;
        const auto A = make_operand<Bf16>(rows, k, trans, 3, 31, lda);  // op(A): [rows, k]
        const auto B = make_operand<Bf16>(k, rows, trans, 5, 32, ldb);  // op(B): [k, rows]
        // op(A): the 32-row block that starts at row 0 (and at 32 when there is one)
        for (Extent i0 = 0; i0 < rows; i0 += 32) {
          std::vector<std::uint16_t> out(std::size_t(32 * kp), marker);
          kh::detail::pack_a_bf16(trans, A.data(), lda, rows, k, kp, i0, out.data());
          for (Extent r = 0; r < 32; ++r)
            for (Extent p = 0; p < kp; ++p) {
              const Extent g = r / kBf16TileRows, c = p / kBf16TileK;
              const std::uint16_t want = i0 + r < rows && p < k ? at(A, trans, lda, i0 + r, p).bits : 0;
              const std::uint16_t got = out[std::size_t(
                  ((g * chunks + c) * kBf16TileRows + r % kBf16TileRows) * kBf16TileK + p % kBf16TileK)];
              if (got != want) FAIL_CHECK("op(A) row " << i0 + r << " k " << p << ": " << got << " != " << want);
            }
        }
        // op(B): all columns in one block (nb rounded up to 32), and the block that starts at column 16
        for (Extent j0 : {Extent(0), Extent(16)}) {
          if (j0 >= rows) continue;
          const Extent nb = kh::detail::round_up(rows - j0, 32);
          std::vector<std::uint16_t> out(std::size_t(nb * kp), marker);
          kh::detail::pack_b_bf16(trans, B.data(), ldb, rows, k, kp, j0, nb, out.data());
          for (Extent j = 0; j < nb; ++j)
            for (Extent p = 0; p < kp; ++p) {
              const Extent h = j / kBf16TileRows, c = p / kBf16TileK, q = (p % kBf16TileK) / 2;
              const std::uint16_t want = j0 + j < rows && p < k ? at(B, trans, ldb, p, j0 + j).bits : 0;
              const std::uint16_t got = out[std::size_t(((h * chunks + c) * kBf16TileRows + q) * kBf16TileK +
                                                        (j % kBf16TileRows) * 2 + p % 2)];
              if (got != want) FAIL_CHECK("op(B) k " << p << " column " << j0 + j << ": " << got << " != " << want);
            }
        }
      }
}
#endif

TEST_CASE("the bf16 GEMM kernel choice: the widest the CPU, the OS and DTENSOR_HOST_ISA allow",
          "[kernels][gemm][bf16]") {
  using K = kh::Bf16Gemm;
  kh::detail::CpuBlasFeatures spr;  // a Sapphire Rapids-class CPU
  spr.level = kh::detail::BlasLevel::avx512;
  spr.avx512_bf16 = spr.amx = true;
  CHECK(kh::detail::choose_bf16_gemm(spr, true, "") == K::amx);
  CHECK(kh::detail::choose_bf16_gemm(spr, true, "amx") == K::amx);
  CHECK(kh::detail::choose_bf16_gemm(spr, false, "") == K::avx512_bf16);  // the OS refused the tiles
  CHECK(kh::detail::choose_bf16_gemm(spr, true, "avx512") == K::avx512_bf16);
  CHECK(kh::detail::choose_bf16_gemm(spr, true, "avx2") == K::widen_sgemm);
  CHECK(kh::detail::choose_bf16_gemm(spr, true, "baseline") == K::widen_sgemm);
  kh::detail::CpuBlasFeatures cpl = spr;  // Cooper Lake / Zen 4: AVX512-BF16, no AMX
  cpl.amx = false;
  CHECK(kh::detail::choose_bf16_gemm(cpl, true, "") == K::avx512_bf16);
  kh::detail::CpuBlasFeatures skx = cpl;  // Skylake-X: AVX-512 without bf16
  skx.avx512_bf16 = false;
  CHECK(kh::detail::choose_bf16_gemm(skx, true, "") == K::widen_sgemm);
  CHECK(std::string(kh::bf16_gemm_name(K::amx)) == "AMX tiles");
}

namespace {
/// The flags of /proc/cpuinfo's first processor (what Linux says the CPU has and it supports), "" elsewhere.
std::string cpuinfo_flags() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return "";
  char line[8192];
  std::string flags;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "flags", 5) == 0) {
      flags = std::string(" ") + (std::strchr(line, ':') ? std::strchr(line, ':') + 1 : line) + " ";
      break;
    }
  std::fclose(f);
  for (char& c : flags)
    if (c == '\n' || c == '\t') c = ' ';
  return flags;
}
}  // namespace

// Fails when dispatch falls back silently: the kernel that runs must be the best this machine has,
// judged from Linux's own flags and a permission request made here, not from the code under test.
TEST_CASE("gemm<bfloat16> runs the best bf16 kernel this CPU and OS have (AMX where granted)",
          "[kernels][gemm][bf16]") {
  const std::string flags = cpuinfo_flags();
  if (flags.empty()) {
    WARN("skipped: " << "no /proc/cpuinfo (not Linux)");
    return;
  }
  if (const char* cap = std::getenv("DTENSOR_HOST_ISA"); cap && std::string(cap) != "amx") {
    WARN("skipped: " << "DTENSOR_HOST_ISA=" << cap << " caps the choice");
    return;
  }
  const auto has = [&](const char* flag) { return flags.find(std::string(" ") + flag + " ") != std::string::npos; };
  const bool avx512 = has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq") && has("avx512cd");
  const bool bf16 = avx512 && has("avx512_bf16");
  bool granted = false;
#if defined(__linux__) && defined(__x86_64__)
  unsigned long features = 0;  // ARCH_REQ_XCOMP_PERM / ARCH_GET_XCOMP_PERM for XTILEDATA (18)
  granted = ::syscall(SYS_arch_prctl, 0x1023, 18) == 0 && ::syscall(SYS_arch_prctl, 0x1022, &features) == 0 &&
            (features >> 18 & 1u);
#endif
  const bool amx = bf16 && has("amx_tile") && has("amx_bf16") && granted;
  const kh::Bf16Gemm want = amx ? kh::Bf16Gemm::amx : bf16 ? kh::Bf16Gemm::avx512_bf16 : kh::Bf16Gemm::widen_sgemm;
  INFO("CPU flags avx512 " << avx512 << ", avx512_bf16 " << bf16 << ", amx_tile+amx_bf16 "
                           << (has("amx_tile") && has("amx_bf16")) << ", tiles granted by the OS " << granted);
  INFO(kh::blas_kernels_line());
  CHECK(kh::bf16_gemm_kernel() == want);
  CHECK(kh::blas_kernels_line().find(std::string("bf16 GEMMs: ") + kh::bf16_gemm_name(want)) != std::string::npos);
  if (want == kh::Bf16Gemm::widen_sgemm) WARN("this CPU has no bf16 dot products: the widened sgemm is the best");
  // set_host_isa_cap below avx512 (what tests and benchmarks use to compare paths) widens.
  kh::set_host_isa_cap(kh::Isa::avx2);
  CHECK(kh::bf16_gemm_kernel() == kh::Bf16Gemm::widen_sgemm);
  kh::set_host_isa_cap(kh::Isa::avx512);
}

// ---- FP8 (core/float8.hpp, nn/fp8_recipe.hpp, kernels/host/gemm_fp8.hpp) ------------------

TEST_CASE("FP8 delayed scaling: the exact scale sequence of an amax history", "[kernels][fp8]") {
  nn::AmaxHistory h(448.f, {.history = 3, .margin = 0});
  // The first use takes its own amax; every later one the max of the last 3 recorded before it.
  const float amaxes[] = {2.f, 4.f, 1.f, 0.5f, 0.25f, 8.f, 3.f};
  const float expected[] = {448.f / 2, 448.f / 2, 448.f / 4, 448.f / 4, 448.f / 4, 448.f / 1, 448.f / 8};
  for (int i = 0; i < 7; ++i) {
    INFO("use " << i);
    CHECK(h.use(amaxes[i]) == expected[i]);
  }
  CHECK(h.history() == std::vector<float>{0.25f, 8.f, 3.f});
  CHECK(h.next_scale() == 448.f / 8);

  nn::AmaxHistory m(57344.f, {.history = 2, .margin = 2});  // E5M2's max, scale / 2^margin
  CHECK(m.use(3.f) == 57344.f / 3.f / 4.f);
  CHECK(m.use(1.f) == 57344.f / 3.f / 4.f);
  CHECK(m.use(1.f) == 57344.f / 3.f / 4.f);
  CHECK(m.next_scale() == 57344.f / 1.f / 4.f);

  // A zero, NaN or infinite amax (an all-zero gradient, a diverged step) keeps the scale.
  nn::AmaxHistory z(448.f, {.history = 2});
  CHECK(z.use(0.f) == 1.f);
  CHECK(z.use(0.f) == 1.f);
  CHECK(z.use(7.f) == 1.f);
  CHECK(z.next_scale() == 64.f);
  z.record(std::numeric_limits<float>::quiet_NaN());
  CHECK(z.next_scale() == 64.f);
  z.record(2.f);  // the NaN is still in the last 2
  CHECK(z.next_scale() == 64.f);
  z.record(2.f);
  CHECK(z.next_scale() == 224.f);
  z.record(1e-45f);  // 448 / 1e-45 overflows: kept
  CHECK(z.next_scale() == 224.f);

  nn::Fp8LinearScaling roles;
  CHECK(roles.input.fp8_max() == 448.f);
  CHECK(roles.grad_output.fp8_max() == 57344.f);
  CHECK(roles.weight.options().history == 16);
  CHECK_THROWS_WITH(nn::AmaxHistory(448.f, {.history = 0}),
                    Catch::Contains("nn::AmaxHistory") && Catch::Contains("history 0"));
}

TEST_CASE("FP8 amax and quantize: the scaled satfinite cast", "[kernels][fp8]") {
  const std::vector<float> x{0.5f, -3.f, 1000.f, -1e-6f, 0.f};
  CHECK(kh::amax(x.data(), 5) == 1000.f);
  CHECK(kh::amax(x.data(), 0) == 0.f);
  const std::vector<float> nan{1.f, std::numeric_limits<float>::quiet_NaN(), 2.f};
  CHECK(std::isnan(kh::amax(nan.data(), 3)));
  std::vector<float8_e4m3> q(5);
  kh::quantize(x.data(), 5, 2.f, q.data());
  CHECK(float(q[0]) == 1.f);
  CHECK(float(q[1]) == -6.f);
  CHECK(float(q[2]) == 448.f);  // 2000 saturates
  CHECK(float(q[3]) == 0.f);    // -2e-6 is below half of 2^-9: a zero
  CHECK(std::signbit(float(q[3])));
  std::vector<dtensor::bfloat16> xb{dtensor::bfloat16(3.f), dtensor::bfloat16(-0.1f)};
  std::vector<float8_e5m2> g(2);
  kh::quantize(xb.data(), 2, 10.f, g.data());
  CHECK(float(g[0]) == 32.f);  // 30 -> halfway 28 | 32: to even (32)
  CHECK(float(g[1]) == float(float8_e5m2(float(dtensor::bfloat16(-0.1f)) * 10.f)));
  CHECK_THROWS_WITH(kh::quantize(x.data(), 5, 0.f, q.data()),
                    Catch::Contains("quantize") && Catch::Contains("scale 0"));
}

namespace {

/// The FP8 GEMM against a double loop over the same FP8 values: exact when every partial sum is
/// a float (small integers), else within the fp32 summation's error bound.
template <class FA, class FB, class TC>
void check_gemm_fp8(Case cs, bool ta, bool tb, float sa, float sb, bool integers, std::uint64_t seed) {
  Extent lda = 0, ldb = 0;
  auto a = make_operand<float>(cs.m, cs.k, ta, 3, seed, lda);
  auto b = make_operand<float>(cs.k, cs.n, tb, 1, seed + 1, ldb);
  if (integers) {  // integers in [-16, 16] (E4M3-exact) and [-8, 8] (E5M2-exact)
    for (auto& v : a) v = std::round(v * 16);
    for (auto& v : b) v = std::round(v * 8);
  }
  std::vector<FA> qa(a.size());
  std::vector<FB> qb(b.size());
  kh::quantize(a.data(), Extent(a.size()), sa, qa.data());
  kh::quantize(b.data(), Extent(b.size()), sb, qb.data());
  const Extent ldc = cs.n + 2;
  std::vector<TC> c(std::size_t(std::max<Extent>(1, cs.m * ldc)), TC(7.f));
  kh::gemm_fp8(ta, tb, qa.data(), 1 / sa, qb.data(), 1 / sb, c.data(), cs.m, cs.n, cs.k, lda, ldb, ldc);
  const double factor = double(1 / sa * (1 / sb));
  for (Extent i = 0; i < cs.m; ++i)
    for (Extent j = 0; j < cs.n; ++j) {
      double s = 0, mag = 0;
      for (Extent p = 0; p < cs.k; ++p) {
        const double t = double(float(at(qa, ta, lda, i, p))) * double(float(at(qb, tb, ldb, p, j)));
        s += t;
        mag += std::abs(t);
      }
      const double ref = factor * s, got = double(float(c[std::size_t(i * ldc + j)]));
      INFO("m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " ta=" << ta << " tb=" << tb << " at " << i << "," << j);
      if (integers && std::is_same_v<TC, float>) REQUIRE(got == ref);
      else if (std::is_same_v<TC, float>) REQUIRE(std::abs(got - ref) <= factor * mag * (cs.k + 2) * 6e-8);
      else REQUIRE(std::abs(got - ref) <= factor * mag * (cs.k + 2) * 6e-8 + std::abs(ref) * 0.0040);
    }
  for (Extent i = 0; i < cs.m; ++i)  // the pitch's padding is not written
    for (Extent j = cs.n; j < ldc; ++j) REQUIRE(float(c[std::size_t(i * ldc + j)]) == 7.f);
}

}  // namespace

TEST_CASE("FP8 GEMM equals the FP8 products summed in fp32, over uneven shapes", "[kernels][fp8]") {
  const Case cases[] = {{1, 1, 1}, {7, 5, 13}, {13, 9, 1}, {3, 17, 33}, {31, 6, 70}, {0, 4, 3}, {4, 3, 0}};
  std::uint64_t seed = 100;
  for (const auto& cs : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        // Exact: integers and power-of-two scales make every partial sum a float.
        check_gemm_fp8<float8_e4m3, float8_e5m2, float>(cs, ta, tb, 2.f, 0.5f, true, seed++);
        // Scales of the recipe (fp8_max / amax), forward (E4M3 x E4M3) and backward (E5M2 x E4M3).
        check_gemm_fp8<float8_e4m3, float8_e4m3, float>(cs, ta, tb, 448.f / 0.93f, 448.f / 0.71f, false, seed++);
        check_gemm_fp8<float8_e5m2, float8_e4m3, dtensor::bfloat16>(cs, ta, tb, 57344.f / 3.f, 448.f, false, seed++);
      }
}

TEST_CASE("FP8 GEMM: bf16 output rounded once, accumulation, errors", "[kernels][fp8]") {
  std::vector<float8_e4m3> a{1.f, 2.f, 3.f, 0.375f, -448.f, 0.75f};  // [2, 3]
  std::vector<float8_e5m2> b{1.f, 0.5f, 2.f, -1.f, 0.25f, 3.f};      // [3, 2]
  std::vector<float> c(4);
  kh::gemm_fp8(false, false, a.data(), 0.5f, b.data(), 0.25f, c.data(), 2, 2, 3, 3, 2, 2);
  CHECK(c == std::vector<float>{(1 + 4 + 0.75f) / 8, (0.5f - 2 + 9) / 8, (0.375f - 896 + 0.1875f) / 8,
                                (0.1875f + 448 + 2.25f) / 8});
  std::vector<dtensor::bfloat16> cb(4, dtensor::bfloat16(1.f));
  kh::gemm_fp8(false, false, a.data(), 0.5f, b.data(), 0.25f, cb.data(), 2, 2, 3, 3, 2, 2, /*accumulate=*/true);
  for (std::size_t i = 0; i < 4; ++i) CHECK(float(cb[i]) == float(dtensor::bfloat16(1.f + c[i])));
  CHECK_THROWS_WITH(kh::gemm_fp8(false, false, a.data(), 1.f, b.data(), 1.f, c.data(), 2, 2, 3, 2, 2, 2),
                    Catch::Contains("gemm") && Catch::Contains("lda=2"));
  CHECK_THROWS_WITH(kh::gemm_fp8(false, false, a.data(), std::numeric_limits<float>::infinity(), b.data(), 1.f,
                                 c.data(), 2, 2, 3, 3, 2, 2),
                    Catch::Contains("gemm_fp8") && Catch::Contains("not finite"));
}

TEST_CASE("matmul and bmm with transposes", "[kernels][gemm]") {
  auto a = normal<double>(Shape<3>{3, 5, 7}, 1), b = normal<double>(Shape<3>{3, 7, 4}, 2);
  auto bt = normal<double>(Shape<3>{3, 4, 7}, 3), at = normal<double>(Shape<3>{3, 7, 5}, 4);
  for (auto [ta, tb] : {std::pair{false, false}, std::pair{false, true}, std::pair{true, false}, std::pair{true, true}}) {
    const auto& A = ta ? at : a;
    const auto& B = tb ? bt : b;
    auto c = kh::bmm(A, B, ta, tb);
    REQUIRE(c.shape() == Shape<3>{3, 5, 4});
    for (Extent s = 0; s < 3; ++s) {
      auto as = A.slice(0, s, 1).reshape(Shape<2>{A.extent(1), A.extent(2)});
      auto bs = B.slice(0, s, 1).reshape(Shape<2>{B.extent(1), B.extent(2)});
      auto cs = kh::matmul(as, bs, ta, tb);
      for (Extent i = 0; i < 5; ++i)
        for (Extent j = 0; j < 4; ++j) {
          double ref = 0;
          for (Extent p = 0; p < 7; ++p) ref += (ta ? as(p, i) : as(i, p)) * (tb ? bs(j, p) : bs(p, j));
          CHECK(cs(i, j) == Approx(ref).epsilon(1e-12));
          CHECK(c(s, i, j) == Approx(ref).epsilon(1e-12));
        }
    }
  }
  // matmul_into accumulates with beta.
  auto x = normal<double>(Shape<2>{3, 5}, 9), y = normal<double>(Shape<2>{5, 2}, 10);
  auto acc = kh::matmul(x, y);
  kh::matmul_into(acc, x, y, false, false, 1.0, 1.0);
  auto twice = kh::matmul(x, y);
  for (Extent i = 0; i < twice.numel(); ++i) CHECK(acc[i] == Approx(2 * twice[i]).epsilon(1e-14));
}

TEST_CASE("linear forward and its input and weight gradients", "[kernels][gemm]") {
  auto x = normal<double>(Shape<3>{3, 5, 7}, 11);
  auto w = normal<double>(Shape<2>{4, 7}, 12);
  auto b = normal<double>(Shape<1>{4}, 13);
  auto dy = normal<double>(Shape<3>{3, 5, 4}, 14);
  auto y = kh::linear(x, w, &b);
  REQUIRE(y.shape() == Shape<3>{3, 5, 4});
  for (Extent i = 0; i < 3; ++i)
    for (Extent t = 0; t < 5; ++t)
      for (Extent o = 0; o < 4; ++o) {
        double ref = b[o];
        for (Extent p = 0; p < 7; ++p) ref += x(i, t, p) * w(o, p);
        CHECK(y(i, t, o) == Approx(ref).epsilon(1e-12));
      }
  auto loss_x = [&](const Tensor<double, 3>& xx) { return kt::dot(kh::linear(xx, w, &b), dy); };
  auto loss_w = [&](const Tensor<double, 2>& ww) { return kt::dot(kh::linear(x, ww, &b), dy); };
  auto loss_b = [&](const Tensor<double, 1>& bb) { return kt::dot(kh::linear(x, w, &bb), dy); };
  kt::check_grad(kh::linear_backward_input(dy, w), kt::fd_grad(x, loss_x));
  Tensor<double, 2> dw(w.shape());
  Tensor<double, 1> db(b.shape());
  kh::linear_backward_weight(x, dy, dw, &db);
  kt::check_grad(dw, kt::fd_grad(w, loss_w));
  kt::check_grad(db, kt::fd_grad(b, loss_b));
  // accumulate = true adds to what is there (gradient accumulation over micro-batches)
  kh::linear_backward_weight(x, dy, dw, &db, true);
  Tensor<double, 2> dw1(w.shape());
  kh::linear_backward_weight(x, dy, dw1);
  for (Extent i = 0; i < dw.numel(); ++i) CHECK(dw[i] == Approx(2 * dw1[i]).epsilon(1e-14));
}

TEST_CASE("gemm-family shape errors name the op and the extents", "[kernels][gemm]") {
  Tensor<float, 2> a(Shape<2>{3, 5}), b(Shape<2>{4, 2});
  kt::require_error([&] { kh::matmul(a, b); }, {"matmul", "[3, 5]", "[4, 2]"});
  Tensor<float, 3> x(Shape<3>{2, 3, 5}), y(Shape<3>{3, 5, 4});
  kt::require_error([&] { kh::bmm(x, y); }, {"bmm", "[2, 3, 5]", "[3, 5, 4]"});
  Tensor<float, 2> w(Shape<2>{4, 6});
  kt::require_error([&] { kh::linear(x, w); }, {"linear", "[2, 3, 5]", "[4, 6]"});
  float c = 0;
  kt::require_error([&] { kh::gemm<float>(false, false, 1.f, &c, &c, 0.f, &c, 2, 2, 2, 1, 2, 2); }, {"gemm", "lda=1"});
}

TEST_CASE("set_blas_threads", "[kernels][gemm]") {
  kt::require_error([] { kh::set_blas_threads(0); }, {"set_blas_threads"});
  const bool took = kh::set_blas_threads(1);
  if (!kh::has_cblas()) CHECK_FALSE(took);
  INFO("BLAS thread count applied: " << took);
  SUCCEED();
}

// Issue 46: OpenBLAS picks its kernels by the CPU's model number; on a CPU newer than its table
// (Debian 12's 0.3.21 on a Sapphire Rapids VM) it ran the Prescott (SSE3) kernels. gemm() now
// makes it run kernels as wide as the CPU's features allow (blas_core.hpp).
TEST_CASE("the BLAS kernel choice by CPU features", "[kernels][gemm][blas]") {
  using kh::Isa;
  using L = kh::detail::BlasLevel;
  CHECK(kh::detail::blas_core_to_choose("Prescott", L::avx512, true, Isa::avx512) == "Cooperlake");
  CHECK(kh::detail::blas_core_to_choose("prescott", L::avx512, false, Isa::avx512) == "SkylakeX");
  CHECK(kh::detail::blas_core_to_choose("Nehalem", L::avx2, false, Isa::avx512) == "Haswell");
  CHECK(kh::detail::blas_core_to_choose("Sandybridge", L::avx512, true, Isa::avx2) == "Haswell");  // DTENSOR_HOST_ISA=avx2
  CHECK(kh::detail::blas_core_to_choose("Prescott", L::avx512, true, Isa::baseline).empty());      // DTENSOR_HOST_ISA=baseline
  CHECK(kh::detail::blas_core_to_choose("Zen", L::avx512, false, Isa::avx512) == "SkylakeX");
  CHECK(kh::detail::blas_core_to_choose("SkylakeX", L::avx512, true, Isa::avx512).empty());  // as wide: kept
  CHECK(kh::detail::blas_core_to_choose("Haswell", L::avx2, false, Isa::avx512).empty());
  CHECK(kh::detail::blas_core_to_choose("Prescott", L::sse, false, Isa::avx512).empty());  // nothing wider to run
  CHECK(kh::detail::blas_core_to_choose("ARMV8SVE", L::avx512, true, Isa::avx512).empty());  // not an x86 core: never
  CHECK(kh::detail::blas_core_level("Cooperlake") == L::avx512);
  CHECK(kh::detail::blas_core_level("Unknown") == L::unknown);
}

namespace {
/// OpenBLAS kernels a user pinned in the environment ("" when none).
std::string blas_pin() {
  for (const char* v : {"DTENSOR_BLAS_CORETYPE", "OPENBLAS_CORETYPE"})
    if (const char* s = std::getenv(v); s && !kh::detail::iequal(s, "openblas")) return s;
  return "";
}
}  // namespace

TEST_CASE("the BLAS runs kernels as wide as the CPU's, not SSE ones on an AVX2 or AVX-512 CPU", "[kernels][gemm][blas]") {
  if (!kh::has_cblas()) { WARN("skipped: " << "built without a BLAS"); return; }
  float a[4] = {1, 2, 3, 4}, c[4] = {};
  kh::gemm<float>(false, false, 1.f, a, a, 0.f, c, 2, 2, 2, 2, 2, 2);  // the choice is made before the first CBLAS call
  CHECK(c[0] == 7.f);
  const kh::BlasKernels& k = kh::blas_kernels();
  INFO(kh::blas_kernels_line());
  if (k.library.empty()) { WARN("skipped: " << "the CBLAS is not OpenBLAS"); return; }
  const auto cpu = kh::detail::cpu_blas_features();
  if (cpu.level < kh::detail::BlasLevel::avx2) { WARN("skipped: " << "the CPU has neither AVX2 nor AVX-512"); return; }
  if (const std::string pin = blas_pin(); !pin.empty()) {
    CHECK(kh::detail::iequal(k.core, pin));  // a user's pin is what runs, never replaced
    { WARN("skipped: " << "kernels pinned in the environment: " + pin); return; }
  }
  // The cap DTENSOR_HOST_ISA puts on the choice (baseline: OpenBLAS's own pick stays).
  const kh::Isa cap = kh::detected_host_isa();
  const auto want = cap == kh::Isa::baseline ? kh::detail::BlasLevel::sse
                    : cap == kh::Isa::avx2   ? std::min(cpu.level, kh::detail::BlasLevel::avx2)
                                             : cpu.level;
  CHECK(kh::detail::blas_core_level(k.core) >= want);
}

TEST_CASE("an OpenBLAS fallen back to Prescott is switched to the CPU's kernels before the first GEMM", "[kernels][gemm][blas]") {
#ifdef DTENSOR_DETAIL_WEAK_OPENBLAS_CORE
  if (!kh::detail::openblas_can_switch()) { WARN("skipped: " << "not an OpenBLAS built with DYNAMIC_ARCH"); return; }
  const auto cpu = kh::detail::cpu_blas_features();
  if (cpu.level < kh::detail::BlasLevel::avx2 || kh::detected_host_isa() == kh::Isa::baseline)
    { WARN("skipped: " << "the CPU has neither AVX2 nor AVX-512 (or DTENSOR_HOST_ISA=baseline)"); return; }
  if (!blas_pin().empty()) { WARN("skipped: " << "kernels pinned in the environment"); return; }
  const std::string process_core = kh::blas_kernels().core;
  // What the machine of issue 46 ran: OpenBLAS's own choice on a CPU it did not know.
  REQUIRE(kh::detail::switch_openblas_core("Prescott") == "Prescott");
  const kh::BlasKernels k = kh::detail::choose_blas_kernels();
  const std::string after = kh::detail::openblas_core_name();
  CHECK(after == k.core);
  CHECK(k.library_pick == "Prescott");
  CHECK(k.chosen_by == "dtensor");
  CHECK(kh::detail::blas_core_level(k.core) >= std::min(cpu.level, kh::detected_host_isa() == kh::Isa::avx2
                                                                       ? kh::detail::BlasLevel::avx2
                                                                       : kh::detail::BlasLevel::avx512));
  if (cpu.level == kh::detail::BlasLevel::avx512 && cpu.avx512_bf16 && kh::detected_host_isa() == kh::Isa::avx512)
    CHECK(k.core == "Cooperlake");
  // The switched library computes (a 33 x 17 x 9 product against the loop).
  Extent lda = 0, ldb = 0;
  auto A = make_operand<float>(33, 9, false, 0, 1, lda);
  auto B = make_operand<float>(9, 17, true, 0, 2, ldb);
  std::vector<float> C1(33 * 17), C2(33 * 17);
  kh::gemm<float>(false, true, 1.f, A.data(), B.data(), 0.f, C1.data(), 33, 17, 9, lda, ldb, 17);
  kh::detail::gemm_portable<float>(false, true, 1.f, A.data(), B.data(), 0.f, C2.data(), 33, 17, 9, lda, ldb, 17);
  for (std::size_t i = 0; i < C1.size(); ++i) CHECK(C1[i] == Approx(C2[i]).epsilon(1e-5).margin(1e-5));
  CHECK(kh::detail::switch_openblas_core(process_core) == process_core);  // as the process chose
#else
  { WARN("skipped: " << "built without OpenBLAS"); return; }
#endif
}

TEST_CASE("DTENSOR_BLAS_CORETYPE pins OpenBLAS's kernels, and a name it does not know is an error", "[kernels][gemm][blas]") {
#ifdef DTENSOR_DETAIL_WEAK_OPENBLAS_CORE
  if (!kh::detail::openblas_can_switch()) { WARN("skipped: " << "not an OpenBLAS built with DYNAMIC_ARCH"); return; }
  if (!blas_pin().empty()) { WARN("skipped: " << "kernels pinned in the environment"); return; }
  const std::string process_core = kh::blas_kernels().core;
  ::setenv("DTENSOR_BLAS_CORETYPE", "haswell", 1);
  const kh::BlasKernels k = kh::detail::choose_blas_kernels();
  CHECK(k.core == "Haswell");
  CHECK(k.chosen_by == "DTENSOR_BLAS_CORETYPE");
  ::setenv("DTENSOR_BLAS_CORETYPE", "", 1);
  kt::require_error([] { (void)kh::detail::choose_blas_kernels(); }, {"DTENSOR_BLAS_CORETYPE", "''"});
  ::setenv("DTENSOR_BLAS_CORETYPE", "Pentium9", 1);
  kt::require_error([] { (void)kh::detail::choose_blas_kernels(); }, {"DTENSOR_BLAS_CORETYPE", "'Pentium9'", "not a core"});
  CHECK(kh::detail::openblas_core_name() == "Haswell");  // put back as it was before the bad name
  ::unsetenv("DTENSOR_BLAS_CORETYPE");
  CHECK(kh::detail::switch_openblas_core(process_core) == process_core);
  CHECK(std::getenv("OPENBLAS_CORETYPE") == nullptr);  // the switch leaves the environment as it found it
#else
  { WARN("skipped: " << "built without OpenBLAS"); return; }
#endif
}

}  // namespace test_kernels_host_gemm
