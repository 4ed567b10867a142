// Randomized property test: thousands of random (mesh of 1-3 dimensions, tensor of rank 1-3,
// extents including 0, uneven and smaller than the mesh, layouts with any placements and
// shard orders) cases, each checked bit for bit against the single-rank oracle. Seeded and
// reproducible: a failure prints its case; DTENSOR_RANDOM_CASES scales the count.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "dtensor/mesh/device_mesh.hpp"
#include "support/on_ranks.hpp"
#include "support/oracle.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

int cases_per_mesh() {
  const char* e = std::getenv("DTENSOR_RANDOM_CASES");
  return e ? std::atoi(e) : 250;
}

template <std::size_t N>
LayoutDesc<N> random_layout(std::mt19937_64& g, int tensor_rank) {
  LayoutDesc<N> l;
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  for (std::size_t i = 0; i < N; ++i) {
    switch (g() % 4) {
      case 0: l.placements[i] = PlacementDesc::replicate(); break;
      case 1: l.placements[i] = PlacementDesc::partial(ops[g() % 4]); break;
      default: l.placements[i] = PlacementDesc::shard(int(g() % std::uint64_t(tensor_rank))); break;
    }
    l.priority[i] = int(g() % 8);  // a random split order for shared dimensions
  }
  return l;
}

template <std::size_t R, class Mesh, std::size_t N>
void random_case(const Mesh& mesh, std::mt19937_64& g, std::uint64_t id, auto& report) {
  Shape<R> global{};
  for (auto& e : global) e = Extent(g() % 14);  // 0 .. 13
  auto from = random_layout<N>(g, int(R));
  auto to = random_layout<N>(g, int(R));
  if (redistribution_error(from, to)) return;
  const auto msg = check_redistribution<float>(mesh, from, to, global, id);
  if (!msg.empty()) report(detail::cat("case ", id, ": ", msg));
}

template <class Mesh, std::size_t N>
std::vector<std::string> run_random(const std::array<int, N>& shape, std::uint64_t seed) {
  int n = 1;
  for (int s : shape) n *= s;
  return on_ranks(n, [&](CommPtr world, auto report) {
    Mesh mesh(world, shape);
    std::mt19937_64 g(seed);  // the same sequence of cases on every rank
    for (int c = 0; c < cases_per_mesh(); ++c) {
      const std::uint64_t id = seed * 100000 + std::uint64_t(c);
      switch (g() % 3) {
        case 0: random_case<1, Mesh, N>(mesh, g, id, report); break;
        case 1: random_case<2, Mesh, N>(mesh, g, id, report); break;
        default: random_case<3, Mesh, N>(mesh, g, id, report); break;
      }
    }
  });
}

}  // namespace

TEST_CASE("random redistributions match the oracle", "[redistribute][random]") {
  std::vector<std::string> f;
  auto add = [&](std::vector<std::string> more) { f.insert(f.end(), more.begin(), more.end()); };
  std::uint64_t seed = 2026;
  for (int n : {1, 2, 3, 4, 5, 8}) add(run_random<DeviceMesh<"x">, 1>({n}, seed++));
  for (auto s : {std::array{2, 2}, std::array{3, 2}, std::array{2, 4}, std::array{4, 2}, std::array{1, 3}})
    add(run_random<DeviceMesh<"a", "b">, 2>(s, seed++));
  for (auto s : {std::array{2, 2, 2}, std::array{1, 2, 3}, std::array{2, 1, 2}, std::array{3, 1, 2}})
    add(run_random<DeviceMesh<"a", "b", "c">, 3>(s, seed++));
  INFO(summary(f));
  CHECK(f.empty());
}
