// The planner's choices and the executor's entry points: the collectives each plan issues
// (CommLog, exact), never more than PyTorch DTensor's greedy planner on (2, 2) and (2, 2, 2)
// meshes, no collective on groups of one rank, merged collectives over flattened groups,
// Plan::estimate against CommLog's bytes, redistribute_into and redistribute_async.
#include <catch2/catch.hpp>

#include <vector>

#include "dtensor/dtensor.hpp"
#include "support/commlog_cases.hpp"
#include "support/on_ranks.hpp"
#include "support/oracle.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_redistribute_plan {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

/// The steps PyTorch DTensor's greedy planner (_gen_transform_infos) takes, one per mesh
/// dimension: first from the innermost mesh dimension outwards, replicating where a nested
/// shard is misaligned, then outwards-in for what is left. Empty when PyTorch refuses the pair
/// (Shard to Partial).
template <std::size_t N>
std::vector<Step> torch_greedy_steps(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  auto current = from.placements;
  std::vector<Step> steps;
  bool refused = false;
  auto emit = [&](int i, PlacementDesc target) {
    const PlacementDesc was = current[std::size_t(i)];
    Step s{StepKind::take_chunk, i, i, was, target};
    if (target.is_replicate()) s.kind = was.is_partial() ? StepKind::all_reduce : StepKind::all_gather;
    else if (target.is_shard()) s.kind = was.is_partial() ? StepKind::reduce_scatter : was.is_replicate() ? StepKind::take_chunk : StepKind::all_to_all;
    else if (was.is_replicate()) s.kind = StepKind::replicate_to_partial;
    else refused = true;
    steps.push_back(s);
    current[std::size_t(i)] = target;
  };
  bool sharded = false;
  for (const auto& p : from.placements) sharded = sharded || p.is_shard();
  if (sharded)
    for (int i = int(N) - 1; i >= 0; --i) {
      PlacementDesc target = to.placements[std::size_t(i)];
      if (target.is_shard()) {
        std::vector<int> now, wanted;  // mesh dimensions before i that shard the same tensor dimension
        for (int j = 0; j < i; ++j) {
          if (current[std::size_t(j)].is_shard(target.dim)) now.push_back(j);
          if (to.placements[std::size_t(j)].is_shard(target.dim)) wanted.push_back(j);
        }
        if (now != wanted) target = PlacementDesc::replicate();
      }
      if (!(current[std::size_t(i)] == target)) emit(i, target);
    }
  for (int i = 0; i < int(N); ++i)
    if (!(current[std::size_t(i)] == to.placements[std::size_t(i)])) emit(i, to.placements[std::size_t(i)]);
  if (refused) return {};
  return steps;
}

/// Every pair over {R, S(0), S(1), P} on an N-d mesh of shape `mesh_shape`: this planner takes
/// no more collectives than PyTorch's and sends no more bytes (for a 16 x 16 float tensor).
template <std::size_t N>
std::vector<std::string> compare_with_torch(const std::array<int, N>& mesh_shape) {
  const std::vector<PlacementDesc> choices = {PlacementDesc::replicate(), PlacementDesc::shard(0),
                                              PlacementDesc::shard(1), PlacementDesc::partial()};
  const Shape<2> global{16, 16};  // even at every split: padding is not what is compared
  std::vector<std::string> failures;
  int compared = 0, fewer_bytes = 0;
  for (const auto& from : all_layouts<N>(choices))
    for (const auto& to : all_layouts<N>(choices)) {
      if (redistribution_error(from, to)) continue;
      const auto torch_steps = torch_greedy_steps(from, to);
      if (torch_steps.empty() && !(from == to)) continue;
      Plan<N> torch_plan;
      torch_plan.from = from;
      torch_plan.to = to;
      for (const auto& s : torch_steps) torch_plan.steps[torch_plan.size++] = s;
      const auto ours = plan_redistribution(from, to);
      const auto ours_bytes = ours.estimate(mesh_shape, global, sizeof(float)).wire.sent;
      const auto torch_bytes = torch_plan.estimate(mesh_shape, global, sizeof(float)).wire.sent;
      ++compared;
      fewer_bytes += ours_bytes < torch_bytes;
      if (ours.collectives() > torch_plan.collectives() || ours_bytes > torch_bytes)
        failures.push_back(detail::cat(to_string(from), " -> ", to_string(to), ": ", ours.collectives(),
                                       " collective(s) and ", ours_bytes, " B here, ", torch_plan.collectives(),
                                       " and ", torch_bytes, " B in PyTorch"));
    }
  if (compared < 100) failures.push_back(detail::cat("only ", compared, " pairs compared"));
  if (fewer_bytes == 0) failures.push_back("no pair moves fewer bytes than PyTorch's plan");
  return failures;
}

using Mesh2 = DeviceMesh<"dp", "tp">;
using Mesh3 = DeviceMesh<"pp", "dp", "tp">;

/// Runs redistribute<To>(x) under a CommLog; reports if the kinds and groups differ from
/// `want` or the pieces from the oracle.
template <class To, class X, class Report>
void expect_plan(const X& x, const Tensor<float, 2>& full, int factor, const std::string& want, Report&& report) {
  std::vector<CommRecord> log;
  typename with_layout<X, To>::type y;
  {
    CommLog scope;
    y = redistribute<To>(x);
    log = scope.records();
  }
  const std::string what = to_string(X::layout::desc) + " -> " + to_string(To::desc);
  if (kinds(log) != want) report(what + ": issued " + kinds(log) + ", want " + want);
  const auto& mesh = x.mesh();
  if (!equal(y.to_local(), times(oracle_piece(full, To::desc, mesh.shape(), mesh.coordinate()), factor)))
    report(what + ": piece differs from the oracle");
}

}  // namespace

// ---- the plans of the cases, at compile time
static_assert(plan_redistribution(Layout<Partial<>, Partial<>>::desc, Layout<Shard<0>, Shard<0>>::desc).count(
                  StepKind::reduce_scatter) == 1);
static_assert(plan_redistribution(Layout<Partial<>, Partial<>>::desc, Layout<Shard<0>, Shard<0>>::desc).count(
                  StepKind::all_reduce) == 0);
static_assert(plan_redistribution(Layout<Shard<0>, Shard<0>>::desc, Layout<Replicate, Replicate>::desc).collectives() == 1);
static_assert(plan_redistribution(Layout<Partial<>, Replicate, Partial<>>::desc,
                                  Layout<Replicate, Replicate, Replicate>::desc).collectives() == 1);
static_assert(plan_redistribution(Layout<Partial<>>::desc, Layout<Shard<1>>::desc).count(StepKind::reduce_scatter) == 1);

TEST_CASE("never more collectives or bytes than PyTorch's greedy planner", "[plan]") {
  auto f2 = compare_with_torch<2>({2, 2});
  INFO(summary(f2));
  CHECK(f2.empty());
  auto f3 = compare_with_torch<3>({2, 2, 2});
  INFO(summary(f3));
  CHECK(f3.empty());
}

TEST_CASE("Partial -> Shard is one reduce-scatter over the flattened group", "[plan][commlog]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    Mesh2 mesh(world, {4, 2});
    const auto full = randint<float>(Shape<2>{13, 5}, 3, -8, 9);
    auto p = from_local<Layout<Partial<>, Partial<>>>(mesh, full, full.shape());
    expect_plan<Layout<Shard<0>, Shard<0>>>(p, full, 8, "reduce_scatter(dp*tp) ", report);
    expect_plan<Layout<Shard<1>, Shard<0>>>(p, full, 8, "reduce_scatter(dp) reduce_scatter(tp) ", report);
    // the reduce-scatter first: the all-reduce then moves a quarter of the bytes
    expect_plan<Layout<Replicate, Shard<1>>>(p, full, 8, "reduce_scatter(tp) all_reduce(dp) ", report);
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("all-gathers and all-reduces merge over flattened groups", "[plan][commlog]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    const auto full = randint<float>(Shape<2>{13, 5}, 4, -8, 9);
    Mesh2 m2(world, {4, 2});
    auto s = distribute_replicated<Layout<Shard<0>, Shard<0>>>(m2, full);
    expect_plan<Layout<Replicate, Replicate>>(s, full, 1, "all_gather(dp*tp) ", report);
    auto so = distribute_replicated<Layout<Shard<0>, Shard<0>>::ordered<1, 0>>(m2, full);
    expect_plan<Layout<Replicate, Replicate>>(so, full, 1, "all_gather(dp*tp) ", report);
    Mesh3 m3(world, {2, 2, 2});
    auto p = from_local<Layout<Partial<>, Replicate, Partial<>>>(m3, full, full.shape());
    expect_plan<Layout<Replicate, Replicate, Replicate>>(p, full, 4, "all_reduce(pp*dp*tp) ", report);
    auto q = from_local<Layout<Partial<ReduceOp::max>, Replicate, Partial<ReduceOp::max>>>(m3, full, full.shape());
    expect_plan<Layout<Replicate, Replicate, Replicate>>(q, full, 1, "all_reduce(pp*dp*tp) ", report);
    auto t = distribute_replicated<Layout<Replicate, Shard<1>, Shard<1>>>(m3, full);
    expect_plan<Layout<Replicate, Replicate, Replicate>>(t, full, 1, "all_gather(dp*tp) ", report);
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("mesh dimensions of size 1 issue nothing", "[plan][commlog]") {
  auto f = on_ranks(4, [](CommPtr world, auto report) {
    const auto full = randint<float>(Shape<2>{7, 5}, 5, -8, 9);
    Mesh2 mesh(world, {4, 1});
    auto x = from_local<Layout<Shard<0>, Partial<>>>(
        mesh, oracle_piece(full, Layout<Shard<0>, Partial<>>::desc, mesh.shape(), mesh.coordinate()), full.shape());
    expect_plan<Layout<Shard<0>, Replicate>>(x, full, 1, "", report);
    expect_plan<Layout<Shard<0>, Shard<1>>>(x, full, 1, "", report);
    auto r = distribute_replicated<Layout<Replicate, Shard<0>>>(mesh, full);
    expect_plan<Layout<Replicate, Replicate>>(r, full, 1, "", report);
    expect_plan<Layout<Shard<1>, Replicate>>(r, full, 1, "", report);
    Mesh2 wide(world, {1, 4});
    auto w = distribute_replicated<Layout<Shard<0>, Shard<1>>>(wide, full);
    expect_plan<Layout<Replicate, Replicate>>(w, full, 1, "all_gather(tp) ", report);
    expect_plan<Layout<Shard<1>, Shard<0>>>(w, full, 1, "all_to_all(tp) ", report);
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("Plan::estimate counts the bytes CommLog records", "[plan][commlog]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    Mesh2 mesh(world, {4, 2});
    const std::vector<PlacementDesc> choices = {PlacementDesc::replicate(), PlacementDesc::shard(0),
                                                PlacementDesc::shard(1), PlacementDesc::partial()};
    const auto layouts = all_layouts<2>(choices);
    for (const Shape<2>& global : {Shape<2>{8, 12}, Shape<2>{13, 5}, Shape<2>{3, 1}}) {
      const auto full = randint<float>(global, 6, -8, 9);
      for (const auto& from : layouts)
        for (const auto& to : layouts) {
          if (redistribution_error(from, to)) continue;
          const auto plan = plan_redistribution(from, to);
          CommLog log;
          auto out = execute(plan, oracle_piece(full, from, mesh.shape(), mesh.coordinate()), mesh, global);
          const auto e = plan.estimate(mesh.shape(), global, sizeof(float), LinkModel{}, mesh.coordinate());
          const auto w = log.wire();
          if (w.sent != e.wire.sent || w.received != e.wire.received || int(log.size()) != e.collectives)
            report(detail::cat(to_string(from), " -> ", to_string(to), " of ", to_string(global), ": estimate ",
                               e.to_string(), "log:\n", log.to_string()));
          if (log.size() > 0 && !(e.seconds > 0)) report("no time estimated");
        }
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("an estimate prints bytes and time", "[plan]") {
  constexpr auto plan = plan_redistribution(Layout<Partial<>, Partial<>>::desc, Layout<Shard<0>, Shard<0>>::desc);
  const auto e = plan.estimate(std::array<int, 2>{4, 2}, Shape<2>{1024, 1024}, sizeof(float),
                               LinkModel{10e-6, 1e9});
  INFO(e.to_string());
  CHECK(e.collectives == 1);
  CHECK(e.wire.sent == 4u * 1024 * 1024 * 7 / 8);  // (n-1)/n of the buffer
  CHECK(e.seconds == Approx(10e-6 + double(e.wire.sent) / 1e9));
  CHECK(e.to_string().find("reduce_scatter over 8 rank(s)") != std::string::npos);
}

TEST_CASE("redistribute_into reuses the result's storage", "[redistribute]") {
  auto f = on_ranks(4, [](CommPtr world, auto report) {
    Mesh2 mesh(world, {2, 2});
    for (const Shape<2>& global : {Shape<2>{8, 12}, Shape<2>{13, 5}, Shape<2>{1, 3}}) {
      const auto full = randint<float>(global, 7, -8, 9);
      auto x = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, full);
      DTensor<float, 2, Mesh2, Layout<Shard<1>, Replicate>> y;
      redistribute_into(y, x);
      const float* storage = y.to_local().data();
      if (!equal(y.to_local(), redistribute<Layout<Shard<1>, Replicate>>(x).to_local())) report("first call differs");
      redistribute_into(y, x);
      if (y.to_local().data() != storage) report("the second call allocated a new result");
      if (!equal(y.to_local(), oracle_piece(full, Layout<Shard<1>, Replicate>::desc, mesh.shape(), mesh.coordinate())))
        report("second call differs from the oracle");
      DTensor<float, 2, Mesh2, Layout<Shard<0>, Shard<1>>> same;
      redistribute_into(same, x);  // nothing to do: a copy
      if (!equal(same.to_local(), x.to_local())) report("the copy differs");
      auto p = from_local<Layout<Partial<>, Replicate>>(mesh, full, global);
      DTensor<float, 2, Mesh2, Layout<Replicate, Replicate>> r;
      redistribute_into(r, p);
      const float* rs = r.to_local().data();
      redistribute_into(r, p);
      if (r.to_local().data() != rs || !equal(r.to_local(), times(full, 2))) report("all-reduce into");
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("redistribute_async equals redistribute and issues the same collectives", "[redistribute]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    Mesh2 mesh(world, {4, 2});
    const auto full = randint<float>(Shape<2>{13, 6}, 8, -8, 9);
    auto check = [&]<class To>(const auto& x, To) {
      std::vector<CommRecord> blocking, split;
      typename with_layout<std::decay_t<decltype(x)>, To>::type want, got;
      {
        CommLog log;
        want = redistribute<To>(x);
        blocking = log.records();
      }
      {
        CommLog log;
        auto pending = redistribute_async<To>(x);
        auto other = times(full, 3);  // work between issue and wait, on other data
        (void)other;
        got = pending.wait();
        split = log.records();
      }
      const std::string what = to_string(std::decay_t<decltype(x)>::layout::desc) + " -> " + to_string(To::desc);
      if (kinds(blocking) != kinds(split)) report(what + ": blocking " + kinds(blocking) + ", async " + kinds(split));
      if (!equal(got.to_local(), want.to_local())) report(what + ": pieces differ");
    };
    auto s = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, full);
    auto p = from_local<Layout<Partial<>, Partial<>>>(mesh, full, full.shape());
    check(s, Layout<Replicate, Replicate>{});
    check(s, Layout<Shard<1>, Shard<0>>{});
    check(s, Layout<Shard<0>, Shard<1>>{});
    check(p, Layout<Replicate, Replicate>{});
    check(p, Layout<Shard<0>, Shard<0>>{});
    check(p, Layout<Replicate, Shard<1>>{});
    check(s, Layout<Shard<0>, Partial<>>{});
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_redistribute_plan
