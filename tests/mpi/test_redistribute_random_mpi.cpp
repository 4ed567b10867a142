// The randomized property test of tests/unit/test_redistribute_random.cpp under MPI: random
// tensors of rank 1-3 (extents 0..13, so uneven and smaller than the mesh), random pairs of
// layouts with any placements and shard orders, bit for bit against the single-rank oracle, on
// every mesh of 1-3 dimensions the job's size allows. Seeded and reproducible (a failure names
// its case id); 60 cases per mesh by default so that 8 oversubscribed ranks finish quickly,
// DTENSOR_RANDOM_CASES=n for more, DTENSOR_RANDOM_SEED=s for another sequence.
#include <cstdlib>

#include "dtensor/comm/mpi.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "mpi_check.hpp"
#include "mpi_meshes.hpp"
#include "support/redistribute_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

std::uint64_t base_seed() {
  const char* e = std::getenv("DTENSOR_RANDOM_SEED");
  return e && *e ? std::strtoull(e, nullptr, 10) : 4711;
}

/// The random suite on every mesh of N dimensions for this job; seeds differ per mesh.
template <fixed_string... Names>
void random_on_meshes(const CommPtr& world, std::uint64_t seed) {
  constexpr std::size_t N = sizeof...(Names);
  for (const auto& shape : mesh_shapes<N>(world->size())) {
    INFO("mesh " << to_string(shape) << ", seed " << seed);
    auto f = collect([&](auto& report) { check_random(DeviceMesh<Names...>(world, shape), seed, random_cases(60), report); });
    DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
    ++seed;
  }
}

}  // namespace

TEST_CASE("random redistributions match the oracle on 1-d meshes", "[mpi][redistribute][random]") {
  random_on_meshes<"x">(mpi::world(), base_seed());
}

TEST_CASE("random redistributions match the oracle on 2-d meshes", "[mpi][redistribute][random]") {
  random_on_meshes<"a", "b">(mpi::world(), base_seed() + 10);
}

TEST_CASE("random redistributions match the oracle on 3-d meshes", "[mpi][redistribute][random]") {
  random_on_meshes<"a", "b", "c">(mpi::world(), base_seed() + 20);
}
