#include <catch2/catch.hpp>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"

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
