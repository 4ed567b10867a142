// Elementwise arithmetic, broadcasting, activations, reductions and layout moves on host, against
// naive loops; backwards against finite differences; shape errors.
#include "test_kernels_host_util.hpp"

#include <cmath>
#include <vector>

#include "dtensor/kernels/host/activations.hpp"
#include "dtensor/kernels/host/elementwise.hpp"
#include "dtensor/kernels/host/reduce.hpp"
#include "dtensor/kernels/host/transpose.hpp"
// Bad extents are checked by the kernels::name front (kernels/generic/), the API every space shares.
#include "dtensor/kernels/activations.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/reduce.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_kernels_host_pointwise {

// dtensor's, not OpenBLAS's global typedef (cblas.h), which another file of the group may include first.
using dtensor::bfloat16;
using namespace dtensor;
namespace kh = dtensor::kernels::host;

TEST_CASE("elementwise arithmetic and in-place forms", "[kernels][elementwise]") {
  auto a = normal<float>(Shape<3>{3, 5, 7}, 1);
  auto b = normal<float>(Shape<3>{3, 5, 7}, 2);
  auto s = kh::add(a, b), d = kh::sub(a, b), m = kh::mul(a, b), c = kh::scale(a, 0.5f);
  for (Extent i = 0; i < a.numel(); ++i) {
    CHECK(s[i] == a[i] + b[i]);
    CHECK(d[i] == a[i] - b[i]);
    CHECK(m[i] == a[i] * b[i]);
    CHECK(c[i] == 0.5f * a[i]);
  }
  auto y = a;
  kh::add_(y, b, 2.f);
  for (Extent i = 0; i < a.numel(); ++i) CHECK(y[i] == a[i] + 2.f * b[i]);
  kh::mul_(y, b);
  kh::scale_(y, -1.f);
  for (Extent i = 0; i < a.numel(); ++i) CHECK(y[i] == -((a[i] + 2.f * b[i]) * b[i]));
  // bfloat16 computes in float and rounds once
  auto ab = kt::cast<dtensor::bfloat16>(normal<double>(Shape<1>{9}, 3));
  auto bb = kt::cast<dtensor::bfloat16>(normal<double>(Shape<1>{9}, 4));
  auto sb = kh::add(ab, bb);
  for (Extent i = 0; i < 9; ++i) CHECK(sb[i] == dtensor::bfloat16(float(ab[i]) + float(bb[i])));
  kt::require_error([&] { kernels::add(a, normal<float>(Shape<3>{3, 5, 6}, 1)); }, {"add", "[3, 5, 7]", "[3, 5, 6]"});
  kt::require_error([&] { kernels::add_(y, normal<float>(Shape<3>{3, 1, 7}, 1)); }, {"add_", "[3, 1, 7]"});
}

TEST_CASE("bias add, its gradient, and general broadcasting", "[kernels][elementwise]") {
  auto x = normal<double>(Shape<3>{3, 5, 7}, 5);
  auto b = normal<double>(Shape<1>{7}, 6);
  auto y = kh::add_bias(x, b);
  for (Extent i = 0; i < 3; ++i)
    for (Extent t = 0; t < 5; ++t)
      for (Extent j = 0; j < 7; ++j) CHECK(y(i, t, j) == x(i, t, j) + b[j]);
  auto dy = normal<double>(Shape<3>{3, 5, 7}, 7);
  kt::check_grad(kh::bias_grad(dy), kt::fd_grad(b, [&](const Tensor<double, 1>& bb) { return kt::dot(kh::add_bias(x, bb), dy); }));
  Tensor<double, 1> db(Shape<1>{7});
  kh::bias_grad_into(db, dy);
  kh::bias_grad_into(db, dy, true);
  auto db1 = kh::bias_grad(dy);
  for (Extent j = 0; j < 7; ++j) CHECK(db[j] == Approx(2 * db1[j]).epsilon(1e-14));

  auto g = normal<double>(Shape<3>{3, 1, 7}, 8);
  auto z = kh::add_broadcast(x, g);
  for (Extent i = 0; i < 3; ++i)
    for (Extent t = 0; t < 5; ++t)
      for (Extent j = 0; j < 7; ++j) CHECK(z(i, t, j) == x(i, t, j) + g(i, 0, j));
  kt::check_grad(kh::sum_to(dy, g.shape()),
                 kt::fd_grad(g, [&](const Tensor<double, 3>& gg) { return kt::dot(kh::add_broadcast(x, gg), dy); }));
  auto g2 = normal<double>(Shape<3>{1, 5, 1}, 9);
  kt::check_grad(kh::sum_to(dy, g2.shape()),
                 kt::fd_grad(g2, [&](const Tensor<double, 3>& gg) { return kt::dot(kh::add_broadcast(x, gg), dy); }));

  // both operands broadcast: [3, 1, 7] (op) [1, 5, 1] -> [3, 5, 7]
  const auto z2 = kh::mul_broadcast(g, g2), z3 = kh::sub_broadcast(g2, g);
  REQUIRE(z2.shape() == Shape<3>{3, 5, 7});
  REQUIRE(z3.shape() == Shape<3>{3, 5, 7});
  for (Extent i = 0; i < 3; ++i)
    for (Extent t = 0; t < 5; ++t)
      for (Extent j = 0; j < 7; ++j) {
        CHECK(z2(i, t, j) == g(i, 0, j) * g2(0, t, 0));
        CHECK(z3(i, t, j) == g2(0, t, 0) - g(i, 0, j));
      }
  kt::require_error([&] { kernels::add_bias(x, normal<double>(Shape<1>{5}, 1)); }, {"add_bias", "[5]", "[3, 5, 7]"});
  kt::require_error([&] { kernels::add_broadcast(x, normal<double>(Shape<3>{3, 2, 7}, 1)); }, {"add_broadcast", "[3, 2, 7]", "[3, 5, 7]"});
}

namespace {
double gelu_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
}  // namespace

TEST_CASE("activations and their backwards", "[kernels][activations]") {
  auto x = normal<double>(Shape<3>{3, 5, 7}, 10, 0, 2);
  auto dy = normal<double>(Shape<3>{3, 5, 7}, 11);
  auto g = kh::gelu(x), r = kh::relu(x), s = kh::silu(x), e = kh::exp(x);
  for (Extent i = 0; i < x.numel(); ++i) {
    CHECK(g[i] == Approx(gelu_ref(x[i])).epsilon(1e-14));
    CHECK(r[i] == std::max(0.0, x[i]));
    CHECK(s[i] == Approx(x[i] / (1 + std::exp(-x[i]))).epsilon(1e-14));
    CHECK(e[i] == Approx(std::exp(x[i])).epsilon(1e-15));
  }
  using T3 = Tensor<double, 3>;
  kt::check_grad(kh::gelu_backward(x, dy), kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::gelu(v), dy); }));
  kt::check_grad(kh::silu_backward(x, dy), kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::silu(v), dy); }));
  kt::check_grad(kh::exp_backward(e, dy), kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::exp(v), dy); }));
  kt::check_grad(kh::relu_backward(x, dy), kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::relu(v), dy); }));
  // float gelu agrees with the double reference to float precision
  auto xf = kt::cast<float>(x);
  auto gf = kh::gelu(xf);
  for (Extent i = 0; i < x.numel(); ++i) CHECK(double(gf[i]) == Approx(gelu_ref(double(xf[i]))).margin(1e-6));
  // bfloat16 gelu runs the float kernels and rounds once: the double reference of the bf16 input
  // rounded to bf16, give or take one bf16 step where the fast tanh's 2e-7 straddles a rounding
  // boundary; the same for the backward and the fused bias + GELU (y = gelu of the stored h).
  auto xb = kt::cast<bfloat16>(x), dyb = kt::cast<bfloat16>(dy);
  auto gb = kh::gelu(xb), db = kh::gelu_backward(xb, dyb);
  const auto bf16_step = [](double v) { return std::max(std::abs(v) * 0x1p-7, 1e-30); };
  for (Extent i = 0; i < x.numel(); ++i) {
    const double xi = double(float(xb[i])), want = double(float(bfloat16(float(gelu_ref(xi)))));
    CHECK(std::abs(double(float(gb[i])) - want) <= bf16_step(want));
    const double h = 1e-6, slope = (gelu_ref(xi + h) - gelu_ref(xi - h)) / (2 * h);
    const double dwant = double(float(bfloat16(float(double(float(dyb[i])) * slope))));
    CHECK(std::abs(double(float(db[i])) - dwant) <= bf16_step(dwant) + 1e-6);
  }
  auto bias = kt::cast<bfloat16>(normal<double>(Shape<1>{7}, 12));
  const auto fused = kh::bias_gelu(xb, bias);
  for (Extent i = 0; i < x.numel(); ++i) {
    const bfloat16 hv = bfloat16(float(xb[i]) + float(bias[i % 7]));
    CHECK(fused.h[i].bits == hv.bits);
    auto one = Tensor<bfloat16, 1>::uninitialized(Shape<1>{1});
    one[0] = hv;
    CHECK(fused.y[i].bits == kh::gelu(one)[0].bits);
  }
  kt::require_error([&] { kernels::gelu_backward(x, normal<double>(Shape<3>{3, 5, 1}, 1)); }, {"gelu_backward", "[3, 5, 1]"});
}

TEST_CASE("sum, mean and max over any dimension, and their backwards", "[kernels][reduce]") {
  auto x = normal<double>(Shape<3>{3, 5, 7}, 12);
  for (std::size_t dim = 0; dim < 3; ++dim) {
    auto s = kh::sum(x, dim), m = kh::mean(x, dim);
    // a shard's mean divides by the global extent: twice the extent halves it
    const auto m2 = kh::mean(x, dim, 2 * x.extent(dim));
    for (Extent i = 0; i < m.numel(); ++i) CHECK(m2[i] == Approx(m[i] / 2).epsilon(1e-14));
    const auto dm = kh::mean_backward(m, x.shape(), dim, 2 * x.extent(dim)), dm1 = kh::mean_backward(m, x.shape(), dim);
    for (Extent i = 0; i < dm.numel(); ++i) CHECK(dm[i] == Approx(dm1[i] / 2).epsilon(1e-14));
    auto [v, idx] = kh::max(x, dim);
    Shape<3> rs = x.shape();
    rs[dim] = 1;
    REQUIRE(s.shape() == rs);
    REQUIRE(v.shape() == rs);
    for (Extent a = 0; a < rs[0]; ++a)
      for (Extent b = 0; b < rs[1]; ++b)
        for (Extent c = 0; c < rs[2]; ++c) {
          double ref = 0, best = -1e300;
          Extent arg = -1;
          for (Extent j = 0; j < x.extent(dim); ++j) {
            const double val = dim == 0 ? x(j, b, c) : dim == 1 ? x(a, j, c) : x(a, b, j);
            ref += val;
            if (val > best) best = val, arg = j;
          }
          CHECK(s(a, b, c) == Approx(ref).epsilon(1e-14));
          CHECK(m(a, b, c) == Approx(ref / double(x.extent(dim))).epsilon(1e-14));
          CHECK(v(a, b, c) == best);
          CHECK(idx(a, b, c) == arg);
        }
    auto dy = normal<double>(rs, 13 + dim);
    using T3 = Tensor<double, 3>;
    kt::check_grad(kh::sum_backward(dy, x.shape(), dim), kt::fd_grad(x, [&](const T3& t) { return kt::dot(kh::sum(t, dim), dy); }));
    kt::check_grad(kh::mean_backward(dy, x.shape(), dim), kt::fd_grad(x, [&](const T3& t) { return kt::dot(kh::mean(t, dim), dy); }));
    kt::check_grad(kh::max_backward(dy, idx, x.shape(), dim),
                   kt::fd_grad(x, [&](const T3& t) { return kt::dot(kh::max(t, dim).values, dy); }));
  }
  // ties go to the first index
  auto t = ones<float>(Shape<2>{2, 4});
  CHECK(kh::max(t, 1).indices(1, 0) == 0);
  kt::require_error([&] { kernels::sum(x, 3); }, {"sum", "dimension 3", "[3, 5, 7]"});
  kt::require_error([&] { kernels::sum_backward(x, x.shape(), 1); }, {"sum_backward", "[3, 5, 7]"});
}

TEST_CASE("permute, transpose, split and concat", "[kernels][transpose]") {
  auto x = arange<std::int32_t>(Shape<4>{2, 3, 4, 5});
  auto y = kh::transpose(x, 1, 2);
  REQUIRE(y.shape() == Shape<4>{2, 4, 3, 5});
  auto p = kh::permute(x, {3, 0, 2, 1});
  REQUIRE(p.shape() == Shape<4>{5, 2, 4, 3});
  for (Extent a = 0; a < 2; ++a)
    for (Extent b = 0; b < 3; ++b)
      for (Extent c = 0; c < 4; ++c)
        for (Extent d = 0; d < 5; ++d) {
          CHECK(y(a, c, b, d) == x(a, b, c, d));
          CHECK(p(d, a, c, b) == x(a, b, c, d));
        }
  CHECK(equal(kh::transpose(y, 1, 2), x));
  auto m = arange<float>(Shape<2>{3, 5});
  auto mt = kh::transpose(m, 0, 1);
  for (Extent i = 0; i < 3; ++i)
    for (Extent j = 0; j < 5; ++j) CHECK(mt(j, i) == m(i, j));

  auto parts = kh::split(x, 3, {1, 0, 4});
  REQUIRE(parts.size() == 3);
  CHECK(parts[1].shape() == Shape<4>{2, 3, 4, 0});
  CHECK(parts[2](1, 2, 3, 1) == x(1, 2, 3, 2));
  CHECK(equal(kh::concat(parts, 3), x));
  auto eq = kh::split(x, 2, 2);
  REQUIRE(eq.size() == 2);
  CHECK(eq[1](0, 0, 0, 0) == x(0, 0, 2, 0));
  CHECK(equal(kh::concat(eq, 2), x));

  kt::require_error([&] { kh::permute(x, {0, 0, 1, 2}); }, {"permute", "[0, 0, 1, 2]"});
  kt::require_error([&] { kh::split(x, 3, {1, 2}); }, {"split", "[1, 2]", "[2, 3, 4, 5]"});
  kt::require_error([&] { kh::split(x, 1, 2); }, {"split", "2 equal parts"});
  std::vector<Tensor<std::int32_t, 4>> bad{x, kh::transpose(x, 1, 2)};
  kt::require_error([&] { kh::concat(bad, 0); }, {"concat", "[2, 4, 3, 5]", "[2, 3, 4, 5]"});
}

}  // namespace test_kernels_host_pointwise
