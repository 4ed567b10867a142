// Overflow: every product of extents, mesh sizes and byte counts is checked, and a product that
// does not fit is a dtensor::Error quoting the values — never a wrapped number (a tensor of
// numel 0, a mesh of size 1) that turns into a crash or a silently wrong result later.
#include <catch2/catch.hpp>

#include <array>
#include <climits>
#include <cstdint>

#include "dtensor/dtensor.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_overflow {

using namespace dtensor;
using namespace dtensor::hardening;
using Catch::Contains;

TEST_CASE("a tensor whose element count overflows is an Error, not an empty tensor", "[hardening][overflow]") {
  const Extent big = Extent(1) << 32;
  auto o = outcome_of_call([&] { Tensor<float, 2> t(Shape<2>{big, big}); });
  INFO(o.message);
  CHECK(o.is_error);
  CHECK_THAT(o.message, Contains("Tensor") && Contains("[4294967296, 4294967296]") && Contains("overflows"));

  o = outcome_of_call([&] { (void)Tensor<double, 3>::uninitialized(Shape<3>{Extent(1) << 40, Extent(1) << 30, 2}); });
  CHECK(o.is_error);
  CHECK_THAT(o.message, Contains("overflows"));

  // Fits in an Extent but not as a byte count of 8-byte elements.
  o = outcome_of_call([&] { (void)Tensor<double, 1>::uninitialized(Shape<1>{Extent(1) << 62}); });
  CHECK(o.is_error);
  CHECK_THAT(o.message, Contains("Tensor") && Contains("4611686018427387904 elements of 8 bytes"));

  // Representable but not allocatable: an Error, not std::bad_alloc. (AddressSanitizer's allocator
  // aborts on such a request instead of throwing, as ThreadSanitizer's does: this part runs only without them.)
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  o = outcome_of_call([&] { (void)Tensor<float, 1>::uninitialized(Shape<1>{Extent(1) << 58}); });
  CHECK(o.is_error);
  CHECK_THAT(o.message, Contains("Tensor") && Contains("cannot allocate"));
#endif
}

TEST_CASE("negative extents are rejected by Tensor, reshape and from_local", "[hardening][overflow]") {
  auto o = outcome_of_call([] { Tensor<float, 2> t(Shape<2>{-1, 4}); });
  CHECK(o.is_error);
  CHECK_THAT(o.message, Contains("extent -1 of dimension 0 in [-1, 4] is negative"));

  o = outcome_of_call([] { (void)Tensor<float, 2>(Shape<2>{2, 2}).reshape(Shape<2>{-2, -2}); });
  CHECK(o.is_error);
  CHECK_THAT(o.message, Contains("reshape") && Contains("negative"));

  auto out = outcomes(2, [](CommPtr w) {
    DeviceMesh<"tp"> mesh(w, {2});
    (void)from_local<Layout<Shard<0>>>(mesh, Tensor<float, 2>(Shape<2>{0, 4}), Shape<2>{-4, 4});
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("from_local") && Contains("[-4, 4]") && Contains("negative"));
  }
}

TEST_CASE("a mesh whose number of ranks overflows int is an Error, not a mesh of size 1", "[hardening][overflow]") {
  auto out = outcomes(1, [](CommPtr w) { DeviceMesh<"a", "b">(w, {2147483647, 2147483647}); });
  INFO(out[0].message);
  CHECK(out[0].is_error);
  CHECK_THAT(out[0].message, Contains("DeviceMesh") && Contains("[2147483647, 2147483647]") && Contains("overflows"));

  // 65536 x 65536 wraps to exactly 0 in 32 bits.
  out = outcomes(1, [](CommPtr w) { DeviceMesh<"a", "b">(w, {65536, 65536}); });
  CHECK(out[0].is_error);
  CHECK_THAT(out[0].message, Contains("[65536, 65536]") && Contains("overflows"));
}

TEST_CASE("from_local's global extents (local extents times shards) are checked", "[hardening][overflow]") {
  auto out = outcomes(2, [](CommPtr w) {
    DeviceMesh<"tp"> mesh(w, {2});
    // An empty piece (numel 0) whose extent along the sharded dimension, times 2, overflows.
    (void)from_local<Layout<Shard<0>>>(mesh, Tensor<float, 2>(Shape<2>{Extent(1) << 62, 0}));
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("from_local") && Contains("4611686018427387904 x 2 overflows"));
  }
}

}  // namespace hardening_overflow
