// Every CUDA kernel against its host twin (kernels/host) on the same seeded inputs.
// Tolerances (relative to the host result, plus an absolute floor for values near zero):
//   float   rtol 1e-5, atol 1e-6 (GEMMs: rtol 1e-4 — cuBLAS sums in another order)
//   double  rtol 1e-12, atol 1e-13
//   bf16    rtol 1e-2, atol 1e-2 (one bf16 rounding of a value computed in another order)
#include <catch2/catch.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "cuda_skip.hpp"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/core/factories.hpp"
#include "dtensor/kernels/attention.hpp"  // the checked fronts kernels::attention, kernels::add
#include "dtensor/kernels/cuda/all.cuh"
#include "dtensor/kernels/cuda/attention_cudnn.cuh"  // registers cuDNN's bf16 attention (builds with cuDNN)
#include "dtensor/kernels/cuda/gemm_fp8.cuh"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/host/all.hpp"
#include "dtensor/kernels/host/gemm_fp8.hpp"

using namespace dtensor;
namespace hk = dtensor::kernels::host;
namespace ck = dtensor::kernels::cuda;

namespace {
template <class T>
Tolerance tol(bool gemm = false) {
  if constexpr (std::is_same_v<T, double>) return {1e-12, 1e-13};
  else if constexpr (std::is_same_v<T, bfloat16>) return {1e-2, 1e-2};
  else return gemm ? Tolerance{1e-4, 1e-5} : Tolerance{1e-5, 1e-6};
}
/// Row statistics kept in double (mean, rstd, log-sum-exp, sums of exponentials, the loss) of
/// per-element math done in compute_t<T>: for float and bf16 inputs the device's expf/rsqrtf and
/// nvcc's fused multiply-adds differ from the host's by an ulp of float (seen on an H100: 1e-8
/// relative), so they agree to float's precision; for double to double's.
template <class T>
Tolerance stat_tol(Tolerance for_double) {
  if constexpr (std::is_same_v<T, double>) return for_double;
  else return {1e-6, 1e-7};
}
template <class T, std::size_t R>
Tensor<T, R, cuda_space> dev(const Tensor<T, R>& h) { return to_space<cuda_space>(h); }
template <class T, std::size_t R>
Tensor<T, R> hst(const Tensor<T, R, cuda_space>& d) { return to_space<host_space>(d); }
Tensor<bfloat16, 2> kt_bf16_ones(Extent m, Extent n) {
  Tensor<bfloat16, 2> t(Shape<2>{m, n});
  for (Extent i = 0; i < t.numel(); ++i) t[i] = bfloat16(float(i % 7) - 3.f);
  return t;
}
#define CHECK_CLOSE(got, want, t)                \
  do {                                           \
    const auto c_ = compare(hst(got), want, t);  \
    INFO(#got << ": " << c_.message);            \
    CHECK(c_.ok);                                \
  } while (0)
}  // namespace

TEST_CASE("cuBLAS status names come through the check", "[nogpu]") {
  try {
    DTENSOR_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.backend_code() == int(CUBLAS_STATUS_INVALID_VALUE));
    CHECK(std::string(e.what()).find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos);
  }
}

TEMPLATE_TEST_CASE("cuda gemm, matmul, bmm, linear match the host", "[cuda][kernels]", float, double, bfloat16) {
  using T = TestType;
  const auto a = normal<T>(Shape<2>{33, 47}, 1), b = normal<T>(Shape<2>{47, 29}, 2), bt = normal<T>(Shape<2>{29, 47}, 3);
  CHECK_CLOSE(ck::matmul(dev(a), dev(b)), hk::matmul(a, b), tol<T>(true));
  CHECK_CLOSE(ck::matmul(dev(a), dev(bt), false, true), hk::matmul(a, bt, false, true), tol<T>(true));
  const auto at = normal<T>(Shape<2>{47, 33}, 4);
  CHECK_CLOSE(ck::matmul(dev(at), dev(b), true, false), hk::matmul(at, b, true, false), tol<T>(true));
  auto c = normal<T>(Shape<2>{33, 29}, 5);
  auto dc = dev(c);
  hk::matmul_into(c, a, b, false, false, T(0.5), T(2));
  ck::matmul_into(dc, dev(a), dev(b), false, false, T(0.5), T(2));
  CHECK_CLOSE(dc, c, tol<T>(true));
  const auto x3 = normal<T>(Shape<3>{3, 9, 11}, 6), y3 = normal<T>(Shape<3>{3, 7, 11}, 7);
  CHECK_CLOSE(ck::bmm(dev(x3), dev(y3), false, true), hk::bmm(x3, y3, false, true), tol<T>(true));
  const auto x = normal<T>(Shape<3>{2, 5, 16}, 8);
  const auto w = normal<T>(Shape<2>{24, 16}, 9);
  const auto bias = normal<T>(Shape<1>{24}, 10);
  const auto dbias = dev(bias);
  CHECK_CLOSE(ck::linear(dev(x), dev(w), &dbias), hk::linear(x, w, &bias), tol<T>(true));
  const auto dy = normal<T>(Shape<3>{2, 5, 24}, 11);
  CHECK_CLOSE(ck::linear_backward_input(dev(dy), dev(w)), hk::linear_backward_input(dy, w), tol<T>(true));
  Tensor<T, 2> dw(Shape<2>{24, 16});
  Tensor<T, 1> db(Shape<1>{24});
  auto ddw = dev(dw);
  auto ddb = dev(db);
  hk::linear_backward_weight(x, dy, dw, &db);
  ck::linear_backward_weight(dev(x), dev(dy), ddw, &ddb);
  CHECK_CLOSE(ddw, dw, tol<T>(true));
  CHECK_CLOSE(ddb, db, tol<T>());
}

namespace {
/// Every 4099th float bit pattern (about a million, every exponent and sign), as floats.
std::vector<float> float_sweep() {
  std::vector<float> v;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4099) v.push_back(std::bit_cast<float>(std::uint32_t(u)));
  return v;
}
template <class F8>
Tensor<std::uint8_t, 1> fp8_bytes(const std::vector<F8>& q) {
  Tensor<std::uint8_t, 1> t(Shape<1>{Extent(q.size())});
  for (std::size_t i = 0; i < q.size(); ++i) t[Extent(i)] = q[i].bits;
  return t;
}
}  // namespace

TEST_CASE("FP8: the host conversion is CUDA's __nv_cvt_float_to_fp8 (satfinite) and its decode", "[nogpu]") {
  // <cuda_fp8.h>'s host path (no device needed); the device's cvt.rn.satfinite is checked in
  // the [cuda] case below. (docs/fp8.md: equal over all 2^32 floats, run once by hand.)
  std::size_t diff4 = 0, diff5 = 0;
  for (float f : float_sweep()) {
    diff4 += __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3) != float8_e4m3(f).bits;
    diff5 += __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2) != float8_e5m2(f).bits;
  }
  CHECK(diff4 == 0);
  CHECK(diff5 == 0);
  for (int c = 0; c < 256; ++c) {
    const __half h4 = __half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3));
    const __half h5 = __half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E5M2));
    const float a = __half2float(h4), b = __half2float(h5);
    const float x = float8_e4m3::from_bits(std::uint8_t(c)), y = float8_e5m2::from_bits(std::uint8_t(c));
    INFO("code " << c);
    CHECK(((std::isnan(a) && std::isnan(x)) || std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(x)));
    CHECK(((std::isnan(b) && std::isnan(y)) || std::bit_cast<std::uint32_t>(b) == std::bit_cast<std::uint32_t>(y)));
  }
}

TEST_CASE("cuda FP8: the device cast and the cuBLASLt FP8 GEMM match the host emulation", "[cuda][kernels]") {
  if (!testing::has_fp8_tensor_cores()) return;
  // The cast: the device's cvt.rn.satfinite against core/float8.hpp, bit for bit.
  const auto sweep = float_sweep();
  Tensor<float, 1> xs(Shape<1>{Extent(sweep.size())});
  for (std::size_t i = 0; i < sweep.size(); ++i) xs[Extent(i)] = sweep[i];
  const auto dxs = dev(xs);
  Tensor<std::uint8_t, 1, cuda_space> q4(Shape<1>{xs.numel()}), q5(Shape<1>{xs.numel()});
  ck::quantize(dxs.data(), xs.numel(), 1.f, reinterpret_cast<float8_e4m3*>(q4.data()));
  ck::quantize(dxs.data(), xs.numel(), 1.f, reinterpret_cast<float8_e5m2*>(q5.data()));
  const auto h4 = hst(q4), h5 = hst(q5);
  std::size_t diff4 = 0, diff5 = 0;
  for (Extent i = 0; i < xs.numel(); ++i) {
    diff4 += h4[i] != float8_e4m3(xs[i]).bits;
    diff5 += h5[i] != float8_e5m2(xs[i]).bits;
  }
  CHECK(diff4 == 0);
  CHECK(diff5 == 0);

  // The GEMM: C = (1/sa)(1/sb) A B^T, A [m,k], B [n,k] (cuBLASLt's TN form), uneven m.
  // n: C's rows 16-byte aligned in fp32 and bf16 (cuBLASLt's FP8 requirement; n = 17 was refused).
  for (auto [m, n, k] : {std::array<Extent, 3>{33, 24, 64}, std::array<Extent, 3>{8, 40, 16}}) {
    const auto a = normal<float>(Shape<2>{m, k}, 1), b = normal<float>(Shape<2>{n, k}, 2);
    const float sa = 448.f / hk::amax(a.data(), a.numel()), sb = 57344.f / hk::amax(b.data(), b.numel());
    std::vector<float8_e4m3> qa(std::size_t(m * k));
    std::vector<float8_e5m2> qb(std::size_t(n * k));
    hk::quantize(a.data(), a.numel(), sa, qa.data());
    hk::quantize(b.data(), b.numel(), sb, qb.data());
    Tensor<float, 1> inv(Shape<1>{2});
    inv[0] = 1 / sa;
    inv[1] = 1 / sb;
    const auto dqa = dev(fp8_bytes(qa)), dqb = dev(fp8_bytes(qb));
    const auto dinv = dev(inv);
    Tensor<float, 2> host(Shape<2>{m, n});
    hk::gemm_fp8(false, true, qa.data(), 1 / sa, qb.data(), 1 / sb, host.data(), m, n, k, k, k, n);
    Tensor<float, 2, cuda_space> c(Shape<2>{m, n});
    ck::gemm_fp8(reinterpret_cast<const float8_e4m3*>(dqa.data()), dinv.data(),
                 reinterpret_cast<const float8_e5m2*>(dqb.data()), dinv.data() + 1, c.data(), m, n, k, k, k, n);
    // The same exact products, but Hopper's FP8 tensor cores add them with ~14 mantissa bits
    // inside each promotion interval even with fast accumulation off (DeepSeek-V3's report,
    // section 3.3.2; seen on an H200: |diff| 4.5e-3 on sums of ~14 at k = 64), not in IEEE fp32 as
    // the host emulation does: held to 1e-2, as the bf16 output.
    CHECK_CLOSE(c, host, (Tolerance{1e-2, 1e-2}));
    // bf16 output, accumulated onto C (beta = 1), E4M3 x E4M3.
    std::vector<float8_e4m3> qb4(std::size_t(n * k));
    hk::quantize(b.data(), b.numel(), 448.f / hk::amax(b.data(), b.numel()), qb4.data());
    inv[1] = 1 / (448.f / hk::amax(b.data(), b.numel()));
    const auto dinv2 = dev(inv);
    const auto c0 = kt_bf16_ones(m, n);
    auto hostb = c0;
    hk::gemm_fp8(false, true, qa.data(), inv[0], qb4.data(), inv[1], hostb.data(), m, n, k, k, k, n, true);
    auto cb = dev(c0);
    const auto dqb4 = dev(fp8_bytes(qb4));
    ck::gemm_fp8(reinterpret_cast<const float8_e4m3*>(dqa.data()), dinv2.data(),
                 reinterpret_cast<const float8_e4m3*>(dqb4.data()), dinv2.data() + 1, cb.data(), m, n, k, k, k, n,
                 true);
    CHECK_CLOSE(cb, hostb, (Tolerance{1e-2, 1e-2}));
  }
  // The TN form's constraints are errors, not a silent transpose.
  Tensor<std::uint8_t, 1, cuda_space> small(Shape<1>{64});
  Tensor<float, 1, cuda_space> out(Shape<1>{16}), one(Shape<1>{1});
  const auto* p = reinterpret_cast<const float8_e4m3*>(small.data());
  CHECK_THROWS_WITH(ck::gemm_fp8(p, one.data(), p, one.data(), out.data(), 2, 2, 12, 12, 12, 2),
                    Catch::Contains("cuda::gemm_fp8") && Catch::Contains("multiples of 16"));
  CHECK_THROWS_WITH(ck::gemm_fp8(p, one.data(), p, one.data(), out.data(), 2, 2, 16, 16, 16, 2),
                    Catch::Contains("cuda::gemm_fp8") && Catch::Contains("C's rows 16-byte aligned"));
}

namespace {
/// f with its elements converted to T.
template <class T>
Tensor<T, 2> as_type(const Tensor<float, 2>& f) {
  Tensor<T, 2> t(f.shape());
  for (Extent i = 0; i < f.numel(); ++i) t[i] = T(f[i]);
  return t;
}
}  // namespace

TEST_CASE("cuda FP8: amax and the quantizing GEMM of each Linear form match the host emulation", "[cuda][kernels]") {
  // cuda::amax: the host's max |x| exactly, a NaN as +inf (nn/fp8_recipe.hpp's contract).
  auto a = normal<float>(Shape<2>{37, 29}, 7);
  a[100] = -9.5f;
  CHECK(ck::amax(dev(a).data(), a.numel()) == 9.5f);
  CHECK(ck::amax(dev(a).data(), 0) == 0.f);
  a[200] = std::numeric_limits<float>::quiet_NaN();
  CHECK(ck::amax(dev(a).data(), a.numel()) == std::numeric_limits<float>::infinity());
  const auto ab = as_type<bfloat16>(normal<float>(Shape<2>{9, 11}, 8));
  CHECK(ck::amax(dev(ab).data(), ab.numel()) == hk::amax(ab.data(), ab.numel()));
  if (!testing::has_fp8_tensor_cores()) return;
  // y = x W^T, dx = dy W, dW = dy^T x with extents that are not multiples of 16 (k = 24 and 5 are
  // padded, n = 13 and 3 leave C's rows unaligned), in float and bf16, against
  // host::gemm_fp8_quantizing: the same quantized values, Hopper's accumulation (1e-2).
  const auto check_forms = [&]<class T>(T) {
    for (auto [m, n, k] :
         {std::array<Extent, 3>{7, 13, 24}, std::array<Extent, 3>{33, 16, 64}, std::array<Extent, 3>{4, 3, 5}}) {
      const auto x = as_type<T>(normal<float>(Shape<2>{m, k}, 11));
      const auto w = as_type<T>(normal<float>(Shape<2>{n, k}, 12));
      const auto dy = as_type<T>(normal<float>(Shape<2>{m, n}, 13));
      const float sx = 448.f / hk::amax(x.data(), x.numel()), sw = 448.f / hk::amax(w.data(), w.numel());
      const float sdy = 57344.f / hk::amax(dy.data(), dy.numel());
      INFO("m=" << m << " n=" << n << " k=" << k);
      Tensor<T, 2> y(Shape<2>{m, n}), dx(Shape<2>{m, k}), dw(Shape<2>{n, k});
      Tensor<T, 2, cuda_space> gy(Shape<2>{m, n}), gdx(Shape<2>{m, k}), gdw(Shape<2>{n, k});
      const auto gx = dev(x), gw = dev(w), gdy = dev(dy);
      hk::gemm_fp8_quantizing<float8_e4m3, float8_e4m3>(false, true, x.data(), m, k, sx, w.data(), n, k, sw, y.data());
      ck::gemm_fp8_quantizing<float8_e4m3, float8_e4m3>(false, true, gx.data(), m, k, sx, gw.data(), n, k, sw,
                                                        gy.data());
      CHECK_CLOSE(gy, y, (Tolerance{1e-2, 1e-2}));
      hk::gemm_fp8_quantizing<float8_e5m2, float8_e4m3>(false, false, dy.data(), m, n, sdy, w.data(), n, k, sw,
                                                        dx.data());
      ck::gemm_fp8_quantizing<float8_e5m2, float8_e4m3>(false, false, gdy.data(), m, n, sdy, gw.data(), n, k, sw,
                                                        gdx.data());
      CHECK_CLOSE(gdx, dx, (Tolerance{1e-2, 1e-2}));
      hk::gemm_fp8_quantizing<float8_e5m2, float8_e4m3>(true, false, dy.data(), m, n, sdy, x.data(), m, k, sx,
                                                        dw.data());
      ck::gemm_fp8_quantizing<float8_e5m2, float8_e4m3>(true, false, gdy.data(), m, n, sdy, gx.data(), m, k, sx,
                                                        gdw.data());
      CHECK_CLOSE(gdw, dw, (Tolerance{1e-2, 1e-2}));
    }
  };
  check_forms(float{});
  check_forms(bfloat16{});
  Tensor<double, 2, cuda_space> d(Shape<2>{2, 16});
  const auto in_double = [&] {
    ck::gemm_fp8_quantizing<float8_e4m3, float8_e4m3>(false, true, d.data(), 2, 16, 1.f, d.data(), 2, 16, 1.f,
                                                      d.data());
  };
  CHECK_THROWS_WITH(in_double(), Catch::Contains("cuda::gemm_fp8_quantizing") && Catch::Contains("not double"));
}

TEST_CASE("cuda float GEMMs on TF32 tensor cores only when allowed", "[cuda][kernels]") {
  // k = 512 so that TF32's input rounding (10 mantissa bits) shows: the fp32 product is within
  // 1e-4 of the host's, the TF32 one only within 1e-2, and never bit-equal to the fp32 one.
  const auto a = normal<float>(Shape<2>{64, 512}, 1), b = normal<float>(Shape<2>{512, 48}, 2);
  const auto host = hk::matmul(a, b);
  REQUIRE_FALSE(ck::tf32_allowed());
  const auto fp32 = ck::matmul(dev(a), dev(b));
  CHECK_CLOSE(fp32, host, (Tolerance{1e-4, 1e-4}));
  ck::allow_tf32(true);
  const auto tf32 = ck::matmul(dev(a), dev(b));
  ck::allow_tf32(false);
  CHECK_CLOSE(tf32, host, (Tolerance{1e-2, 1e-1}));
  CHECK_FALSE(equal(hst(tf32), hst(fp32)));
  CHECK(equal(hst(ck::matmul(dev(a), dev(b))), hst(fp32)));  // off again: the fp32 path, deterministic
}

TEMPLATE_TEST_CASE("cuda elementwise and activations match the host", "[cuda][kernels]", float, double, bfloat16) {
  using T = TestType;
  const auto a = normal<T>(Shape<2>{17, 31}, 1), b = normal<T>(Shape<2>{17, 31}, 2);
  const auto da = dev(a), db = dev(b);
  CHECK_CLOSE(ck::add(da, db), hk::add(a, b), tol<T>());
  CHECK_CLOSE(ck::sub(da, db), hk::sub(a, b), tol<T>());
  CHECK_CLOSE(ck::mul(da, db), hk::mul(a, b), tol<T>());
  CHECK_CLOSE(ck::scale(da, 0.25), hk::scale(a, 0.25), tol<T>());
  auto y = a;
  auto dy = dev(a);
  hk::add_(y, b, 3.0);
  ck::add_(dy, db, 3.0);
  CHECK_CLOSE(dy, y, tol<T>());
  const auto bias = normal<T>(Shape<1>{31}, 3);
  CHECK_CLOSE(ck::add_bias(da, dev(bias)), hk::add_bias(a, bias), tol<T>());
  // More rows than the grid's 4,096 (each block walks several), columns past one block of 256;
  // rows of 304 elements run in 16-byte packs in every type, of 300 in float and double only.
  for (const Extent n : {Extent(300), Extent(304)}) {
    const auto wide = normal<T>(Shape<3>{3, 1700, n}, 9);
    const auto wb = normal<T>(Shape<1>{n}, 10);
    CHECK_CLOSE(ck::add_bias(dev(wide), dev(wb)), hk::add_bias(wide, wb), tol<T>());
  }
  CHECK_CLOSE(ck::bias_grad(da), hk::bias_grad(a), tol<T>());
  {  // 12,003 leading rows: summed over runs of rows in parallel (column_sums.cuh)
    const auto tall = normal<T>(Shape<3>{4001, 3, 70}, 5);
    CHECK_CLOSE(ck::bias_grad(dev(tall)), hk::bias_grad(tall), tol<T>(true));
  }
  CHECK_CLOSE(ck::gelu(da), hk::gelu(a), tol<T>());
  CHECK_CLOSE(ck::gelu_backward(da, db), hk::gelu_backward(a, b), tol<T>());
  {  // map and zip run 16-byte packs where the buffers are aligned, elements one by one where
     // not (here shifted by one element): the same bits either way
    const Extent n = 1001;
    const auto x = dev(normal<T>(Shape<1>{n}, 11)), y = dev(normal<T>(Shape<1>{n}, 12));
    ck::CudaTensor<T, 1> packed(Shape<1>{n}), single(Shape<1>{n}), zpacked(Shape<1>{n}), zsingle(Shape<1>{n});
    ck::detail::map(packed.data(), x.data(), n, ck::detail::Gelu{});
    ck::detail::map(single.data() + 1, x.data() + 1, n - 1, ck::detail::Gelu{});
    ck::detail::zip(zpacked.data(), x.data(), y.data(), n, ck::detail::Axpy<ck::compute_t<T>>{0.5f});
    ck::detail::zip(zsingle.data() + 1, x.data() + 1, y.data() + 1, n - 1, ck::detail::Axpy<ck::compute_t<T>>{0.5f});
    const auto hp = hst(packed), hs = hst(single), hzp = hst(zpacked), hzs = hst(zsingle);
    std::size_t differ = 0;
    for (Extent i = 1; i < n; ++i)
      differ += std::bit_cast<std::array<unsigned char, sizeof(T)>>(hp[i]) !=
                    std::bit_cast<std::array<unsigned char, sizeof(T)>>(hs[i]) ||
                std::bit_cast<std::array<unsigned char, sizeof(T)>>(hzp[i]) !=
                    std::bit_cast<std::array<unsigned char, sizeof(T)>>(hzs[i]);
    CHECK(differ == 0);
  }
  CHECK_CLOSE(ck::relu(da), hk::relu(a), tol<T>());
  CHECK_CLOSE(ck::relu_backward(da, db), hk::relu_backward(a, b), tol<T>());
  CHECK_CLOSE(ck::silu(da), hk::silu(a), tol<T>());
  CHECK_CLOSE(ck::silu_backward(da, db), hk::silu_backward(a, b), tol<T>());
  CHECK_CLOSE(ck::exp(da), hk::exp(a), tol<T>());
  CHECK_CLOSE(ck::exp_backward(da, db), hk::exp_backward(a, b), tol<T>());
  auto f = dev(a);
  ck::fill_(f, T(1.5f));
  CHECK(equal(hst(f), full<T>(a.shape(), T(1.5f))));
}

TEMPLATE_TEST_CASE("cuda softmax and norms match the host", "[cuda][kernels]", float, double, bfloat16) {
  using T = TestType;
  // rows longer than a block, and empty rows' neighbours; 2,500 rows: the weight gradients sum
  // over runs of rows in parallel (column_sums.cuh), a run count that does not divide the rows
  for (Shape<2> s : {Shape<2>{7, 13}, Shape<2>{3, 1000}, Shape<2>{2500, 300}}) {
    const auto x = normal<T>(s, 1, 0, 3), g = normal<T>(s, 2);
    const auto dx = dev(x), dg = dev(g);
    const auto y = hk::softmax(x), l = hk::log_softmax(x);
    CHECK_CLOSE(ck::softmax(dx), y, tol<T>());
    CHECK_CLOSE(ck::log_softmax(dx), l, tol<T>());
    CHECK_CLOSE(ck::softmax_backward(dev(y), dg), hk::softmax_backward(y, g), tol<T>());
    CHECK_CLOSE(ck::log_softmax_backward(dev(l), dg), hk::log_softmax_backward(l, g), tol<T>());
    const auto w = normal<T>(Shape<1>{s[1]}, 3, 1, 0.1), b = normal<T>(Shape<1>{s[1]}, 4);
    const auto hf = hk::layer_norm(x, w, b);
    const auto df = ck::layer_norm(dx, dev(w), dev(b));
    CHECK_CLOSE(df.y, hf.y, tol<T>());
    CHECK_CLOSE(df.mean, hf.mean, stat_tol<T>(tol<double>(true)));
    CHECK_CLOSE(df.rstd, hf.rstd, stat_tol<T>({1e-10, 1e-12}));
    const auto hb = hk::layer_norm_backward(x, w, hf.mean, hf.rstd, g);
    const auto dbw = ck::layer_norm_backward(dx, dev(w), df.mean, df.rstd, dg);
    CHECK_CLOSE(dbw.dx, hb.dx, tol<T>(true));
    CHECK_CLOSE(dbw.dweight, hb.dweight, tol<T>(true));
    CHECK_CLOSE(dbw.dbias, hb.dbias, tol<T>(true));
    const auto hr = hk::rms_norm(x, w);
    const auto dr = ck::rms_norm(dx, dev(w));
    CHECK_CLOSE(dr.y, hr.y, tol<T>());
    const auto hrb = hk::rms_norm_backward(x, w, hr.rstd, g);
    const auto drb = ck::rms_norm_backward(dx, dev(w), dr.rstd, dg);
    CHECK_CLOSE(drb.dx, hrb.dx, tol<T>(true));
    CHECK_CLOSE(drb.dweight, hrb.dweight, tol<T>(true));
  }
}

// Extents are checked once for every space by kernels::name (kernels/generic/), not by kernels::cuda.
TEST_CASE("kernels::name rejects mismatched shapes of cuda tensors with the op's name", "[cuda][kernels]") {
  const auto a = dev(zeros<float>(Shape<2>{3, 4})), b = dev(zeros<float>(Shape<2>{5, 4}));
  CHECK_THROWS_WITH(ck::matmul(a, b), Catch::Contains("matmul") && Catch::Contains("[3, 4]"));
  CHECK_THROWS_WITH(dtensor::kernels::add(a, b), Catch::Contains("add") && Catch::Contains("[5, 4]"));
}

// Tolerances of the kernels added with the dispatch by memory space: reductions, broadcasting
// and the cross-entropy pieces sum in double in the host's order (float/double: as above);
// attention forms scores and sums in another order than the host's GEMMs (lane-wise over key
// tiles), so float differs by float rounding of the scores: rtol 1e-4.
TEMPLATE_TEST_CASE("cuda reductions, broadcasting and data movement match the host", "[cuda][kernels]", float, double,
                   bfloat16) {
  using T = TestType;
  const auto x = normal<T>(Shape<3>{4, 7, 5}, 1);
  const auto dx = dev(x);
  for (std::size_t dim = 0; dim < 3; ++dim) {
    CHECK_CLOSE(ck::sum(dx, dim), hk::sum(x, dim), tol<T>());
    CHECK_CLOSE(ck::mean(dx, dim, 11), hk::mean(x, dim, 11), tol<T>());
    const auto hm = hk::max(x, dim);
    const auto cm = ck::max(dx, dim);
    CHECK(equal(hst(cm.values), hm.values));
    CHECK(equal(hst(cm.indices), hm.indices));
    const auto g = normal<T>(hm.values.shape(), 2);
    CHECK_CLOSE(ck::sum_backward(dev(g), x.shape(), dim), hk::sum_backward(g, x.shape(), dim), tol<T>());
    CHECK_CLOSE(ck::mean_backward(dev(g), x.shape(), dim), hk::mean_backward(g, x.shape(), dim), tol<T>());
    CHECK(equal(hst(ck::max_backward(dev(g), cm.indices, x.shape(), dim)), hk::max_backward(g, hm.indices, x.shape(), dim)));
    const auto other = normal<T>(hm.values.shape(), 3);  // some rows' maxima "on another rank"
    auto global = hm.values;
    for (Extent i = 0; i < global.numel(); i += 2) global[i] = other[i];
    CHECK(equal(hst(ck::max_backward_split(dev(g), cm.indices, cm.values, dev(global), x.shape(), dim)),
                hk::max_backward_split(g, hm.indices, hm.values, global, x.shape(), dim)));
  }
  const auto b = normal<T>(Shape<3>{4, 1, 5}, 4), c = normal<T>(Shape<3>{1, 7, 1}, 5);
  CHECK_CLOSE(ck::add_broadcast(dx, dev(b)), hk::add_broadcast(x, b), tol<T>());
  CHECK_CLOSE(ck::sub_broadcast(dev(c), dx), hk::sub_broadcast(c, x), tol<T>());
  CHECK_CLOSE(ck::mul_broadcast(dev(b), dev(c)), hk::mul_broadcast(b, c), tol<T>());
  CHECK_CLOSE(ck::sum_to(dx, b.shape()), hk::sum_to(x, b.shape()), tol<T>());
  CHECK_CLOSE(ck::sum_to(dx, c.shape()), hk::sum_to(x, c.shape()), tol<T>());
  CHECK(equal(hst(ck::transpose(dx, 0, 2)), hk::transpose(x, 0, 2)));
  CHECK(equal(hst(ck::permute(dx, {2, 0, 1})), hk::permute(x, {2, 0, 1})));
  // The broadcasts with their own index paths: equal extents, and leading dimensions only.
  const auto lead = normal<T>(Shape<3>{1, 7, 5}, 6), row = normal<T>(Shape<3>{1, 1, 5}, 7);
  CHECK_CLOSE(ck::add_broadcast(dx, dx), hk::add_broadcast(x, x), tol<T>());
  CHECK_CLOSE(ck::add_broadcast(dx, dev(lead)), hk::add_broadcast(x, lead), tol<T>());
  CHECK_CLOSE(ck::sub_broadcast(dev(row), dx), hk::sub_broadcast(row, x), tol<T>());
  // Permutations that keep the last dimension move whole rows in words of 2 to 16 bytes (rows of
  // 5 elements: 10, 20 or 40 bytes; of 8: 16, 32 or 64), as the head split [B,T,H,D] -> [B,H,T,D].
  CHECK(equal(hst(ck::permute(dx, {1, 0, 2})), hk::permute(x, {1, 0, 2})));
  const auto x4 = normal<T>(Shape<4>{2, 3, 6, 8}, 8);
  CHECK(equal(hst(ck::permute(dev(x4), {0, 2, 1, 3})), hk::permute(x4, {0, 2, 1, 3})));
  CHECK(equal(hst(ck::permute(dev(x4), {2, 1, 0, 3})), hk::permute(x4, {2, 1, 0, 3})));
  const auto parts = ck::split(dx, 1, {2, 0, 5});
  const auto hparts = hk::split(x, 1, {2, 0, 5});
  REQUIRE(parts.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(equal(hst(parts[i]), hparts[i]));
  CHECK(equal(hst(ck::concat(parts, 1)), x));
}

TEMPLATE_TEST_CASE("cuda embedding and cross-entropy match the host", "[cuda][kernels]", float, double, bfloat16) {
  using T = TestType;
  const Extent V = 37, C = 9;
  const auto table = normal<T>(Shape<2>{V, C}, 1);
  Tensor<std::int32_t, 2> ids(Shape<2>{3, 5});
  for (Extent i = 0; i < ids.numel(); ++i) ids[i] = std::int32_t((i * 7 + 3) % V);
  ids[4] = ids[9];  // a repeated id: its gradient rows add up
  CHECK(equal(hst(ck::embedding(dev(table), dev(ids))), hk::embedding(table, ids)));
  CHECK(equal(hst(ck::embedding_shard(dev(table.slice(0, 10, 12)), dev(ids), 10)),
              hk::embedding_shard(table.slice(0, 10, 12), ids, 10)));
  const auto dy = normal<T>(Shape<3>{3, 5, C}, 2);
  Tensor<T, 2> dt(table.shape());
  auto ddt = dev(dt);
  hk::embedding_backward(dt, ids, dy);
  ck::embedding_backward(ddt, dev(ids), dev(dy));
  CHECK(equal(hst(ddt), dt));  // the same additions in the same (token) order as the host
  {
    // Many tokens over few rows (long runs of one id), a width past one block, a shard that
    // skips the ids outside it, and a gradient that already holds values (accumulation).
    const Extent N = 3001, W = 300, Vb = 23;
    Tensor<std::int64_t, 1> many(Shape<1>{N});
    for (Extent i = 0; i < N; ++i) many[i] = (i * i * 13 + 5) % Vb;
    const auto dyb = normal<T>(Shape<2>{N, W}, 4);
    auto hb = normal<T>(Shape<2>{Vb, W}, 5);
    auto cb = dev(hb);
    hk::embedding_backward(hb, many, dyb);
    ck::embedding_backward(cb, dev(many), dev(dyb));
    CHECK(equal(hst(cb), hb));
    auto hs = normal<T>(Shape<2>{7, W}, 6);
    auto cs = dev(hs);
    hk::embedding_shard_backward(hs, many, dyb, 9);
    ck::embedding_shard_backward(cs, dev(many), dev(dyb), 9);
    CHECK(equal(hst(cs), hs));
  }
  auto bad = ids;
  bad[6] = std::int32_t(V);
  CHECK_THROWS_WITH(ck::embedding(dev(table), dev(bad)), Catch::Contains("embedding") && Catch::Contains("out of range"));

  const auto logits = normal<T>(Shape<2>{6, V}, 3, 0, 2);
  Tensor<std::int64_t, 1> targets(Shape<1>{6});
  for (Extent i = 0; i < 6; ++i) targets[i] = (i * 11) % V;
  const auto hf = hk::cross_entropy(logits, targets, 10);
  const auto cf = ck::cross_entropy(dev(logits), dev(targets), 10);
  CHECK(cf.loss == Approx(hf.loss).epsilon(stat_tol<T>({1e-12, 0}).rtol));
  CHECK_CLOSE(cf.lse, hf.lse, stat_tol<T>({1e-12, 1e-13}));
  CHECK_CLOSE(ck::cross_entropy_backward(dev(logits), dev(targets), cf.lse, 0.5, 10),
              hk::cross_entropy_backward(logits, targets, hf.lse, 0.5, 10), tol<T>());
  // The vocabulary-parallel pieces of the columns [8, 8 + 20).
  const auto part = logits.slice(1, 8, 20);
  const auto hm = hk::vocab_parallel_ce_max(part);
  CHECK_CLOSE(ck::vocab_parallel_ce_max(dev(part)), hm, (Tolerance{0, 0}));
  const auto hs = hk::vocab_parallel_ce_sum_exp(part, hm);
  CHECK_CLOSE(ck::vocab_parallel_ce_sum_exp(dev(part), dev(hm)), hs, stat_tol<T>({1e-12, 1e-13}));
  const auto ht = hk::vocab_parallel_ce_target_logit(part, targets, 8);
  CHECK_CLOSE(ck::vocab_parallel_ce_target_logit(dev(part), dev(targets), 8), ht, (Tolerance{0, 0}));
  CHECK(ck::vocab_parallel_ce_loss(dev(hm), dev(hs), dev(ht), 6) == hk::vocab_parallel_ce_loss(hm, hs, ht, 6));
  CHECK_CLOSE(ck::vocab_parallel_ce_backward(dev(part), dev(targets), 8, dev(hm), dev(hs)),
              hk::vocab_parallel_ce_backward(part, targets, 8, hm, hs), tol<T>());
}

// bf16 attention: both kernels widen the same bf16 inputs and form the scores in float (in
// different orders), each rounds its outputs to bf16 once: one bf16 rounding apart, the bf16
// tolerance (rtol 1e-2). Their lse (never rounded to bf16) differ by the float rounding of the
// scores, as for float: 1e-5.
// Both implementations (kernels/cuda/attention.cuh): 0 the fused kernels, 1 the cuBLAS chunks sized
// by the workspace (one chunk here), 2 the cuBLAS chunks of 4 query rows (several, the last short,
// and under causal offsets chunks that see no key at all).
template <class T>
ck::AttentionForward<T> attention_by(int impl, const ck::CudaTensor<T, 4>& q, const ck::CudaTensor<T, 4>& k,
                                     const ck::CudaTensor<T, 4>& v, const hk::AttentionOptions& o) {
  return impl == 0 ? ck::attention_fused(q, k, v, o) : ck::attention_gemm(q, k, v, o, impl == 1 ? 0 : 4);
}
template <class T>
ck::AttentionBackward<T> attention_backward_by(int impl, const ck::CudaTensor<T, 4>& q, const ck::CudaTensor<T, 4>& k,
                                               const ck::CudaTensor<T, 4>& v, const ck::AttentionForward<T>& f,
                                               const ck::CudaTensor<T, 4>& dout, const hk::AttentionOptions& o) {
  return impl == 0 ? ck::attention_fused_backward(q, k, v, f.out, f.lse, dout, o)
                   : ck::attention_gemm_backward(q, k, v, f.out, f.lse, dout, o, impl == 1 ? 0 : 4);
}

TEMPLATE_TEST_CASE("cuda attention (fused and cuBLAS) matches the host: causal, offsets, backward, block merge",
                   "[cuda][kernels]", float, double, bfloat16) {
  using T = TestType;
  const Tolerance t = std::is_same_v<T, double>     ? Tolerance{1e-11, 1e-12}
                      : std::is_same_v<T, bfloat16> ? tol<T>()
                                                    : Tolerance{1e-4, 1e-5};
  const Tolerance lse_tol = std::is_same_v<T, double> ? Tolerance{1e-10, 1e-10} : Tolerance{1e-5, 1e-5};
  // Head dimensions that do not fill a warp's lanes evenly, more keys than queries.
  const auto q = normal<T>(Shape<4>{2, 3, 9, 40}, 1), k = normal<T>(Shape<4>{2, 3, 13, 40}, 2);
  const auto v = normal<T>(Shape<4>{2, 3, 13, 24}, 3), dout = normal<T>(Shape<4>{2, 3, 9, 24}, 4);
  for (const int impl : {0, 1, 2})
  for (hk::AttentionOptions o : {hk::AttentionOptions{}, hk::AttentionOptions{.causal = false, .scale = 0.3},
                                 hk::AttentionOptions{.q_offset = 4, .k_offset = 0},
                                 hk::AttentionOptions{.q_offset = 0, .k_offset = 5}}) {
    INFO("implementation " << impl << " causal " << o.causal << " q_offset " << o.q_offset << " k_offset " << o.k_offset);
    const auto hf = hk::attention(q, k, v, o);
    const auto cf = attention_by(impl, dev(q), dev(k), dev(v), o);
    CHECK_CLOSE(cf.out, hf.out, t);
    // Rows that see no key have lse = -inf on both sides (compare reads -inf - -inf as a difference).
    auto clse = hst(cf.lse), hlse = hf.lse;
    for (Extent r = 0; r < hlse.numel(); ++r)
      if (std::isinf(hlse[r]) && clse[r] == hlse[r]) clse[r] = hlse[r] = 0;
    const auto lse_cmp = compare(clse, hlse, lse_tol);
    INFO("lse: " << lse_cmp.message);
    CHECK(lse_cmp.ok);
    const auto hb = hk::attention_backward(q, k, v, hf.out, hf.lse, dout, o);
    const auto cb = attention_backward_by(impl, dev(q), dev(k), dev(v), cf, dev(dout), o);
    CHECK_CLOSE(cb.dq, hb.dq, t);
    CHECK_CLOSE(cb.dk, hb.dk, t);
    CHECK_CLOSE(cb.dv, hb.dv, t);
  }
  {
    // The front chooses by the process-wide setting: each forced choice is that implementation.
    const auto dq = dev(q), dk = dev(k), dv = dev(v);
    ck::set_attention_algorithm(ck::AttentionAlgorithm::gemm);
    CHECK(equal(hst(ck::attention(dq, dk, dv).out), hst(ck::attention_gemm(dq, dk, dv).out)));
    ck::set_attention_algorithm(ck::AttentionAlgorithm::fused);
    CHECK(equal(hst(ck::attention(dq, dk, dv).out), hst(ck::attention_fused(dq, dk, dv).out)));
    ck::set_attention_algorithm(ck::AttentionAlgorithm::automatic);
  }
  const auto a = hk::attention(q, k, v), b = hk::attention(q, k, v, {.causal = false});
  const auto hm = hk::merge_attention_blocks(a.out, a.lse, b.out, b.lse);
  const auto cm = ck::merge_attention_blocks(dev(a.out), dev(a.lse), dev(b.out), dev(b.lse));
  CHECK_CLOSE(cm.out, hm.out, tol<T>());
  CHECK_THROWS_WITH(dtensor::kernels::attention(dev(q), dev(v), dev(v)), Catch::Contains("attention"));
}

// cuDNN's fused attention (bf16; builds with cuDNN): against the host's bf16 attention, which
// computes in float and rounds once. cuDNN rounds P to bf16 before P V (the tensor cores' input),
// so outputs and gradients are a few bf16 roundings apart: rtol and atol 3e-2 on values of order
// one (a wrong mask, scale or layout is off by order one). The lse is cuDNN's float statistic
// against the host's double: float rounding of bf16 products, 1e-4. The cases cuDNN must take
// (a GPU with cuDNN 9 and this build) are required to run on it; its refusal is printed.
TEST_CASE("cuda attention on cuDNN (bf16) matches the host: causal, diagonal offsets, backward, determinism",
          "[cuda][kernels]") {
  if (!ck::cudnn_attention_built()) {
    WARN("this build has no cuDNN (DTENSOR_WITH_CUDNN, scripts/fetch-cudnn-frontend.sh): nothing to check");
    return;
  }
  REQUIRE(ck::cudnn_attention_registered());
  using T = bfloat16;
  const Tolerance t{3e-2, 3e-2}, lse_tol{1e-4, 1e-4};
  struct Case {
    Extent b, h, tq, tk, d;
    hk::AttentionOptions o;
  };
  for (const Case c : {Case{2, 3, 128, 128, 64, {}}, Case{1, 4, 256, 256, 128, {.causal = false, .scale = 0.3}},
                       Case{2, 2, 64, 192, 64, {.causal = false}}, Case{1, 2, 100, 100, 64, {}},
                       Case{1, 2, 64, 128, 64, {.q_offset = 64, .k_offset = 0}}}) {
    INFO("B " << c.b << " H " << c.h << " Tq " << c.tq << " Tk " << c.tk << " D " << c.d << " causal " << c.o.causal
              << " q_offset " << c.o.q_offset);
    const auto q = normal<T>(Shape<4>{c.b, c.h, c.tq, c.d}, 21), k = normal<T>(Shape<4>{c.b, c.h, c.tk, c.d}, 22);
    const auto v = normal<T>(Shape<4>{c.b, c.h, c.tk, c.d}, 23), dout = normal<T>(Shape<4>{c.b, c.h, c.tq, c.d}, 24);
    const auto hf = hk::attention(q, k, v, c.o);
    const auto hb = hk::attention_backward(q, k, v, hf.out, hf.lse, dout, c.o);
    const auto f = ck::attention_cudnn(dev(q), dev(k), dev(v), c.o);
    INFO("cuDNN: " << (f ? std::string("took it") : "refused: " + ck::cudnn_attention_last_refusal()));
    const bool must = c.tq % 64 == 0 && c.tk % 64 == 0;  // the shapes every cuDNN 9 on sm_90 takes
    if (must) REQUIRE(f);
    if (!f) continue;
    CHECK_CLOSE(f->out, hf.out, t);
    const auto lse_cmp = compare(hst(f->lse), hf.lse, lse_tol);
    INFO("lse: " << lse_cmp.message);
    CHECK(lse_cmp.ok);
    const auto g = ck::attention_cudnn_backward(dev(q), dev(k), dev(v), f->out, f->lse, dev(dout), c.o);
    INFO("cuDNN backward: " << (g ? std::string("took it") : "refused: " + ck::cudnn_attention_last_refusal()));
    if (must) REQUIRE(g);
    if (!g) continue;
    CHECK_CLOSE(g->dq, hb.dq, t);
    CHECK_CLOSE(g->dk, hb.dk, t);
    CHECK_CLOSE(g->dv, hb.dv, t);
    // Deterministic (no atomic dQ accumulation): the same bits again; and the front's automatic
    // choice is this path.
    const auto g2 = ck::attention_cudnn_backward(dev(q), dev(k), dev(v), f->out, f->lse, dev(dout), c.o);
    REQUIRE(g2);
    CHECK(equal(hst(g2->dq), hst(g->dq)));
    CHECK(equal(hst(g2->dk), hst(g->dk)));
    CHECK(equal(hst(g2->dv), hst(g->dv)));
    CHECK(equal(hst(ck::attention(dev(q), dev(k), dev(v), c.o).out), hst(f->out)));
  }
  // Rows that see no key (a diagonal left of the top-left one) are not cuDNN's: the front falls
  // back to the exact paths, whose rows then have lse = -inf.
  const auto q = normal<T>(Shape<4>{1, 1, 64, 64}, 31);
  CHECK_FALSE(ck::attention_cudnn(dev(q), dev(q), dev(q), {.q_offset = 0, .k_offset = 8}));
}

// Several key tiles and blocks of query rows, and every register blocking the kernels choose
// (4 rows per warp up to head dimension 128 in float / 64 in double, 1 row above): rows past the
// end inside a warp, causal offsets that leave some rows of a warp seeing keys others do not.
TEMPLATE_TEST_CASE("cuda attention over many tiles, chunks and every register blocking matches the host",
                   "[cuda][kernels]", float, double) {
  using T = TestType;
  const Tolerance t = std::is_same_v<T, double> ? Tolerance{1e-11, 1e-12} : Tolerance{2e-4, 2e-5};
  for (const Extent d : {Extent(16), Extent(64), Extent(100), Extent(128), Extent(160)}) {
    INFO("head dimension " << d);
    const auto q = normal<T>(Shape<4>{1, 2, 75, d}, 11), k = normal<T>(Shape<4>{1, 2, 90, d}, 12);
    const auto v = normal<T>(Shape<4>{1, 2, 90, d - 5}, 13), dout = normal<T>(Shape<4>{1, 2, 75, d - 5}, 14);
    for (const int impl : {0, 1, 2})
    for (hk::AttentionOptions o : {hk::AttentionOptions{}, hk::AttentionOptions{.causal = false},
                                   hk::AttentionOptions{.q_offset = 21, .k_offset = 0},
                                   hk::AttentionOptions{.q_offset = 0, .k_offset = 37}}) {
      INFO("implementation " << impl << " causal " << o.causal << " q_offset " << o.q_offset << " k_offset "
                             << o.k_offset);
      const auto hf = hk::attention(q, k, v, o);
      const auto cf = attention_by(impl, dev(q), dev(k), dev(v), o);
      CHECK_CLOSE(cf.out, hf.out, t);
      const auto hb = hk::attention_backward(q, k, v, hf.out, hf.lse, dout, o);
      const auto cb = attention_backward_by(impl, dev(q), dev(k), dev(v), cf, dev(dout), o);
      CHECK_CLOSE(cb.dq, hb.dq, t);
      CHECK_CLOSE(cb.dk, hb.dk, t);
      CHECK_CLOSE(cb.dv, hb.dv, t);
    }
  }
}

TEMPLATE_TEST_CASE("cuda optimizer updates and sums of squares match the host", "[cuda][kernels]", float, double) {
  using T = TestType;
  const auto p0 = normal<T>(Shape<1>{1000}, 1), g = normal<T>(Shape<1>{1000}, 2);
  auto p = p0, m = normal<T>(p0.shape(), 3, 0, 0.1), v = uniform<T>(p0.shape(), 4, 0, 0.1);
  auto dp = dev(p), dm = dev(m), dv = dev(v);
  const hk::AdamWStep s{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 3};
  hk::adamw_update(p, g, m, v, s);
  ck::adamw_update(dp, dev(g), dm, dv, s);
  CHECK_CLOSE(dp, p, tol<T>());
  CHECK_CLOSE(dm, m, tol<T>());
  CHECK_CLOSE(dv, v, tol<T>());
  auto q = p0, b = normal<T>(p0.shape(), 5);
  auto dq = dev(q), dbuf = dev(b);
  const hk::SgdStep sg{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true, .first_step = false};
  hk::sgd_update(q, g, b, sg);
  ck::sgd_update(dq, dev(g), dbuf, sg);
  CHECK_CLOSE(dq, q, tol<T>());
  CHECK_CLOSE(dbuf, b, tol<T>());
  CHECK(ck::sum_squares(dev(g)) == Approx(hk::sum_squares(g)).epsilon(1e-12));
}

TEMPLATE_TEST_CASE("cuda AdamW over many parameters in one launch equals one launch per parameter", "[cuda][kernels]",
                   float, double, bfloat16) {
  using T = TestType;
  // Uneven segments: one element, several chunks with a partial last one, an empty one, a few
  // hundred; each with its own weight decay (0: a parameter that does not decay).
  const std::array<Extent, 4> sizes{1, 3 * 4096 + 17, 0, 301};
  const std::array<double, 4> decays{0.1, 0.0, 0.1, 0.05};
  const hk::AdamWStep s{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .step = 4};
  std::vector<Tensor<T, 1, cuda_space>> p1, m1, v1, p2, m2, v2, g;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const Shape<1> shape{sizes[k]};
    const auto h = [&](int seed, double scale, bool nonnegative = false) {  // v: a second moment, >= 0
      Tensor<T, 1> t(shape);
      const auto f = normal<double>(shape, seed, 0, scale);
      for (Extent i = 0; i < t.numel(); ++i) t[i] = T(nonnegative ? std::abs(f[i]) : f[i]);
      return dev(t);
    };
    p1.push_back(h(11 + int(k), 1)), m1.push_back(h(12, 0.1)), v1.push_back(h(13, 0.1, true));
    g.push_back(h(14, 1));
    p2.push_back(dev(hst(p1.back()))), m2.push_back(dev(hst(m1.back()))), v2.push_back(dev(hst(v1.back())));
  }
  std::vector<kernels::generic::AdamWSegment<T, T>> segments;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    auto sk = s;
    sk.weight_decay = decays[k];
    ck::adamw_update(p1[k], g[k], m1[k], v1[k], sk);
    segments.push_back({p2[k].data(), g[k].data(), m2[k].data(), v2[k].data(), sizes[k], decays[k]});
  }
  ck::adamw_update_segments(std::span<const kernels::generic::AdamWSegment<T, T>>(segments), s);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    INFO("segment " << k << " of " << sizes[k]);
    CHECK_CLOSE(p2[k], hst(p1[k]), (Tolerance{0, 0}));
    CHECK_CLOSE(m2[k], hst(m1[k]), (Tolerance{0, 0}));
    CHECK_CLOSE(v2[k], hst(v1[k]), (Tolerance{0, 0}));
  }
}
