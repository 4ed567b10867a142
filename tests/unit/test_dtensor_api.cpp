// The typed API: distribute, from_local, redistribute (with the exact collectives each plan
// issues; the CommLog checks live in support/commlog_cases.hpp), full_tensor, plans at compile time, visualize_sharding, cross-mesh transfers (same shape:
// send_to/recv_from; any shapes: redistribute_to).
#include <catch2/catch.hpp>

#include <chrono>

#include "dtensor/dtensor.hpp"
#include "support/commlog_cases.hpp"
#include "support/cross_mesh_cases.hpp"
#include "support/on_ranks.hpp"
#include "support/oracle.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_dtensor_api {

using namespace dtensor;
using namespace dtensor::testing;
using K = CollectiveKind;

using Mesh1 = DeviceMesh<"tp">;
using Mesh2 = DeviceMesh<"dp", "tp">;
using Mesh3 = DeviceMesh<"pp", "dp", "tp">;

// ---- plans are compile-time values
static_assert(plan_redistribution(Layout<Shard<0>>::desc, Layout<Replicate>::desc).count(StepKind::all_gather) == 1);
static_assert(plan_redistribution(Layout<Replicate>::desc, Layout<Shard<1>>::desc).collectives() == 0);
static_assert(plan_redistribution(Layout<Shard<0>, Shard<1>>::desc, Layout<Shard<1>, Shard<0>>::desc).collectives() == 2);
static_assert(plan_redistribution(Layout<Shard<0>, Shard<1>, Shard<2>>::desc,
                                  Layout<Shard<2>, Shard<1>, Shard<0>>::desc).collectives() == 2);
static_assert(plan_redistribution(Layout<Partial<>, Partial<>>::desc, Layout<Replicate, Replicate>::desc).collectives() == 1);

TEST_CASE("1-d mesh: each transition issues exactly its collective", "[redistribute][commlog]") {
  auto f = on_ranks(4, [](CommPtr world, auto report) { check_1d_collectives(Mesh1(world, {4}), report); });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("2-d and 3-d meshes: swapping shards takes two collectives", "[redistribute][commlog]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    check_2d_swap(Mesh2(world, {2, 4}), report);
    check_3d_swap(Mesh3(world, {2, 2, 2}), report);
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("distribute scatters from a source rank; from_local checks pieces", "[distribute]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    Mesh2 mesh(world, {2, 4});
    const auto full = arange<double>(Shape<2>{5, 13});
    const Tensor<double, 2> nothing;
    using L = Layout<Shard<1>, Shard<1>>::ordered<1, 0>;
    auto x = distribute<L>(mesh, mesh.rank() == 3 ? full : nothing, 3);
    if (x.shape() != full.shape()) report("global shape not broadcast");
    if (!equal(x.to_local(), oracle_piece(full, L::desc, mesh.shape(), mesh.coordinate()))) report("distribute piece");
    if (!equal(full_tensor(x), full)) report("full_tensor after distribute");
    // Partial<sum> from a replica: only coordinate 0 keeps values
    auto p = distribute<Layout<Partial<>, Replicate>>(mesh, mesh.rank() == 0 ? full : nothing);
    if (!equal(full_tensor(p), full)) report("distribute to Partial");
    auto y = from_local<L>(mesh, x.to_local(), full.shape());
    if (!equal(full_tensor(y), full)) report("from_local round trip");
    // evenly sharded pieces infer the global shape
    auto z = from_local<Layout<Shard<0>, Replicate>>(mesh, zeros<float>(Shape<2>{3, 2}));
    if (z.shape() != Shape<2>{6, 2}) report("from_local global shape " + to_string(z.shape()));
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("visualize_sharding draws which ranks hold which block", "[visualize]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    Mesh2 mesh(world, {2, 4});
    auto x = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, zeros<float>(Shape<2>{13, 5}));
    const auto s = visualize_sharding(x);
    if (mesh.rank() == 0) {
      if (s.find("(S(0), S(1)) of [13, 5] on mesh dp=2 x tp=4") == std::string::npos) report("header: " + s);
      if (s.find("rows [7, 13)") == std::string::npos || s.find("cols [4, 5)") == std::string::npos) report("ranges: " + s);
      if (s.find("cols [5, 5)") == std::string::npos) report("empty chunk: " + s);
    }
    auto r = distribute_replicated<Layout<Replicate, Shard<0>>>(mesh, zeros<float>(Shape<1>{5}));
    if (mesh.rank() == 0 && visualize_sharding(r).find("0,4") == std::string::npos) report("1-d: " + visualize_sharding(r));
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("a DTensor moves to another mesh of the same shape by send/recv", "[transfer]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    DeviceMesh<"pp", "dp", "tp"> mesh(world, {2, 2, 2});
    auto stage = mesh.sub<"dp", "tp">();
    using L = Layout<Shard<0>, Replicate>;
    const auto full = arange<float>(Shape<2>{7, 3});
    const int pp = mesh.coordinate<"pp">();
    CommLog log;
    if (pp == 0) {
      auto x = distribute_replicated<L>(stage, full);
      send_to(x, mesh.slice<"pp">(1)).wait();
      // and the gradient comes back the other way
      auto g = recv_from<L, float>(stage, mesh.slice<"pp">(1), full.shape());
      if (!equal(full_tensor(g), times(full, 2))) report("gradient back");
    } else {
      auto y = recv_from<L, float>(stage, mesh.slice<"pp">(0), full.shape());
      if (!equal(full_tensor(y), full)) report("transfer values");
      auto g = from_local<L>(stage, times(y.to_local(), 2), full.shape());
      send_to(g, mesh.slice<"pp">(0)).wait();
    }
    if (log.count(K::send) != 1 || log.count(K::recv) != 1) report("transfer issued " + log.to_string());
  });
  INFO(summary(f));
  CHECK(f.empty());
}

// ---- redistribute_to: between meshes of any shape over one root communicator (support/cross_mesh_cases.hpp)

TEST_CASE("redistribute_to: random pairs of meshes (1-d to 4-d, any ranks) move data exactly with the least bytes",
          "[transfer][cross_mesh]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) { cross::check_cross_mesh_pairs(world, report, 6); });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("redistribute_to: the plan prints its links, spreads replicas, and refuses Partial", "[transfer][cross_mesh]") {
  // Replicate over root ranks {0, 1} -> Shard<0> over {1, 2, 3, 4}: rank 1 copies its quarter, the other three
  // quarters come from ranks 0 and 1 in turn; 12 x 3 floats.
  const auto plan = plan_cross_mesh(Layout<Replicate>::desc, MeshRanks<1>{{2}, {0, 1}}, Layout<Shard<0>>::desc,
                                    MeshRanks<1>{{4}, {1, 2, 3, 4}}, Shape<2>{12, 3}, sizeof(float));
  INFO(plan.to_string());
  CHECK(plan.links() == 3);
  CHECK(plan.local_bytes() == 36);
  CHECK(plan.bytes() == 108);
  CHECK(plan.minimum_bytes() == 108);
  CHECK(plan.sent_by(0) + plan.sent_by(1) == 108);
  CHECK(std::max(plan.sent_by(0), plan.sent_by(1)) == 72);  // 2 of the 3 pieces at most on one holder
  CHECK(plan.to_string().find("rank 1 -> rank 1: [0, 3) x [0, 3)  36 B (local copy)") != std::string::npos);
  CHECK(plan.to_string().find("total 108 B over 3 links (minimum 108 B), 36 B copied locally") != std::string::npos);
  // The same ranks and layout: nothing moves.
  const auto same = plan_cross_mesh(Layout<Shard<1>, Replicate>::desc, MeshRanks<2>{{2, 2}, {3, 1, 0, 2}},
                                    Layout<Shard<1>, Replicate>::desc, MeshRanks<2>{{2, 2}, {3, 1, 0, 2}}, Shape<2>{5, 7}, 4);
  CHECK(same.bytes() == 0);
  CHECK(same.local_bytes() == 2 * 5 * 7 * 4);
  CHECK_THROWS_WITH(plan_cross_mesh(Layout<Partial<>>::desc, MeshRanks<1>{{2}, {0, 1}}, Layout<Replicate>::desc,
                                    MeshRanks<1>{{1}, {2}}, Shape<1>{4}, 4),
                    Catch::Contains("Partial"));
  CHECK_THROWS_WITH(plan_cross_mesh(Layout<Replicate>::desc, MeshRanks<1>{{2}, {0, 0}}, Layout<Replicate>::desc,
                                    MeshRanks<1>{{1}, {2}}, Shape<1>{4}, 4),
                    Catch::Contains("twice"));
}

TEST_CASE("redistribute_to: disagreeing ranks all fail before any data moves, none hangs", "[transfer][cross_mesh]") {
  using namespace cross;
  // Source: S(0) over root ranks {0, 1}; destination: R over {1, 2, 3} (rank 1 in both).
  const MeshRanks<1> src{{2}, {0, 1}}, dst{{3}, {1, 2, 3}};
  for (int variant = 0; variant < 4; ++variant) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      const auto sm = mesh_on_ranks<M1>(world, src.shape, src.root_ranks);
      // variant 3: the destination mesh, over ranks {1, 0}, on another root communicator (a copy of
      // the world): both ranks see it. (A rank in one mesh only cannot: its peers on the other
      // communicator never reach it, and the backend's timeout releases it.)
      const CommPtr other = variant == 3 ? world->split(0, world->rank()) : world;
      const MeshRanks<1> d = variant == 3 ? MeshRanks<1>{{2}, {1, 0}} : dst;
      const auto dm = mesh_on_ranks<M1>(other, d.shape, d.root_ranks);
      const auto full = arange<float>(Shape<2>{6, 2});
      // variant 0: rank 3 believes the tensor has 7 rows; 1: rank 2 believes the source is S(1)
      const Shape<2> global = variant == 0 && world->rank() == 3 ? Shape<2>{7, 2} : full.shape();
      try {
        if (sm) {
          DTensor<float, 2, M1, Layout<Shard<0>>> x(*sm, full.shape(), oracle_piece(full, Layout<Shard<0>>::desc, sm->shape(), sm->coordinate()));
          if (dm && variant != 2) (void)redistribute_to<Layout<Replicate>>(x, *dm);
          else redistribute_to<Layout<Replicate>>(x, d);  // variant 2: rank 1 calls the source-only form
        } else if (variant == 1 && world->rank() == 2) {
          (void)redistribute_from<Layout<Shard<1>>, Layout<Replicate>, float>(src, *dm, global);
        } else if (dm) {
          (void)redistribute_from<Layout<Shard<0>>, Layout<Replicate>, float>(src, *dm, global);
        } else {
          return;  // in neither mesh
        }
        report("no error");
      } catch (const Error& e) {
        const std::string m = e.what();
        const char* want[] = {"[7, 2]", "S(1)", "in the destination mesh too", "different root communicators"};
        if (m.find("disagree") == std::string::npos || m.find(want[variant]) == std::string::npos)
          report(detail::cat("variant ", variant, ": ", m));
      }
    });
    INFO(summary(f));
    CHECK(f.empty());
  }
}

TEST_CASE("redistribute_to: meshes on different root communicators seen by ranks of one mesh only fail at the timeout, "
          "saying why", "[transfer][cross_mesh]") {
  using namespace cross;
  // Source: S(0) over root ranks {0, 1} of the world; destination: R over {1, 2} of a copy of the world. Rank 1, in
  // both, sees two roots and reports it. Ranks 0 (source only, the leader) and 2 (destination only) cannot: 2 sends
  // its summary to rank 0 of the copy, where rank 0 does not listen, so the leader's receive from 2 on the world
  // ends at the timeout. Every rank involved must fail, naming the possible cause, long before the default timeout.
  const MeshRanks<1> src{{2}, {0, 1}}, dst{{2}, {1, 2}};
  const auto began = std::chrono::steady_clock::now();
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    world->set_timeout(std::chrono::milliseconds(200));
    const CommPtr other = world->split(0, world->rank());
    other->set_timeout(std::chrono::milliseconds(200));
    const auto sm = mesh_on_ranks<M1>(world, src.shape, src.root_ranks);
    const auto dm = mesh_on_ranks<M1>(other, dst.shape, dst.root_ranks);
    const auto full = arange<float>(Shape<2>{6, 2});
    try {
      if (sm) {
        DTensor<float, 2, M1, Layout<Shard<0>>> x(*sm, full.shape(),
                                                  oracle_piece(full, Layout<Shard<0>>::desc, sm->shape(), sm->coordinate()));
        if (dm) (void)redistribute_to<Layout<Replicate>>(x, *dm);
        else redistribute_to<Layout<Replicate>>(x, dst);
      } else if (dm) {
        (void)redistribute_from<Layout<Shard<0>>, Layout<Replicate>, float>(src, *dm, full.shape());
      } else {
        return;  // in neither mesh
      }
      report("no error");
    } catch (const Error& e) {
      // Which wait ends first is a race (2's send to 0 on the copy, or 0's receive from 2 on the world: on the
      // threads backend the first rank to fail releases the others at once). Whichever it is, every rank names the
      // possible cause; the leader names the silent rank, rank 2 its leader.
      const std::string m = e.what();
      const char* want[] = {"rank 2", "root communicators", "the leader, root rank 0, did not answer"};
      if (m.find("nothing was sent") == std::string::npos || m.find("different root communicators") == std::string::npos ||
          m.find(want[world->rank()]) == std::string::npos)
        report(m);
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
  CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(5));
}

TEST_CASE("plan_of prints a plan", "[plan]") {
  const auto s = plan_of<Layout<Shard<0>, Shard<1>>, Layout<Shard<1>, Shard<0>>, Mesh2>();
  INFO(s);
  CHECK(s.find("2 collective(s)") != std::string::npos);
  CHECK(s.find("all_gather on dp") != std::string::npos);
  CHECK(s.find("all_to_all on tp") != std::string::npos);
  CHECK(plan_of<Layout<Replicate>, Layout<Replicate>, Mesh1>().find("nothing to do") != std::string::npos);
}

TEST_CASE("run-time layouts use the same planner", "[plan]") {
  const LayoutDesc<2> a = Layout<Shard<0>, Partial<>>::desc, b = Layout<Replicate, Shard<1>>::desc;
  const auto p = plan_redistribution(a, b);
  constexpr auto q = plan_redistribution(Layout<Shard<0>, Partial<>>::desc, Layout<Replicate, Shard<1>>::desc);
  REQUIRE(p.size == q.size);
  for (std::size_t i = 0; i < p.size; ++i) CHECK(p.steps[i].kind == q.steps[i].kind);
  CHECK_THROWS_WITH(plan_redistribution(Layout<Partial<>>::desc, Layout<Partial<ReduceOp::max>>::desc),
                    Catch::Contains("Partial<a> to Partial<b>"));
  CHECK_THROWS_WITH(plan_redistribution(Layout<Shard<0>>::desc, Layout<Partial<ReduceOp::avg>>::desc),
                    Catch::Contains("Shard to Partial<avg>"));
}

TEST_CASE("redistribute of a temporary reuses its storage where no step runs, else equals redistribute(const&)",
          "[redistribute][move]") {
  // issue 32: a Linear's exit redistributed its output to the layout it already had, a copy per call
  auto f = on_ranks(4, [](CommPtr world, auto report) {
    Mesh2 mesh(world, {1, 4});  // dp has one rank: a step on it runs nothing
    const auto full = arange<double>(Shape<2>{7, 5});  // 5 columns over 4 ranks: uneven
    using S = Layout<Shard<0>, Shard<1>>;
    auto x = distribute<S>(mesh, full);
    // the same layout: the plan is empty
    auto a = x;
    const double* storage = a.to_local().data();
    auto same = redistribute<S>(std::move(a));
    if (same.to_local().data() != storage) report("same layout: the result is a copy, not the temporary's storage");
    if (!equal(same.to_local(), x.to_local())) report("same layout: values changed");
    // Shard -> Replicate on the one-rank dimension: a plan step that runs nothing
    auto b = x;
    storage = b.to_local().data();
    CommLog log;
    auto dp_replicated = redistribute<Layout<Replicate, Shard<1>>>(std::move(b));
    if (dp_replicated.to_local().data() != storage) report("one-rank step: the result is a copy");
    if (log.count(K::all_gather) != 0) report("one-rank step issued an all-gather");
    if (!equal(full_tensor(dp_replicated), full)) report("one-rank step: full_tensor differs");
    // a step that runs (all-gather on tp): the same result and collectives as from a const&
    auto c = x;
    log.clear();
    auto moved = redistribute<Layout<Shard<0>, Replicate>>(std::move(c));  // dp's Shard<0> of one rank: all rows
    const auto n_moved = log.count(K::all_gather);
    log.clear();
    auto copied = redistribute<Layout<Shard<0>, Replicate>>(x);
    if (n_moved != 1 || log.count(K::all_gather) != 1) report("all_gather count " + std::to_string(n_moved));
    if (!equal(moved.to_local(), full) || !equal(copied.to_local(), full)) report("all-gathered values differ");
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_dtensor_api
