// Every CUDA kernel against its host twin (kernels/host) on the same seeded inputs.
// Tolerances (relative to the host result, plus an absolute floor for values near zero):
//   float   rtol 1e-5, atol 1e-6 (GEMMs: rtol 1e-4 — cuBLAS sums in another order)
//   double  rtol 1e-12, atol 1e-13
//   bf16    rtol 1e-2, atol 1e-2 (one bf16 rounding of a value computed in another order)
#include <catch2/catch.hpp>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/core/factories.hpp"
#include "dtensor/kernels/cuda/all.cuh"
#include "dtensor/kernels/host/all.hpp"

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
template <class T, std::size_t R>
Tensor<T, R, cuda_space> dev(const Tensor<T, R>& h) { return to_space<cuda_space>(h); }
template <class T, std::size_t R>
Tensor<T, R> hst(const Tensor<T, R, cuda_space>& d) { return to_space<host_space>(d); }
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
  CHECK_CLOSE(ck::bias_grad(da), hk::bias_grad(a), tol<T>());
  CHECK_CLOSE(ck::gelu(da), hk::gelu(a), tol<T>());
  CHECK_CLOSE(ck::gelu_backward(da, db), hk::gelu_backward(a, b), tol<T>());
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
  // rows longer than a block, and empty rows' neighbours
  for (Shape<2> s : {Shape<2>{7, 13}, Shape<2>{3, 1000}}) {
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
    CHECK_CLOSE(df.mean, hf.mean, tol<double>(true));
    CHECK_CLOSE(df.rstd, hf.rstd, (Tolerance{1e-10, 1e-12}));
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

TEST_CASE("cuda kernels reject mismatched shapes with the op's name", "[cuda][kernels]") {
  const auto a = dev(zeros<float>(Shape<2>{3, 4})), b = dev(zeros<float>(Shape<2>{5, 4}));
  CHECK_THROWS_WITH(ck::matmul(a, b), Catch::Contains("matmul") && Catch::Contains("[3, 4]"));
  CHECK_THROWS_WITH(ck::add(a, b), Catch::Contains("add"));
}
