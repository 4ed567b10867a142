// The exhaustive redistribution oracle suite (tests/support/redistribute_cases.hpp, the same
// code the threads and MPI suites run) with every piece in cuda_space and the ranks on one GPU
// (cuda_threads): every pair of layouts from {R, S(0), S(1), P(sum), P(max)} on even, uneven and
// smaller-than-the-mesh extents, other element types, and seeded random cases, bit for bit.
#include <catch2/catch.hpp>

#include "dtensor/comm/cuda_threads.cuh"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/mesh/device_mesh.hpp"
#include "support/on_ranks.hpp"
#include "support/redistribute_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

// The mesh type of each rank count, chosen inside the templates: nvcc 13's front end (cudafe++)
// emits undeclared names for a mesh type (string-literal template arguments) given as an
// explicit template argument in a non-template function (a test body), docs/gpu.md.
template <std::size_t N>
struct OracleMeshOf;
template <>
struct OracleMeshOf<1> {
  using type = DeviceMesh<"x">;
};
template <>
struct OracleMeshOf<2> {
  using type = DeviceMesh<"dp", "tp">;
};
template <>
struct OracleMeshOf<3> {
  using type = DeviceMesh<"pp", "dp", "tp">;
};
using GridMesh = OracleMeshOf<2>::type;

struct GpuRunner {
  template <class F>
  void operator()(int n, F&& fn) const { cuda_threads::run(n, std::forward<F>(fn)); }
};

template <std::size_t N>
std::vector<std::string> all_pairs(const std::array<int, N>& shape, bool with_orders, std::uint64_t stride = 1) {
  int n = 1;
  for (int s : shape) n *= s;
  return on_ranks(
      n,
      [&](CommPtr world, auto report) {
        check_all_pairs<cuda_space>(typename OracleMeshOf<N>::type(world, shape), with_orders, report, stride);
      },
      GpuRunner{});
}

}  // namespace

TEST_CASE("cuda: every layout pair on a 1-d mesh of 4", "[cuda][redistribute][oracle]") {
  auto f = all_pairs<1>({4}, false);
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("cuda: every layout pair on a (2, 2) mesh, with shard orders", "[cuda][redistribute][oracle]") {
  auto f = all_pairs<2>({2, 2}, true);
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("cuda: every layout pair on a (2, 2, 2) mesh", "[cuda][redistribute][oracle]") {
  // Every 7th of the 62 500 cases by default (each collective synchronizes the ranks' streams);
  // DTENSOR_ORACLE_STRIDE=1 runs them all.
  auto f = all_pairs<3>({2, 2, 2}, false, oracle_stride(7));
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("cuda: other element types move bit for bit", "[cuda][redistribute][oracle]") {
  auto f = on_ranks(
      4, [](CommPtr world, auto report) { check_other_element_types<cuda_space>(GridMesh(world, {2, 2}), report); },
      GpuRunner{});
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("cuda: random layouts and extents", "[cuda][redistribute][random]") {
  auto f = on_ranks(
      6, [](CommPtr world, auto report) { check_random<cuda_space>(GridMesh(world, {3, 2}), 11, random_cases(100), report); },
      GpuRunner{});
  INFO(summary(f));
  CHECK(f.empty());
}
