// The dry run (DESIGN.md §7a, docs/dry-run.md): the sim communicator, meshes built on it, meta
// DTensors redistributed on it (the same CommLog as real tensors on the threads backend), the
// reports per rank class, the cost model and the published figures it must reproduce.
#include <catch2/catch.hpp>

#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dtensor/comm/sim.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "support/on_ranks.hpp"
#include "support/redistribute_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

/// One line per record with every field the backends fill in, so that two logs compare as text.
std::string log_lines(const std::vector<CommRecord>& records) {
  std::string s;
  for (const auto& r : records)
    s += detail::cat(name_of(r.kind), " group=", r.group, " size=", r.group_size, " bytes=", r.bytes,
                     " dtype=", name_of(r.dtype), " op=", name_of(r.op), " peer=", r.peer, "\n");
  return s;
}

/// A redistribution known at run time: a tensor of rank 1-3, its extents and two layouts.
template <std::size_t N>
struct RedistributionCase {
  int rank = 1;
  Shape<3> global{};
  LayoutDesc<N> from, to;
};

/// `count` valid random cases drawn from `seed`: extents 0..13 (uneven, smaller than the mesh).
template <std::size_t N>
std::vector<RedistributionCase<N>> random_redistributions(std::uint64_t seed, int count) {
  std::mt19937_64 g(seed);
  std::vector<RedistributionCase<N>> cases;
  while (int(cases.size()) < count) {
    RedistributionCase<N> c;
    c.rank = 1 + int(g() % 3);
    for (int d = 0; d < c.rank; ++d) c.global[std::size_t(d)] = Extent(g() % 14);
    c.from = random_layout<N>(g, c.rank);
    c.to = random_layout<N>(g, c.rank);
    if (!redistribution_error(c.from, c.to)) cases.push_back(c);
  }
  return cases;
}

/// Runs every case on this rank's piece in memory space Space (zeros on the host: only the
/// collectives matter here) and returns the CommLog of all of them.
template <class Space, class Mesh, std::size_t N>
std::vector<CommRecord> run_cases(const Mesh& mesh, const std::vector<RedistributionCase<N>>& cases) {
  CommLog log;
  auto one = [&]<std::size_t R>(const RedistributionCase<N>& c) {
    Shape<R> global{};
    for (std::size_t d = 0; d < R; ++d) global[d] = c.global[d];
    const auto box = local_box(c.from, mesh.shape(), mesh.coordinate(), global);
    (void)execute(plan_redistribution(c.from, c.to), Tensor<float, R, Space>(box.extent), mesh, global);
  };
  for (const auto& c : cases) {
    if (c.rank == 1) one.template operator()<1>(c);
    else if (c.rank == 2) one.template operator()<2>(c);
    else one.template operator()<3>(c);
  }
  return log.records();
}

/// The cases on a threads mesh with host tensors and, rank by rank, on a sim mesh with meta
/// tensors; "" when every rank's logs agree, else the first rank that differs and both logs.
template <fixed_string... Names, std::size_t N = sizeof...(Names)>
std::string compare_with_threads(const std::array<int, N>& shape, std::uint64_t seed, int count) {
  const auto cases = random_redistributions<N>(seed, count);
  int n = 1;
  for (int s : shape) n *= s;
  std::vector<std::vector<CommRecord>> real(std::size_t(n), std::vector<CommRecord>{});
  std::mutex m;
  threads::run(n, [&](CommPtr world) {
    DeviceMesh<Names...> mesh(world, shape);
    auto records = run_cases<host_space>(mesh, cases);
    std::lock_guard lock(m);
    real[std::size_t(world->rank())] = std::move(records);
  });
  for (int r = 0; r < n; ++r) {
    const auto dry = run_cases<meta_space>(MetaMesh<Names...>(sim::world(r, n), shape), cases);
    const auto a = log_lines(real[std::size_t(r)]), b = log_lines(dry);
    if (a != b) return detail::cat("mesh ", to_string(shape), " rank ", r, ":\nthreads:\n", a, "sim:\n", b);
  }
  return "";
}

}  // namespace

TEST_CASE("sim: a world of 16,384 ranks, and meshes on it, without peers", "[sim]") {
  auto world = sim::world(12345, 16384);
  CHECK(world->rank() == 12345);
  CHECK(world->size() == 16384);
  CHECK(world->backend() == "sim");
  MetaMesh<"pp", "dp", "tp"> mesh(world, {16, 128, 8});
  // 12345 = ((12 * 128) + 7) * 8 + 1
  CHECK(mesh.coordinate() == std::array{12, 7, 1});
  CHECK((mesh.group<"tp">().size() == 8 && mesh.group<"tp">().rank() == 1));
  CHECK((mesh.group<"dp">().size() == 128 && mesh.group<"dp">().rank() == 7));
  CHECK((mesh.group<"pp">().size() == 16 && mesh.group<"pp">().rank() == 12));
  CHECK((mesh.group(1, 2).size() == 1024 && mesh.group(1, 2).rank() == 7 * 8 + 1));
  CHECK(mesh.group(1, 2).label() == "dp*tp");
  CHECK(mesh.group<"dp">().world_rank() == 12345);

  // Every call returns at once and is logged as the real backends log it.
  CommLog log;
  std::vector<float> buf(4);
  mesh.group<"tp">().all_reduce(std::span<float>(buf), ReduceOp::sum);
  mesh.group<"pp">().send(std::span<const float>(buf), 13);
  auto w = mesh.group<"dp">().all_gather_async(std::span<const float>(buf.data(), 1), std::span<float>(static_cast<float*>(nullptr), 128));
  CHECK(w.done());
  REQUIRE(log.size() == 3);
  CHECK(log_lines(log.records()) ==
        "all_reduce group=tp size=8 bytes=16 dtype=float32 op=sum peer=-1\n"
        "send group=pp size=16 bytes=16 dtype=float32 op=sum peer=13\n"
        "all_gather group=dp size=128 bytes=512 dtype=float32 op=sum peer=-1\n");
  // The argument checks are the Communicator's, as on every backend.
  CHECK_THROWS_WITH(mesh.group<"pp">().send(std::span<const float>(buf), 16),
                    Catch::Contains("peer 16 is not a rank of this group of 16"));
}

TEST_CASE("sim: bad worlds and splits without a known group are errors", "[sim][errors]") {
  CHECK_THROWS_WITH(sim::world(4, 4), Catch::Contains("rank 4 of a world of 4 ranks"));
  CHECK_THROWS_WITH(sim::world(0, 0), Catch::Contains("rank 0 of a world of 0 ranks"));
  auto world = sim::world(3, 8);
  CHECK_THROWS_WITH(world->split(0, 3), Catch::Contains("no peers to learn the group from"));
  CHECK_THROWS_WITH(world->split(0, 3, 2), Catch::Contains("key 3 in a group of 2"));
  CHECK_THROWS_WITH((DeviceMesh<"a", "b">(world, {3, 3})), Catch::Contains("has 9 ranks but the communicator has 8"));
  auto g = world->split(1, 1, 4);
  CHECK((g->size() == 4 && g->rank() == 1 && g->world_rank() == 3));
}

TEST_CASE("split with a known group checks it on a real backend", "[sim][errors]") {
  auto failures = on_ranks(4, [](CommPtr world, auto report) {
    // Two groups of two, this rank at index rank % 2: what split(color, key) gives.
    auto g = world->split(world->rank() / 2, world->rank() % 2, 2);
    if (g->size() != 2 || g->rank() != world->rank() % 2) report("wrong group");
    // Claiming a group of 4 where the split gives 2 fails on every rank.
    try {
      (void)world->split(world->rank() / 2, world->rank() % 2, 4);
      report("a wrong group size did not throw");
    } catch (const Error& e) {
      if (std::string(e.what()).find("expected a group of 4 ranks") == std::string::npos) report(e.what());
    }
  });
  INFO(summary(failures));
  CHECK(failures.empty());
}

TEST_CASE("sim: meta redistributions log what real ones log on threads", "[sim][redistribute]") {
  // Random layouts (every placement, Partial op and split order), extents 0..13: uneven and
  // smaller than the mesh; the planner is shared, so every rank's log must be the same.
  CHECK(compare_with_threads<"x">({4}, 1701, 60) == "");
  CHECK(compare_with_threads<"x">({3}, 1702, 60) == "");
  CHECK(compare_with_threads<"a", "b">({2, 3}, 1703, 60) == "");
  CHECK(compare_with_threads<"a", "b">({4, 2}, 1704, 60) == "");
  CHECK(compare_with_threads<"a", "b", "c">({2, 2, 2}, 1705, 40) == "");
  CHECK(compare_with_threads<"a", "b", "c">({1, 2, 3}, 1706, 40) == "");
}

TEST_CASE("sim: a typed meta DTensor redistributes on a sim mesh of 16,384 ranks", "[sim][redistribute]") {
  using Mesh = MetaMesh<"dp", "tp">;
  using Sharded = Layout<Shard<0>, Shard<1>>;
  Mesh mesh(sim::world(8 * 2047 + 7, 16384), {2048, 8});
  // Uneven in both dimensions: 5000 rows over 2048 ranks (chunks of 3, the last ranks empty),
  // 1001 columns over 8.
  const Shape<2> global{5000, 1001};
  const auto box = local_box(Sharded::desc, mesh.shape(), mesh.coordinate(), global);
  CHECK(box.extent == Shape<2>{0, 1001 - 7 * 126});
  DTensor<float, 2, Mesh, Sharded> x(mesh, global, Tensor<float, 2, meta_space>(box.extent));
  CommLog log;
  auto y = redistribute<Layout<Replicate, Replicate>>(x);
  CHECK(y.to_local().shape() == global);
  CHECK(y.to_local().data() == nullptr);
  // One all-gather per mesh dimension, padded to the largest chunk: rows over "dp" (3 rows of
  // this rank's 119 columns from each of 2048 ranks), then columns over "tp" (126 of 8).
  REQUIRE(log.size() == 2);
  CHECK(log.count(CollectiveKind::all_gather, "dp") == 1);
  CHECK(log.count(CollectiveKind::all_gather, "tp") == 1);
  CHECK(log.bytes() == sizeof(float) * (3 * 119 * 2048 + 5000 * 126 * 8));
}
