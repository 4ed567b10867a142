// The dry run (DESIGN.md §7a, docs/dry-run.md): the sim communicator, meshes built on it, meta
// DTensors redistributed on it (the same CommLog as real tensors on the threads backend), the
// reports per rank class, the cost model and the published figures it must reproduce.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dtensor/comm/sim.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/models/gpt_size.hpp"
#include "dtensor/models/moe_flags.hpp"
#include "dtensor/models/moe_gpt.hpp"
#include "dtensor/models/training_plan.hpp"
#include "dtensor/nn/activation_offload.hpp"
#include "dtensor/nn/moe_blocks.hpp"
#include "dtensor/ops/matmul.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/sim/activation_offload.hpp"
#include "dtensor/sim/chrome_trace.hpp"
#include "dtensor/sim/cost_model.hpp"
#include "dtensor/sim/dry_run.hpp"
#include "dtensor/sim/offload_tiers.hpp"
#include "dtensor/sim/published_runs.hpp"
#include "dtensor/sim/search.hpp"
#include "dtensor/sim/serving.hpp"
#include "support/on_ranks.hpp"
#include "support/redistribute_cases.hpp"
#include "support/strict_json.hpp"
#ifdef DTENSOR_TEST_SHARED_DRY_RUNS
// The models' dry runs (models::dry_run_plan) as compiled once in examples/plan_auto_dry.cpp,
// whose object this program links (tests/CMakeLists.txt): a quarter of this unit's compile time.
#include "dry_run_plans.hpp"
#endif
#include "dtensor/models/dry_run_any.hpp"
#include "dtensor/models/published_dry_run.hpp"

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

/// models::dry_run_any as a DryRunner (with DTENSOR_TEST_SHARED_DRY_RUNS the dry runs are the
/// instantiations of the object this program links, declared extern above).
std::vector<models::PlanClass> dry_run_any(const models::TrainingPlan& p, bool llama, bool bf16, bool sp) {
  return models::dry_run_any(p, llama, bf16, sp);
}

/// The published rows timed by their dry runs (models/published_dry_run.hpp), each dry-run once
/// for every test case here: the re-costings the fits make are remembered inside the rows too.
const std::vector<sim::TimedRun>& published_dry_rows() {
  static const auto rows = models::published_dry_runs(sim::published_runs(), dry_run_any);
  return rows;
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

// ---------------------------------------------------------------- reports and rank classes

namespace {

/// Extents of the small step below, uneven on both mesh dimensions of a (4, 2) mesh.
constexpr Extent step_rows = 10, step_in = 8, step_out = 13;

/// A small training-like step on any mesh whose tensors live in its space: tagged parameters,
/// a forward matmul whose output is all-gathered over "tp", a gradient all-reduced over "dp"
/// (overlapped), optimizer state. What a report must see is known in closed form.
template <class Mesh>
void small_step(const Mesh& mesh, sim::Recorder& rec) {
  using Space = typename Mesh::space;
  using WeightLayout = Layout<Replicate, Shard<0>>;  // [out, in], rows over tp
  using InputLayout = Layout<Shard<0>, Replicate>;   // [rows, in], rows over dp
  auto piece = [&](const LayoutDesc<2>& l, const Shape<2>& global) {
    return Tensor<float, 2, Space>(local_box(l, mesh.shape(), mesh.coordinate(), global).extent);
  };
  const Shape<2> weight_shape{step_out, step_in}, input_shape{step_rows, step_in};
  rec.phase("parameters");
  MemoryTagScope parameters(MemoryTag::parameters);
  DTensor<float, 2, Mesh, WeightLayout> w(mesh, weight_shape, piece(WeightLayout::desc, weight_shape));
  rec.phase("forward");
  MemoryTagScope activations(MemoryTag::activations);
  DTensor<float, 2, Mesh, InputLayout> x(mesh, input_shape, piece(InputLayout::desc, input_shape));
  const auto y = ops::matmul<false, true>(x, w);  // [rows, out]: Shard<0>, Shard<1>
  const auto gathered = redistribute<Layout<Shard<0>, Replicate>>(y);
  rec.phase("backward", /*overlapped=*/true);
  MemoryTagScope gradients(MemoryTag::gradients);
  using PartialGrad = Layout<Partial<>, Shard<0>>;
  DTensor<float, 2, Mesh, PartialGrad> partial(mesh, weight_shape, piece(PartialGrad::desc, weight_shape));
  const auto grad = redistribute<WeightLayout>(partial);  // all-reduce over dp
  rec.phase("optimizer");
  MemoryTagScope optimizer(MemoryTag::optimizer_state);
  const auto moment1 = piece(WeightLayout::desc, weight_shape), moment2 = piece(WeightLayout::desc, weight_shape);
}

/// What must agree between a real run's report and a dry run's: phases, memory, collectives.
std::string memory_and_traffic(const sim::RankReport& r) {
  std::string s;
  for (const auto& ph : r.phases) {
    s += detail::cat("phase ", ph.name, " peak ", ph.peak_total, ":");
    for (std::size_t t = 0; t < memory_tag_count; ++t) s += detail::cat(" ", ph.peak[t], "/", ph.end[t]);
    s += "\n" + log_lines(ph.collectives);
  }
  return s;
}

}  // namespace

TEST_CASE("sim: rank classes are the distinct positions, counted without visiting ranks", "[sim][classes]") {
  // 16 stages x (125 dp ranks with 8 of 1000 rows, 3 with none) x tp all alike.
  const auto classes = sim::rank_classes<3>(
      {16, 128, 8}, {sim::DimensionWork::distinct(), sim::DimensionWork::splitting({1000}),
                     sim::DimensionWork::splitting({64})});
  REQUIRE(classes.size() == 32);
  std::int64_t total = 0;
  for (const auto& c : classes) total += c.ranks;
  CHECK(total == 16384);
  CHECK((classes[0].coordinate == std::array{0, 0, 0} && classes[0].ranks == 125 * 8));
  CHECK((classes[1].coordinate == std::array{0, 125, 0} && classes[1].ranks == 3 * 8));
  CHECK(classes[31].coordinate == std::array{15, 125, 0});

  // Against brute force on a small mesh: two ranks are in one class iff their stage and the
  // extents they hold of every split tensor are the same.
  const std::array<int, 3> shape{3, 4, 3};
  const std::array<sim::DimensionWork, 3> work{sim::DimensionWork::distinct(), sim::DimensionWork::splitting({13, 5}),
                                               sim::DimensionWork::splitting({7})};
  std::map<std::vector<Extent>, std::int64_t> brute;
  for (int r = 0; r < 36; ++r) {
    const auto c = detail::row_major_coordinate(shape, r);
    brute[{c[0], chunk_range(13, 4, c[1]).size(), chunk_range(5, 4, c[1]).size(), chunk_range(7, 3, c[2]).size()}]++;
  }
  const auto small = sim::rank_classes<3>(shape, work);
  REQUIRE(small.size() == brute.size());
  for (const auto& c : small) {
    const std::vector<Extent> key{c.coordinate[0], chunk_range(13, 4, c.coordinate[1]).size(),
                                  chunk_range(5, 4, c.coordinate[1]).size(), chunk_range(7, 3, c.coordinate[2]).size()};
    CHECK(brute[key] == c.ranks);
  }
  CHECK_THROWS_WITH(sim::rank_classes<1>({0}, {sim::DimensionWork{}}), Catch::Contains("mesh dimension 0 has size 0"));
}

TEST_CASE("sim: on 8 ranks the dry run's ledger peaks and CommLog equal a real threads run's", "[sim][report]") {
  const std::array<int, 2> shape{4, 2};
  std::vector<std::string> real(8);
  std::mutex m;
  threads::run(8, [&](CommPtr world) {
    DeviceMesh<"dp", "tp"> mesh(world, shape);
    sim::Recorder rec("host");
    small_step(mesh, rec);
    auto text = memory_and_traffic(rec.finish("real"));
    std::lock_guard lock(m);
    real[std::size_t(world->rank())] = std::move(text);
  });
  std::vector<sim::RankClass<2>> every_rank;
  for (int r = 0; r < 8; ++r) every_rank.push_back({detail::row_major_coordinate(shape, r), 1});
  const auto dry = sim::dry_run<2>(shape, every_rank, [&](CommPtr world, sim::Recorder& rec) {
    small_step(MetaMesh<"dp", "tp">(world, shape), rec);
  });
  REQUIRE(dry.size() == 8);
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r);
    CHECK(memory_and_traffic(dry[std::size_t(r)]) == real[std::size_t(r)]);
  }
  // The classes of this step (dp splits 10 rows: 3, 3, 3, 1; tp splits 13 rows: 7, 6) stand for
  // ranks whose reports are the same.
  const auto classes = sim::rank_classes<2>(
      shape, {sim::DimensionWork::splitting({step_rows}), sim::DimensionWork::splitting({step_out})});
  CHECK(classes.size() == 4);
  for (int r = 0; r < 8; ++r) {
    const auto c = detail::row_major_coordinate(shape, r);
    const auto& rep = *std::find_if(classes.begin(), classes.end(), [&](const auto& k) {
      return chunk_range(step_rows, 4, k.coordinate[0]) .size() == chunk_range(step_rows, 4, c[0]).size() &&
             chunk_range(step_out, 2, k.coordinate[1]).size() == chunk_range(step_out, 2, c[1]).size();
    });
    const auto class_rank = detail::row_major_index(shape, rep.coordinate);
    CHECK(memory_and_traffic(dry[std::size_t(class_rank)]) == memory_and_traffic(dry[std::size_t(r)]));
  }
}

TEST_CASE("sim: a TP + SP block, with each recomputation, holds and sends on threads what its dry run says",
          "[sim][report][recompute]") {
  // The activation accounting of nn/linear.hpp (the saved SP shard, re-gathered) and of per-module
  // recomputation is the real modules' own: the host run's ledger and CommLog per phase equal
  // the meta run's on every rank. 11 positions over tp 2 (6, 5): uneven.
  constexpr int tp = 2;
  for (const char* list : {"none", "selective", "norm", "act", "mlp", "norm,act", "full"}) {
    const auto r = nn::Recompute::parse(list);
    auto step = [&]<class Mesh>(const Mesh& mesh, sim::Recorder& rec) {
      using Block = nn::Checkpointed<nn::TransformerBlock<float, Mesh, parallel::MegatronPlan<true>>>;
      nn::BlockConfig c{.dim = 16, .heads = 4, .seq = 11};
      c.recompute = r;
      rec.phase("build");
      Block blk(r.full, "h.0", mesh, c, 1);
      const auto x = distribute_replicated<typename Block::In::layout>(
          mesh, Tensor<float, 3, mesh_space_t<Mesh>>(Shape<3>{3, 11, 16}));
      rec.phase("forward");
      auto [y, saved] = blk.forward(x);
      rec.phase("backward");
      auto [dx, w] = blk.backward_input(std::move(saved), y);
      blk.backward_weight(std::move(w));
    };
    std::vector<std::string> real(tp);
    std::mutex m;
    threads::run(tp, [&](CommPtr world) {
      DeviceMesh<"tp"> mesh(world, {tp});
      sim::Recorder rec("host");
      step(mesh, rec);
      auto text = memory_and_traffic(rec.finish("real"));
      std::lock_guard lock(m);
      real[std::size_t(world->rank())] = std::move(text);
    });
    std::vector<sim::RankClass<1>> every_rank{{{0}, 1}, {{1}, 1}};
    const auto dry = sim::dry_run<1>({tp}, every_rank, [&](CommPtr world, sim::Recorder& rec) {
      step(MetaMesh<"tp">(world, {tp}), rec);
    });
    REQUIRE(dry.size() == std::size_t(tp));
    // From the forward on: building differs by the transient full draw of each parameter on the
    // host (drawn whole from its seed, then split; meta draws nothing), tagged "other".
    auto step_lines = [](const std::string& text) { return text.substr(text.find("\nphase forward") + 1); };
    for (int k = 0; k < tp; ++k) {
      INFO(list << ", rank " << k);
      CHECK(step_lines(memory_and_traffic(dry[std::size_t(k)])) == step_lines(real[std::size_t(k)]));
    }
  }
}

TEST_CASE("sim: a report counts tagged bytes, collectives by group and FLOPs per phase", "[sim][report]") {
  const std::array<int, 2> shape{4, 2};
  const auto reports = sim::dry_run<2>(shape, {sim::RankClass<2>{{3, 1}, 1}}, [&](CommPtr world, sim::Recorder& rec) {
    small_step(MetaMesh<"dp", "tp">(world, shape), rec);
  });
  const auto& r = reports.at(0);
  CHECK(r.name == "rank 7 [3, 1]");
  // Rank (3, 1): 1 of the 10 input rows, 6 of the 13 weight rows.
  // The gathered y keeps the padded capacity the gather received (2 blocks of 7 columns).
  const std::int64_t weight = 6 * step_in * 4, input = 1 * step_in * 4, y = 1 * 6 * 4,
                     gathered = 1 * 2 * chunk_size(step_out, 2) * 4;
  CHECK(r.peak(MemoryTag::parameters) == weight);
  // Held after the forward: x, y and the gathered y. The all-gather's staging buffers (a column
  // gather packs and unpacks) count as communication.
  CHECK(r.phase("forward").end[std::size_t(MemoryTag::activations)] == input + y + gathered);
  CHECK(r.phase("forward").peak[std::size_t(MemoryTag::activations)] == input + y + gathered);
  CHECK(r.phase("forward").peak[std::size_t(MemoryTag::communication)] > 0);
  CHECK(r.peak(MemoryTag::gradients) == 2 * weight);
  CHECK(r.peak(MemoryTag::optimizer_state) == 2 * weight);
  // Everything is held during the optimizer phase; it is freed when the step returns.
  CHECK(r.phase("optimizer").peak_total == weight + input + y + gathered + 2 * weight + 2 * weight);
  CHECK(r.peak_total() == r.phase("optimizer").peak_total);
  for (auto bytes : r.phases.back().end) CHECK(bytes == 0);
  CHECK(r.phase("forward").flops() == 2 * 1 * 6 * step_in);
  REQUIRE(r.phase("forward").collectives.size() == 1);
  CHECK(r.phase("forward").collectives[0].group == "tp");
  REQUIRE(r.phase("backward").collectives.size() == 1);
  CHECK(r.phase("backward").collectives[0].kind == CollectiveKind::all_reduce);
  CHECK(r.phase("backward").collectives[0].group_size == 4);
  const auto table = r.to_table();
  CHECK(table.find("backward | all_reduce | dp (4) | 192 B | 1 | 288 B | 288 B") != std::string::npos);
  CHECK(table.find("forward | gemm | 1 | 9.600e+01") != std::string::npos);
  CHECK_THROWS_WITH(r.phase("warmup"), Catch::Contains("no phase 'warmup'"));
}

// ---------------------------------------------------------------- the cost model

TEST_CASE("sim: links by mesh dimension and the ring/tree formulas", "[sim][cost]") {
  const sim::Hardware h100;
  const std::array<std::string_view, 3> names{"pp", "dp", "tp"};
  sim::Topology topo(names, std::array{16, 128, 8}, h100);
  CHECK(topo.inside_node("tp"));
  CHECK_FALSE(topo.inside_node("dp*tp"));
  CHECK_FALSE(topo.inside_node("world"));
  CHECK_THROWS_WITH(topo.link("ep"), Catch::Contains("names no mesh dimension 'ep'"));
  // Bandwidths as a collective's bus reaches them: the link's times the calibration's fraction.
  const double f = sim::calibration.link_fraction;
  const double S = 1e9, a_nv = h100.nvlink.latency_seconds, b_nv = h100.nvlink.bytes_per_second * f;
  const double a_ib = h100.infiniband.latency_seconds, b_ib = h100.infiniband.bytes_per_second * f;
  auto record = [](CollectiveKind k, int n, double bytes) {
    CommRecord r{};
    r.kind = k;
    r.group_size = n;
    r.bytes = std::size_t(bytes);
    return r;
  };
  CHECK(sim::collective_seconds(record(CollectiveKind::all_gather, 8, S), topo.link("tp")) ==
        Approx(7 * a_nv + 7.0 / 8 * S / b_nv));
  // Ring all-reduce of 128 ranks: 2 (n-1)/n S / B, with the tree's 2 log2 n latencies.
  CHECK(sim::collective_seconds(record(CollectiveKind::all_reduce, 128, S), topo.link("dp")) ==
        Approx(14 * a_ib + 2 * 127.0 / 128 * S / b_ib));
  CHECK(sim::collective_seconds(record(CollectiveKind::send, 16, S), topo.link("pp")) == Approx(a_ib + S / b_ib));
  CHECK(sim::collective_seconds(record(CollectiveKind::all_reduce, 1, S), topo.link("pp")) == 0);
  sim::Hardware bad;
  bad.hbm_bytes_per_second = -1;
  CHECK_THROWS_WITH(sim::Topology(names, std::array{16, 128, 8}, bad), Catch::Contains("HBM -1"));
}

namespace {
CommRecord sim_record(CollectiveKind k, std::string group, int n, double bytes) {
  CommRecord r{};
  r.kind = k;
  r.group = std::move(group);
  r.group_size = n;
  r.bytes = std::size_t(bytes);
  return r;
}
}  // namespace

TEST_CASE("sim: a group's placement from where its ranks sit (row-major mesh, nodes of consecutive ranks)",
          "[sim][cost]") {
  using G = sim::GroupPlacement;
  const auto place = [](std::vector<int> shape, std::vector<bool> in_group, int node) {
    const G g = sim::detail::group_placement(shape, in_group, node);
    return std::pair{g.ranks, g.fewest_in_node};
  };
  // Aligned: tp 8 fills a node; dp's 128 ranks have a stride of 8, one per node.
  CHECK(place({16, 128, 8}, {false, false, true}, 8) == std::pair{8, 8});
  CHECK(place({16, 128, 8}, {false, true, false}, 8) == std::pair{128, 1});
  CHECK(place({16, 128, 8}, {false, true, true}, 8) == std::pair{1024, 8});
  // tp 3 on nodes of 4: the group {3, 4, 5} is split 1 + 2 (rank 3 alone in its node).
  CHECK(place({2, 3}, {false, true}, 4) == std::pair{3, 1});
  // dp 3 x tp 2 = 6 ranks, one (partial) node of 8: every group inside it.
  CHECK(place({3, 2}, {true, false}, 8) == std::pair{3, 3});
  // ep 6 over nodes of 4 (edp 2): groups {0..5} and {6..11}; ranks 4-7 have 2 of theirs in their node.
  CHECK(place({1, 2, 6, 1}, {false, false, true, false}, 4) == std::pair{6, 2});
  // ep outermost (stride 8): one per node; innermost: inside; 16 over nodes of 8: 8 per node.
  CHECK(place({4, 8}, {true, false}, 8) == std::pair{4, 1});
  CHECK(place({8, 4}, {false, true}, 8) == std::pair{4, 4});
  CHECK(place({2, 16}, {false, true}, 8) == std::pair{16, 8});
  // DeepSeek-V3's expert mesh (pp 16, edp 2, ep 64, tp 1) on 8-GPU nodes: 8 of each ep group per node.
  CHECK(place({16, 2, 64, 1}, {false, false, true, false}, 8) == std::pair{64, 8});
  // The same counted over every rank (no period) for a stride that straddles nodes: dp 3 of
  // stride 3 on nodes of 8: {0, 3, 6} inside, {2, 5, 8} split 2 + 1.
  CHECK(place({3, 3}, {true, false}, 8) == std::pair{3, 1});

  const sim::Hardware h100;
  sim::Topology topo(std::array<std::string_view, 5>{"pp", "dp", "fsdp", "cp", "tp"}, std::array{2, 8, 1, 1, 2}, h100);
  topo.add_dims(std::array<std::string_view, 4>{"pp", "edp", "ep", "tp"}, std::array{2, 2, 4, 2});
  CHECK(topo.inside_node("tp"));
  CHECK(topo.inside_node("ep"));  // ep 4 x tp 2 = one node
  CHECK(topo.inside_node("ep*tp"));
  CHECK_FALSE(topo.inside_node("edp"));  // stride 8
  CHECK_FALSE(topo.inside_node("dp"));   // 8 x tp 2 = 16 ranks
  CHECK(topo.placement("dp").fewest_in_node == 4);
  CHECK(topo.placement("world").ranks == 32);
  CHECK(topo.placement("world").fewest_in_node == 8);
  CHECK_THROWS_WITH(topo.placement("dp*ep"), Catch::Contains("mixes dimensions of two factorizations"));
  CHECK_THROWS_WITH(topo.placement("xp"), Catch::Contains("names no mesh dimension 'xp'"));
  CHECK_THROWS_WITH(sim::Topology(std::array<std::string_view, 1>{"dp"}, std::array{0}, h100),
                    Catch::Contains("mesh dimension 'dp' of size 0"));
}

TEST_CASE("sim: a collective's links from its group's placement (NVLink inside, network across, all-to-all split)",
          "[sim][cost]") {
  sim::Hardware hw;  // H100 figures
  const double f = sim::calibration.link_fraction, S = 6e8;
  const double a_nv = hw.nvlink.latency_seconds, b_nv = hw.nvlink.bytes_per_second * f;
  const double a_ib = hw.infiniband.latency_seconds, b_ib = hw.infiniband.bytes_per_second * f;
  using K = CollectiveKind;
  const auto seconds = [&](const sim::Topology& t, K k, const char* group, int n) {
    return sim::collective_seconds(sim_record(k, group, n, S), t, group);
  };
  // A group inside a node: every kind on NVLink.
  const sim::Topology inner(std::array<std::string_view, 2>{"dp", "ep"}, std::array{8, 4}, hw);
  CHECK(seconds(inner, K::all_to_all_v, "ep", 4) == Approx(3 * a_nv + 3.0 / 4 * S / b_nv));
  CHECK(seconds(inner, K::all_gather, "ep", 4) == Approx(3 * a_nv + 3.0 / 4 * S / b_nv));
  CHECK(seconds(inner, K::all_reduce, "ep", 4) == Approx(4 * a_nv + 2 * 3.0 / 4 * S / b_nv));
  // The same ep outermost: each rank of a group in its own node, every kind on the network.
  const sim::Topology outer(std::array<std::string_view, 2>{"ep", "dp"}, std::array{4, 8}, hw);
  CHECK(seconds(outer, K::all_to_all_v, "ep", 4) == Approx(3 * a_ib + 3.0 / 4 * S / b_ib));
  CHECK(seconds(outer, K::reduce_scatter, "ep", 4) == Approx(3 * a_ib + 3.0 / 4 * S / b_ib));
  // tp 3 on nodes of 4 (uneven): the group {3, 4, 5} crosses a node, so tp's ring is on the network.
  hw.gpus_per_node = 4;
  const sim::Topology uneven_tp(std::array<std::string_view, 2>{"dp", "tp"}, std::array{2, 3}, hw);
  CHECK(seconds(uneven_tp, K::all_gather, "tp", 3) == Approx(2 * a_ib + 2.0 / 3 * S / b_ib));
  // An all-to-all across nodes: of a rank's (g-1)/g S bytes, each peer gets 1/g S; its local
  // peers' shares go over NVLink and the others' over the network at once, the slowest rank
  // (fewest local peers, L of them) sets the time:
  //   max(L a_nv + L/g S / B_nv, (g-1-L) a_ib + (g-1-L)/g S / B_ib).
  // ep 6 over nodes of 4 (edp 2): L = 1 (ranks 4-7 have 2 of their group in their node).
  const sim::Topology uneven_ep(std::array<std::string_view, 3>{"edp", "ep", "tp"}, std::array{2, 6, 1}, hw);
  const double ep6_nvlink = 1 * a_nv + 1.0 / 6 * S / b_nv, ep6_network = 4 * a_ib + 4.0 / 6 * S / b_ib;
  CHECK(seconds(uneven_ep, K::all_to_all_v, "ep", 6) == Approx(std::max(ep6_nvlink, ep6_network)));
  CHECK(seconds(uneven_ep, K::all_to_all, "ep", 6) == Approx(ep6_network));
  CHECK(seconds(uneven_ep, K::all_to_all, "ep", 6) < 0.81 * (5 * a_ib + 5.0 / 6 * S / b_ib));  // all on the network
  // Rings across nodes run at their slowest hop: the network for all bytes.
  CHECK(seconds(uneven_ep, K::all_gather, "ep", 6) == Approx(5 * a_ib + 5.0 / 6 * S / b_ib));
  // ep 16 innermost over nodes of 8: L = 7, 8 peers on the network.
  hw.gpus_per_node = 8;
  const sim::Topology split(std::array<std::string_view, 2>{"edp", "ep"}, std::array{2, 16}, hw);
  const double ep16 = std::max(7 * a_nv + 7.0 / 16 * S / b_nv, 8 * a_ib + 8.0 / 16 * S / b_ib);
  CHECK(seconds(split, K::all_to_all_v, "ep", 16) == Approx(ep16));
  // A slow NVLink can be the slower half.
  sim::Hardware slow_nvlink = hw;
  slow_nvlink.nvlink.bytes_per_second = hw.infiniband.bytes_per_second / 4;
  const sim::Topology slow(std::array<std::string_view, 2>{"edp", "ep"}, std::array{2, 16}, slow_nvlink);
  const double slow_nv = 7 * a_nv + 7.0 / 16 * S / (slow_nvlink.nvlink.bytes_per_second * f);
  REQUIRE(slow_nv > 8 * a_ib + 8.0 / 16 * S / b_ib);
  CHECK(seconds(slow, K::all_to_all_v, "ep", 16) == Approx(slow_nv));

  // The estimate charges a phase's all-to-all so (sim::phase_time), and the analytic estimate
  // its expert all-to-alls: ep 16 over two nodes of 8 against the formula, per micro-batch and
  // MoE block (counts, dispatch and two combines, the dispatch's adjoint).
  sim::PhaseReport phase;
  phase.name = "forward";
  phase.collectives.push_back(sim_record(K::all_to_all_v, "ep", 16, S));
  CHECK(sim::phase_time(phase, split).exposed == Approx(ep16));
  sim::ModelShape m;
  m.layers = 2, m.dim = 256, m.heads = 4, m.vocab = 1024, m.seq = 128, m.experts = 16, m.topk = 2;
  m.expert_ffn = 512;
  sim::PlanShape p;
  p.dp = 16, p.ep = 16, p.batch = 32, p.microbatch = 2, p.bf16 = true;
  const auto a = sim::analytic_estimate(m, p, hw);
  const sim::Topology mesh = [&] {
    sim::Topology t(std::array<std::string_view, 5>{"pp", "rep", "dp", "cp", "tp"}, std::array{1, 1, 16, 1, 1}, hw);
    t.add_dims(std::array<std::string_view, 4>{"pp", "edp", "ep", "tp"}, std::array{1, 1, 16, 1});
    return t;
  }();
  const auto bytes = sim::moe_all_to_all_bytes(m, p);
  const auto a2a = [&](K k, double b) { return sim::collective_seconds(sim_record(k, "ep", 16, b), mesh, "ep"); };
  const double local_experts = 1;  // 16 experts over ep 16
  const double per_block = a2a(K::all_to_all, 8 * 16 * (1 + local_experts)) + a2a(K::all_to_all_v, bytes.dispatch) +
                           2 * a2a(K::all_to_all_v, bytes.combine) + a2a(K::all_to_all_v, bytes.dispatch_backward);
  CHECK(a.ep_seconds == Approx(p.batch / p.dp / p.microbatch * m.layers * per_block));
  // Every byte on the network would be slower: the NVLink share is what moved.
  CHECK(a.ep_seconds <
        0.95 * p.batch / p.dp / p.microbatch * m.layers *
            (sim::collective_seconds(sim_record(K::all_to_all_v, "ep", 16, bytes.dispatch), hw.infiniband) +
             2 * sim::collective_seconds(sim_record(K::all_to_all_v, "ep", 16, bytes.combine), hw.infiniband)));
}

TEST_CASE("sim: the estimated step's bubble equals each schedule's formula", "[sim][cost][pipeline]") {
  namespace pp = dtensor::parallel::pipeline;
  const sim::Hardware hw;
  // A GEMM record without bytes runs at the calibration's largest GEMM fraction of peak.
  const double flop_per_second = hw.peak_flops() * sim::calibration.gemm_max_fraction;
  // A stage whose forward takes 1 ms and backward 2 ms, no communication, and an optimizer step.
  sim::RankReport report{"stage", 1, {}};
  auto phase = [&](const char* name, double seconds) {
    sim::PhaseReport p;
    p.name = name;
    p.ops.push_back({"gemm", std::int64_t(seconds * flop_per_second), 0, 0});
    report.phases.push_back(p);
  };
  phase("forward", 1e-3);
  phase("backward", 2e-3);
  phase("optimizer", 0.5e-3);
  const std::array<std::string_view, 1> names{"pp"};
  for (int p : {2, 4, 8})
    for (int m : {4, 8, 16}) {
      CAPTURE(p, m);
      const sim::Topology topo(names, std::array{p}, hw);
      for (auto kind : {pp::ScheduleKind::gpipe, pp::ScheduleKind::one_f_one_b}) {
        const auto est = sim::estimate_step(report, topo, pp::make_schedule(kind, p, m));
        CHECK(est.bubble_fraction == Approx(double(p - 1) / (m + p - 1)).epsilon(1e-9));
        CHECK(est.step_seconds == Approx((m + p - 1) * 3e-3 + 0.5e-3).epsilon(1e-9));
        CHECK(est.compute_seconds == Approx(m * 3e-3 + 0.5e-3).epsilon(1e-9));
      }
      if (m % p == 0) {
        const auto est = sim::estimate_step(report, topo, pp::make_schedule(pp::ScheduleKind::interleaved, p, m, 2), 2);
        CHECK(est.bubble_fraction == Approx(double(p - 1) / (2 * m + p - 1)).epsilon(1e-9));
        const auto trace = sim::chrome_trace(est, 0, "stage 0");
        CHECK(trace.find("\"name\":\"0F0\"") != std::string::npos);
        CHECK(trace.find("\"name\":\"optimizer\"") != std::string::npos);
      }
    }
  // Overlap by role (sim/cost_model.hpp): a parameter all-gather on a data dimension hides
  // behind the phase's compute; a tensor-parallel one is exposed; a gradient reduce-scatter is
  // taken out of the micro-batch (paid once per step).
  const std::array<std::string_view, 2> dims{"dp", "tp"};
  const sim::Topology topo(dims, std::array{2, 2}, hw);
  auto collective = [&](CollectiveKind kind, const char* group, double seconds) {
    CommRecord r{};
    r.kind = kind;
    r.group = group;
    r.group_size = 2;
    r.bytes = std::size_t(2 * topo.link(group).bytes_per_second * sim::calibration.link_fraction * seconds);  // half on the wire
    return r;
  };
  sim::PhaseReport backward;
  backward.name = "backward";
  backward.overlapped = true;
  backward.ops.push_back({"gemm", std::int64_t(1e-3 * flop_per_second), 0, 0});
  backward.collectives.push_back(collective(CollectiveKind::all_gather, "dp", 3e-3));
  const double alpha = topo.link("dp").latency_seconds;
  auto t = sim::phase_time(backward, topo);
  CHECK(sim::comm_role(backward.collectives[0], "backward") == sim::CommRole::parameter_gather);
  CHECK(t.communication == Approx(3e-3 + alpha));
  CHECK(t.exposed == Approx(t.communication - 1e-3));
  backward.overlapped = false;  // a phase the program did not mark: nothing hides
  CHECK(sim::phase_time(backward, topo).exposed == Approx(t.communication));
  backward.overlapped = true;
  backward.collectives[0] = collective(CollectiveKind::all_gather, "tp", 0.5e-3);
  t = sim::phase_time(backward, topo);
  CHECK(sim::comm_role(backward.collectives[0], "backward") == sim::CommRole::exposed);
  CHECK(t.exposed == Approx(t.communication));
  backward.collectives[0] = collective(CollectiveKind::reduce_scatter, "dp", 2e-3);
  t = sim::phase_time(backward, topo);
  CHECK(sim::comm_role(backward.collectives[0], "backward") == sim::CommRole::gradient_reduction);
  CHECK(t.communication == 0);
  CHECK(t.gradient_reduction == Approx(2e-3 + alpha));
  // Once per step, behind the last micro-batch's backward (1 ms of compute): 1 ms exposed, for any m.
  sim::RankReport one{"stage", 1, {backward}};
  for (int m : {1, 4, 16}) {
    const auto est = sim::estimate_step(one, sim::Topology(dims, std::array{2, 2}, hw), pp::make_schedule(pp::ScheduleKind::one_f_one_b, 1, m));
    CHECK(est.gradient_reduction_seconds == Approx(2e-3 + alpha));
    CHECK(est.step_seconds == Approx(m * 1e-3 + (1e-3 + alpha)));
  }
  // ZeRO: a gradient all-reduce is charged as the reduce-scatter the rank needs.
  backward.collectives[0] = collective(CollectiveKind::all_reduce, "dp", 2e-3);
  CHECK(sim::phase_time(backward, topo, {.zero = 1}).gradient_reduction ==
        Approx(sim::phase_time(backward, topo, {.zero = 0}).gradient_reduction / 2).epsilon(0.01));
}

TEST_CASE("sim: a plan's step is the critical path across its classes and pipeline ranks", "[sim][cost][pipeline]") {
  namespace pp = dtensor::parallel::pipeline;
  const sim::Hardware hw;
  const double flop_per_second = hw.peak_flops() * sim::calibration.gemm_max_fraction;
  auto stage = [&](const char* name, double forward, double backward, double optimizer) {
    sim::RankReport r{name, 1, {}};
    for (auto [phase, seconds] : {std::pair{"forward", forward}, {"backward", backward}, {"optimizer", optimizer}}) {
      sim::PhaseReport p;
      p.name = phase;
      p.ops.push_back({"gemm", std::int64_t(seconds * flop_per_second), 0, 0});
      r.phases.push_back(p);
    }
    return r;
  };
  // Four pipeline ranks: a first, two alike middle ones (one class), a slow last one (the head).
  const auto first = stage("first", 1e-3, 2e-3, 1e-3), middle = stage("middle", 1e-3, 2e-3, 1e-3),
             last = stage("last", 1.5e-3, 3e-3, 0.2e-3);
  const std::array<std::string_view, 1> names{"pp"};
  const sim::Topology topo(names, std::array{4}, hw);
  const auto schedule = pp::make_schedule(pp::ScheduleKind::one_f_one_b, 4, 8);
  const auto plan = sim::estimate_plan({{&first, {0}}, {&middle, {1, 2}}, {&last, {3}}}, topo, schedule);
  // The same schedule simulated with those costs per rank, plus each class's once-per-step work.
  const auto timeline = pp::simulate(schedule, std::vector<pp::Costs>{{1e-3, 2e-3, 0}, {1e-3, 2e-3, 0}, {1e-3, 2e-3, 0},
                                                                      {1.5e-3, 3e-3, 0}});
  double expected = 0;
  int latest = 0;
  for (int r = 0; r < 4; ++r) {
    double end = 0;
    for (const auto& a : timeline.actions[std::size_t(r)]) end = std::max(end, a.end);
    if (end + (r == 3 ? 0.2e-3 : 1e-3) > expected) expected = end + (r == 3 ? 0.2e-3 : 1e-3), latest = r;
  }
  CHECK(plan.step_seconds == Approx(expected).epsilon(1e-9));
  CHECK(plan.classes[plan.slowest].name == (latest == 0 ? "first" : latest == 3 ? "last" : "middle"));
  CHECK(plan.classes[plan.slowest].pipeline_rank == latest);
  // The slow last stage stretches every rank's schedule: more than the uniform schedule at the others' costs.
  CHECK(plan.pipeline_seconds > sim::estimate_step(first, topo, schedule).pipeline_seconds);
  CHECK_THROWS_WITH(sim::estimate_plan({{&first, {0}}, {&last, {3}}}, topo, schedule),
                    Catch::Contains("no rank class on pipeline rank 1 of 4"));
  CHECK_THROWS_WITH(sim::estimate_plan({{&first, {0, 7}}}, topo, schedule), Catch::Contains("pipeline rank 7 of a schedule of 4"));
}

TEST_CASE("sim: roofline per op and device descriptions", "[sim][cost][device]") {
  const auto h100 = sim::device("h100"), a100 = sim::device("a100"), h200 = sim::device("h200");
  CHECK(a100.peak_flops() == 312e12);
  CHECK(h200.memory_bytes == 141e9);
  CHECK(h200.hbm_bytes_per_second > h100.hbm_bytes_per_second);
  // A large square GEMM is compute-bound; a GEMM of one row is bound by the bytes of its matrix.
  const double n = 8192;
  const kernels::meta::CostRecord square{"gemm", std::int64_t(2 * n * n * n), std::int64_t(2 * 2 * n * n), std::int64_t(2 * n * n)};
  CHECK(sim::op_seconds(square, h100) ==
        Approx(2 * n * n * n / (h100.peak_flops() * sim::gemm_efficiency(2 * n * n * n / (6 * n * n)))));
  const kernels::meta::CostRecord row{"gemm", std::int64_t(2 * n * n), std::int64_t(2 * (n * n + n)), std::int64_t(2 * n)};
  CHECK(sim::op_seconds(row, h100) == Approx(2 * (n * n + 2 * n) / (h100.hbm_bytes_per_second * sim::calibration.hbm_fraction)));
  // The intensity curve (the fit puts its half point at 0 since GEMM records carry their shape,
  // docs/dry-run.md "GEMM efficiency by shape"; here one of 50 FLOP/B); no NaN at intensity 0.
  const sim::Calibration curve{.gemm_half_intensity = 50};
  CHECK(sim::gemm_efficiency(10, curve) < sim::gemm_efficiency(100, curve));
  CHECK(sim::gemm_efficiency(1e9) <= sim::calibration.gemm_max_fraction);
  CHECK(sim::gemm_efficiency(0) == 0);
  // fp32 models run at the fp32 peak.
  auto fp32 = h100;
  fp32.fp32 = true;
  CHECK(sim::op_seconds(square, fp32) > 10 * sim::op_seconds(square, h100));
  // Files: every field, read back as written; missing, unknown, repeated or bad fields are errors.
  auto custom = a100;
  sim::set_device_field(custom, "network_gbps", "400");
  CHECK(custom.infiniband.bytes_per_second == 50e9);
  const auto back = sim::parse_device(sim::to_device_file(custom), "test");
  CHECK(back.name == "a100");
  CHECK(back.infiniband.bytes_per_second == Approx(50e9));
  CHECK(back.peak_bf16_flops == Approx(312e12));
  CHECK(back.gpus_per_node == 8);
  std::string text = sim::to_device_file(custom);
  const std::string without_hbm = text.substr(0, text.find("hbm_gbytes_per_s")) + text.substr(text.find("memory_gbytes"));
  CHECK_THROWS_WITH(sim::parse_device(without_hbm, "gpu.txt"), Catch::Contains("gpu.txt: missing device field(s): hbm_gbytes_per_s"));
  CHECK_THROWS_WITH(sim::parse_device(text + "tensor_cores = 4\n", "gpu.txt"), Catch::Contains("unknown device field 'tensor_cores'"));
  CHECK_THROWS_WITH(sim::parse_device(text + "name = again\n", "gpu.txt"), Catch::Contains("field name given twice"));
  CHECK_THROWS_WITH(sim::set_device_field(custom, "nvlink_domain", "2.5"), Catch::Contains("a whole number"));
  CHECK_THROWS_WITH(sim::set_device_field(custom, "memory_gbytes", "lots"), Catch::Contains("memory_gbytes = 'lots'"));
  CHECK_THROWS_WITH(sim::parse_device("just words\n", "gpu.txt"), Catch::Contains("gpu.txt:1: 'just words' is not 'field = value'"));
  CHECK_THROWS_WITH(sim::read_device_file("/no/such/gpu.txt"), Catch::Contains("cannot read device file '/no/such/gpu.txt'"));
  CHECK_THROWS_WITH(sim::device("tpu"), Catch::Contains("unknown device 'tpu'"));
  // compute_scale (issue 43): a power-limited device runs its GEMMs and attention at that share of
  // the calibrated rates; memory-bound ops, MFU's peak and the links are the rated ones. Optional
  // in files (default 1), read back as written, and checked (0 < scale <= 1).
  CHECK(h100.compute_scale == 1);
  CHECK(a100.compute_scale == 1);
  const auto limited = sim::device("h100-500w");
  CHECK(limited.compute_scale == sim::h100_500w_compute_scale);
  CHECK(limited.peak_flops() == h100.peak_flops());
  CHECK(limited.hbm_bytes_per_second == 2.4e12);
  CHECK(limited.memory_bytes == 96e9);
  CHECK(sim::op_seconds(square, limited) == Approx(sim::op_seconds(square, h100) / sim::h100_500w_compute_scale));
  const kernels::meta::CostRecord attention{"attention", std::int64_t(1e12), std::int64_t(1e6), std::int64_t(1e6)};
  CHECK(sim::op_seconds(attention, limited) == Approx(sim::op_seconds(attention, h100) / sim::h100_500w_compute_scale));
  CHECK(sim::op_seconds(row, limited) == Approx(2 * (n * n + 2 * n) / (limited.hbm_bytes_per_second * sim::calibration.hbm_fraction)));
  CHECK(sim::parse_device(sim::to_device_file(limited), "test").compute_scale == Approx(sim::h100_500w_compute_scale));
  CHECK(text.find("compute_scale") != std::string::npos);
  const std::string without_scale = text.substr(0, text.find("compute_scale"));
  CHECK(sim::parse_device(without_scale, "gpu.txt").compute_scale == 1);
  auto over = h100;
  sim::set_device_field(over, "compute_scale", "1.5");
  CHECK_THROWS_WITH(over.check("test"), Catch::Contains("0 < compute_scale <= 1"));
  CHECK_THROWS_WITH(sim::parse_device(without_scale + "compute_scale = 0\n", "gpu.txt"), Catch::Contains("compute_scale 0"));
  // FP8 GEMMs (op gemm_fp8): the device's FP8 peak on the same curve, twice the bf16 one on an
  // H100 for a GEMM whose one-byte operands are as compute-bound; none on an A100 (named).
  CHECK(h100.peak_fp8_flops == 1979e12);
  CHECK(h200.peak_fp8_flops == 1979e12);
  CHECK(a100.peak_fp8_flops == 0);
  const kernels::meta::CostRecord square_fp8{"gemm_fp8", square.flops, std::int64_t(2 * n * n),
                                             std::int64_t(2 * n * n)};
  CHECK(sim::op_seconds(square_fp8, h100) ==
        Approx(2 * n * n * n / (1979e12 * sim::gemm_efficiency(2 * n * n * n / (4 * n * n)))));
  CHECK(sim::op_seconds(square_fp8, h100) < 0.52 * sim::op_seconds(square, h100));
  CHECK(sim::op_seconds(square_fp8, limited) ==
        Approx(sim::op_seconds(square_fp8, h100) / sim::h100_500w_compute_scale));
  CHECK_THROWS_WITH(sim::op_seconds(square_fp8, a100), Catch::Contains("device 'a100' has no FP8 tensor cores"));
  CHECK(sim::parse_device(sim::to_device_file(h100), "test").peak_fp8_flops == Approx(1979e12));
  CHECK(back.peak_fp8_flops == 0);  // the A100's, written and read back
  const std::string without_fp8 =
      text.substr(0, text.find("peak_fp8_tflops")) + text.substr(text.find("hbm_gbytes_per_s"));
  auto h100_file = sim::to_device_file(h100);
  h100_file =
      h100_file.substr(0, h100_file.find("peak_fp8_tflops")) + h100_file.substr(h100_file.find("hbm_gbytes_per_s"));
  CHECK(sim::parse_device(without_fp8, "gpu.txt").peak_fp8_flops == 0);
  CHECK(sim::parse_device(h100_file, "gpu.txt").peak_fp8_flops == 0);  // a file without it: no FP8
  CHECK_THROWS_WITH(sim::set_device_field(custom, "peak_fp8_tflops", "-1"), Catch::Contains("peak_fp8_tflops = '-1'"));

  // GEMM efficiency by shape (issue 43; docs/dry-run.md): the meta GEMM records its shape, and a
  // GEMM's rate is the intensity curve x its wave efficiency, plus a fixed time per GEMM. Against
  // this project's cuBLAS bf16 on an H100 (docs/benchmarks.md, "GPU", bench_gemm_cuda: 111.1,
  // 471.7, 799.1, 806.3 of 989 TFLOP/s for n x n x n at n = 1024 ... 8192): within 20 %.
  for (const auto& [size, measured_tflops] : {std::pair{1024, 111.1}, {2048, 471.7}, {4096, 799.1}, {8192, 806.3}}) {
    const Extent e = size;
    const auto x = kernels::meta::MetaTensor<dtensor::bfloat16, 2>::uninitialized(Shape<2>{e, e});
    auto y = kernels::meta::MetaTensor<dtensor::bfloat16, 2>::uninitialized(Shape<2>{e, e});
    kernels::meta::CostLog log;
    kernels::matmul_rows_into(y, x, x);
    REQUIRE(log.records().size() == 1);
    const auto& r = log.records().front();
    CHECK((r.op == "gemm" && r.m == e && r.n == e && r.k == e && r.batch == 1 && r.flops == 2 * e * e * e));
    const double fraction = double(r.flops) / sim::op_seconds(r, h100) / h100.peak_flops();
    CAPTURE(size, fraction, measured_tflops / 989);
    CHECK(fraction / (measured_tflops / 989) == Approx(1).margin(0.2));
  }
  // The waves: 1024^2 outputs are 32 tiles of 128 x 256, one partial wave on 132 SMs (108 on an
  // A100); an fp32 model's 128 x 128 tiles make 64. A record without its shape keeps the curve
  // alone and no fixed time (the hand-made records above).
  const kernels::meta::CostRecord small{
      "gemm", 2 * 1024 * 1024 * 1024LL, 6 * 1024 * 1024, 2 * 1024 * 1024, 1024, 1024, 1024, 1};
  CHECK(sim::gemm_wave_efficiency(small, h100) == Approx(32.0 / 132));
  CHECK(sim::gemm_wave_efficiency(small, a100) == Approx(32.0 / 108));
  CHECK(sim::gemm_wave_efficiency(small, fp32) == Approx(64.0 / 132));
  auto batched = small;
  batched.batch = 5;  // 160 tiles: two waves, the second of 28
  CHECK(sim::gemm_wave_efficiency(batched, h100) == Approx(160.0 / 264));
  CHECK(sim::gemm_wave_efficiency(square, h100) == 1);
  CHECK(sim::op_seconds(small, h100) ==
        Approx(double(small.flops) / (h100.peak_flops() * sim::gemm_efficiency(1024.0 / 3) * 32 / 132) +
               h100.gemm_overhead_seconds));
  // The fields: built in (132, 132, 108 SMs), optional in files (the H100's), read back as
  // written, and checked: a bad value is an error naming the field and the value.
  CHECK((h100.sm_count == 132 && h200.sm_count == 132 && a100.sm_count == 108 && limited.sm_count == 132));
  const auto a100_back = sim::parse_device(sim::to_device_file(a100), "test");
  CHECK((a100_back.sm_count == 108 && a100_back.gemm_tile_m == 128 && a100_back.gemm_tile_n == 256));
  CHECK(a100_back.gemm_overhead_seconds == Approx(a100.gemm_overhead_seconds));
  CHECK(sim::parse_device(without_scale, "gpu.txt").sm_count == 132);
  auto tuned = a100;
  sim::set_device_field(tuned, "gemm_tile_n", "128");
  sim::set_device_field(tuned, "gemm_overhead_us", "0");
  CHECK(sim::gemm_wave_efficiency(small, tuned) == Approx(64.0 / 108));
  CHECK_THROWS_WITH(sim::set_device_field(tuned, "sm_count", "0"), Catch::Contains("sm_count = '0'"));
  CHECK_THROWS_WITH(sim::set_device_field(tuned, "gemm_tile_m", "64.5"), Catch::Contains("gemm_tile_m = '64.5'"));
  CHECK_THROWS_WITH(sim::set_device_field(tuned, "gemm_overhead_us", "-2"), Catch::Contains("gemm_overhead_us = '-2'"));
  CHECK_THROWS_WITH(sim::parse_device(without_scale + "sm_count = -4\n", "gpu.txt"),
                    Catch::Contains("sm_count = '-4'"));
  tuned.sm_count = 0;
  CHECK_THROWS_WITH(tuned.check("test"), Catch::Contains("sm_count 0"));
  tuned = a100;
  tuned.gemm_overhead_seconds = -1e-6;
  CHECK_THROWS_WITH(tuned.check("test"), Catch::Contains("gemm_overhead_us -1"));
  tuned.gemm_overhead_seconds = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(tuned.check("test"), Catch::Contains("gemm_overhead_us nan"));
}

// ---------------------------------------------------------------- published figures, from the real step on meta

namespace {

constexpr auto tag_index = [](MemoryTag t) { return std::size_t(t); };

/// Model-state bytes (parameters, gradients, optimizer state) held after the step.
struct ModelStates {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};

ModelStates model_states_after_step(const sim::RankReport& r) {
  const auto& end = r.phase(models::detail::after_step).start;
  return {double(end[tag_index(MemoryTag::parameters)]), double(end[tag_index(MemoryTag::gradients)]),
          double(end[tag_index(MemoryTag::optimizer_state)])};
}

/// The model's element count Ψ: its bf16 values once built and sharded (ZeRO-1 and 2 keep them all).
double model_elements(const sim::RankReport& r) {
  return double(r.phase("parameters").end[tag_index(MemoryTag::parameters)]) / sizeof(dtensor::bfloat16);
}

models::PlanClass first_class(std::vector<models::PlanClass> classes) {
  REQUIRE(!classes.empty());
  return std::move(classes.front());
}

/// ZeRO's model (and Megatron's): a bf16 GPT under fully_shard<float> on N data ranks.
models::PlanClass zero_run(models::GPTConfig model, int ranks, int stage) {
  models::TrainingPlan plan{
      .model = model, .batch = ranks, .microbatches = 1, .dp = ranks, .tp = 1, .pp = 1, .zero = stage};
  return first_class(dtensor::models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(plan));
}

}  // namespace

namespace {

/// ZeRO Figure 1 (7.5B parameters, 64 ranks, K = 12).
void check_zero_figure_1() {
  // Rajbhandari et al. 2020, Figure 1: model states per rank for Ψ = 7.5B, N = 64, mixed
  // precision (fp16 parameters and gradients, K = 12 bytes of fp32 master values and Adam
  // moments per parameter). Our GPT of Ψ = 7.46B: 35 layers of width 4096 (biases, untied head).
  const models::GPTConfig model{.vocab = 50257, .seq = 64, .dim = 4096, .heads = 32, .layers = 35};
  const int ranks = 64;
  const double published[] = {120e9, 31.4e9, 16.6e9, 1.9e9};  // DP, ZeRO-1, ZeRO-2, ZeRO-3
  // DP is fully_shard's stage 1 on one rank: full bf16 values and gradients (the gradient shard:
  // all of them, read widened by AdamW), fp32 master values and moments (= the whole model).
  const auto dp = zero_run(model, 1, 1);
  const double psi = model_elements(dp.report);
  CAPTURE(psi);
  REQUIRE(psi == Approx(7.5e9).epsilon(0.01));
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const auto run = stage == 0 ? dp : zero_run(model, ranks, stage);
    const int n = stage == 0 ? 1 : ranks;
    const auto m = model_states_after_step(run.report);
    // Ours, term by term (docs/fsdp.md): bf16 full values unless ZeRO-3 (2Ψ); bf16 full gradients
    // for stage 1 (2Ψ), which hold the gradient shard (fp32 inside their storage over N >= 2
    // ranks, their bf16 selves over one); ZeRO-2's bf16 gradient shard (2Ψ/N), ZeRO-3's fp32 one
    // (4Ψ/N); fp32 master values + two moments (12Ψ/N).
    const double values = stage == 3 ? 0 : 2 * psi, full_grads = stage <= 1 ? 2 * psi : 0;
    const double grad_shard = stage <= 1 ? 0 : stage == 2 ? 2 * psi / n : 4 * psi / n, optimizer = 12 * psi / n;
    CHECK(m.params == Approx(values).epsilon(1e-3));
    CHECK(m.grads == Approx(full_grads + grad_shard).epsilon(1e-3));
    CHECK(m.optimizer == Approx(optimizer).epsilon(1e-3));
    // ZeRO's accounting of the same states: DP and ZeRO-1 reduce into the fp16 full gradients
    // (no separate shard: ours neither); ZeRO-2/3 keep an fp16 gradient shard (ours: bf16 for
    // ZeRO-2, fp32 for ZeRO-3); ZeRO-3 keeps an fp16 parameter shard (ours gathers from the fp32
    // master shard).
    const double measured_shard = stage <= 1 ? m.grads - full_grads : m.grads;
    double zero_accounting = m.total() - measured_shard;
    if (stage == 2) zero_accounting += measured_shard;
    if (stage == 3) zero_accounting += measured_shard / 2;
    if (stage == 3) zero_accounting += 2 * psi / n;
    CAPTURE(m.params, m.grads, m.optimizer, zero_accounting);
    CHECK(zero_accounting == Approx(published[stage]).epsilon(0.02));
  }
}

/// Megatron's distributed optimizer, 6 + 12/d bytes per parameter.
void check_megatron_distributed_optimizer() {
  // Megatron-LM's distributed optimizer with bf16 parameters and fp32 gradients: 18 bytes per
  // parameter without sharding (d = 1), 6 + 12/d sharded over d data ranks (bf16 parameter 2, fp32
  // gradient 4, fp32 master + moments 12/d). Ours (fully_shard stage 1 in bf16, fp32 master)
  // holds bf16 full gradients with the fp32 gradient shard inside them: ZeRO's 4 + 12/d.
  // Megatron's figure is ours with the full gradients widened to fp32 (FsdpOptions::
  // accumulate_grads_in_master; tests/parity/test_fsdp_parity.cpp measures it on the ledger).
  const models::GPTConfig model{.vocab = 4096, .seq = 64, .dim = 512, .heads = 8, .layers = 2};
  for (int d : {2, 8, 64}) {
    CAPTURE(d);
    const auto z1 = zero_run(model, d, 1), z2 = zero_run(model, d, 2);
    const double psi = model_elements(z1.report);
    REQUIRE(psi > 0);
    const auto m1 = model_states_after_step(z1.report), m2 = model_states_after_step(z2.report);
    CHECK(m1.total() / psi == Approx(4 + 12.0 / d).epsilon(2e-3));
    CHECK(m2.total() / psi == Approx(2 + 14.0 / d).epsilon(2e-3));  // ZeRO-2: a bf16 gradient shard (ZeRO's own)
    const double full_grads = m1.grads;
    const double megatron = m1.params + 2 * full_grads + m1.optimizer;
    CHECK(megatron / psi == Approx(6 + 12.0 / d).epsilon(2e-3));
  }
}

}  // namespace

TEST_CASE("sim: ZeRO Figure 1 (7.5B parameters, 64 ranks, K = 12) from fully_shard on meta", "[sim][figures]") {
  check_zero_figure_1();
}

TEST_CASE("sim: Megatron's distributed optimizer, 6 + 12/d bytes per parameter", "[sim][figures]") {
  check_megatron_distributed_optimizer();
}

namespace {

/// What one ZeRO-3 step left held, by space, and its collectives.
struct OffloadStep {
  std::vector<std::pair<CollectiveKind, std::size_t>> collectives;
  std::int64_t host_states = 0, host_grads = 0, meta_states = 0, meta_grads = 0;  // bytes held after the step
  double psi = 0;  // the model's elements
  sim::ModelStateBytes states;  // in the model's space, as the ledger read them (sim::from_ledger)
};

/// One ZeRO-3 step of a bf16 GPT on a meta "fsdp" mesh of `ranks` (rank 0 of a sim world) with
/// fully_shard<float, StateSpace>.
template <class StateSpace>
OffloadStep offload_step(const models::GPTConfig& config, int ranks) {
  using Mesh = MetaMesh<"fsdp">;
  using Model = models::GPT<dtensor::bfloat16, Mesh>;
  OffloadStep out;
  MemoryLedger ledger;
  Mesh mesh(sim::world(0, ranks), {ranks});
  Model model(mesh, config);
  for (auto& u : model.units()) out.psi += double(u.group->size());
  CommLog log;
  auto fsdp = parallel::fully_shard<float, StateSpace>(model, mesh, {.stage = 3});
  optim::AdamW<float, 1, StateSpace> opt(fsdp.params(), {});
  const auto ids = distribute_replicated<typename Model::Ids::layout>(
      mesh, Tensor<std::int32_t, 2, meta_space>(Shape<2>{Extent(ranks), config.seq}));
  auto [loss, saved] = model.forward(ids, ids);
  model.backward(std::move(saved));
  fsdp.finish_gradient_sync();
  optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
  opt.step();
  fsdp.sync_parameters();
  for (const auto& r : log.records()) out.collectives.emplace_back(r.kind, r.bytes);
  out.host_states = ledger.current("host", MemoryTag::optimizer_state);
  out.host_grads = ledger.current("host", MemoryTag::gradients);
  out.meta_states = ledger.current("meta", MemoryTag::optimizer_state);
  out.meta_grads = ledger.current("meta", MemoryTag::gradients);
  out.states = sim::from_ledger(ledger, StateSpace::name, true);
  return out;
}

}  // namespace

TEST_CASE("sim: CPU offload, fully_shard<float, host_space>: master values, gradient shards and moments on the host",
          "[sim][fsdp][offload]") {
  // ZeRO-Offload's split, on a meta model: the bf16 values and full gradients stay in the model's
  // space (meta here, a GPU in a real run), the fp32 master values and Adam moments (12 bytes
  // per parameter / N) and the fp32 gradient shard (4 / N) live on the host, and the collectives
  // are the same as without offload. Each rank's shards hold ceil(n / N) of every unit's n
  // elements: within 1 % of Psi / N here.
  const models::GPTConfig config{.vocab = 256, .seq = 16, .dim = 64, .heads = 4, .layers = 2};
  constexpr int ranks = 4;
  const auto device = offload_step<meta_space>(config, ranks);
  const auto offloaded = offload_step<host_space>(config, ranks);
  const double psi = device.psi;
  REQUIRE(psi > 0);
  CHECK(offloaded.collectives == device.collectives);
  CHECK(double(device.meta_states) == Approx(12 * psi / ranks).epsilon(0.01));
  CHECK(double(device.meta_grads) == Approx(4 * psi / ranks).epsilon(0.01));
  CHECK(device.host_states == 0);
  CHECK(offloaded.meta_states == 0);
  CHECK(offloaded.meta_grads == 0);
  CHECK(offloaded.host_states == device.meta_states);
  CHECK(offloaded.host_grads == device.meta_grads);
  // Asking for offload without giving the space is an error naming the call.
  using Mesh = MetaMesh<"fsdp">;
  Mesh mesh(sim::world(0, ranks), {ranks});
  models::GPT<dtensor::bfloat16, Mesh> model(mesh, config);
  CHECK_THROWS_WITH(parallel::fully_shard<float>(model, mesh, {.stage = 3, .offload_optimizer = true}),
                    Catch::Contains("fully_shard<M, host_space>"));
}

TEST_CASE("sim: the papers' model-state bytes per parameter, every stage, fp32 and bf16", "[sim][offload]") {
  // docs/fsdp.md's table ("Memory per rank"): what zero_state_bytes() splits into four parts.
  constexpr double psi = 1e6;
  for (const int n : {2, 4, 8}) {
    CAPTURE(n);
    auto per = [&](int stage, int bytes) { return sim::zero_state_bytes(psi, n, stage, bytes).total() / psi; };
    CHECK(per(0, 4) == Approx(16));
    CHECK(per(1, 4) == Approx(8 + 8.0 / n));
    CHECK(per(2, 4) == Approx(4 + 12.0 / n));
    CHECK(per(3, 4) == Approx(16.0 / n));
    CHECK(per(0, 2) == Approx(16));
    CHECK(per(1, 2) == Approx(4 + 12.0 / n));
    CHECK(per(2, 2) == Approx(2 + 14.0 / n));
    CHECK(per(3, 2) == Approx(16.0 / n));
  }
  CHECK_THROWS_WITH(sim::zero_state_bytes(psi, 4, 4, 2), Catch::Contains("stage 4"));
  CHECK_THROWS_WITH(sim::zero_state_bytes(psi, 0, 3, 2), Catch::Contains("shards 0"));
  CHECK_THROWS_WITH(sim::parse_offload("optimizer,gpu"), Catch::Contains("'gpu'"));
  CHECK_THROWS_WITH(sim::parse_offload(""), Catch::Contains("not one of"));
  const auto all = sim::parse_offload("activations,optimizer,params");
  CHECK((all.optimizer && all.params && all.activations));
  CHECK(all.to_string() == "optimizer,params,activations");
}

TEST_CASE("sim: offload tiers (ZeRO-Infinity) from the dry run's ledger: device, host and NVMe bytes per rank",
          "[sim][offload]") {
  // A bf16 ZeRO-3 step on meta (4 ranks): the ledger's states are the papers' (fp32 master 4/N,
  // fp32 gradient shard 4/N, moments 8/N, within 1 %: ceil(n / N) shards). Then each offload
  // moves its bytes to its tier; no byte is lost or counted twice.
  const models::GPTConfig config{.vocab = 256, .seq = 16, .dim = 64, .heads = 4, .layers = 2};
  constexpr int ranks = 4;
  const auto run = offload_step<meta_space>(config, ranks);
  const double psi = run.psi;
  REQUIRE(psi > 0);
  const auto formula = sim::zero_state_bytes(psi, ranks, 3, 2);
  CHECK(run.states.params == 0);
  CHECK(run.states.master == Approx(formula.master).epsilon(0.01));
  CHECK(run.states.moments == Approx(formula.moments).epsilon(0.01));
  CHECK(run.states.grads == Approx(formula.grads).epsilon(0.01));

  const sim::TierInput in{.states = run.states, .activations_peak = 5e6, .saved_activations = 4e6, .blocks = 8, .other = 1e5};
  const double buffer = 1 << 20;
  auto tiers = [&](std::string_view what) {
    return sim::offload_tiers(in, {.offload = sim::parse_offload(what), .buffer_bytes = buffer,
                                   .disk_bytes_per_second = 2e9, .pcie_bytes_per_second = 20e9});
  };
  const auto none = sim::offload_tiers(in, {});
  const double states = run.states.total();
  CHECK(none.bytes.device == Approx(states + 5e6 + 1e5));
  CHECK(none.bytes.host == 0);
  CHECK(none.bytes.disk == 0);
  CHECK(none.disk_bytes_per_step == 0);
  CHECK(none.pcie_bytes_per_step == 0);

  // --offload optimizer: the moments on disk (8/N), master and gradient shard on the host.
  const auto opt = tiers("optimizer");
  CHECK(opt.bytes.disk == Approx(run.states.moments));
  CHECK(opt.bytes.host == Approx(run.states.master + run.states.grads + buffer));
  CHECK(opt.bytes.device == Approx(5e6 + 1e5));
  CHECK(opt.disk_bytes_per_step == Approx(2 * run.states.moments));
  CHECK(opt.disk_seconds == Approx(2 * run.states.moments / 2e9));
  CHECK(opt.pcie_bytes_per_step == Approx(run.states.grads + run.states.moments / 2));

  // optimizer,params: ZeRO-Infinity's NVMe tier holds K = 12 bytes per parameter / N.
  const auto both = tiers("optimizer,params");
  CHECK(both.bytes.disk == Approx(12 * psi / ranks).epsilon(0.01));
  CHECK(both.bytes.host == Approx(run.states.grads + buffer));
  CHECK(both.disk_bytes_per_step == Approx(2 * run.states.moments + 4 * run.states.master));

  // activations: 6 of the 8 blocks' saved bytes leave the device (two stay: in use, prefetched).
  const auto act = tiers("activations");
  CHECK(act.bytes.device == Approx(none.bytes.device - 3e6));
  CHECK(act.bytes.host == Approx(3e6));
  CHECK(act.pcie_bytes_per_step == Approx(6e6));
  CHECK(act.disk_bytes_per_step == 0);

  for (const auto* what : {"optimizer", "params", "optimizer,params", "optimizer,params,activations", "activations"}) {
    CAPTURE(what);
    const auto r = tiers(what);
    const double staged = r.offload.disk() ? buffer : 0;
    CHECK(r.bytes.total() == Approx(none.bytes.total() + staged));
    CHECK(r.bytes.device < none.bytes.device);
  }
  CHECK_THROWS_WITH(sim::offload_tiers({.states = {}, .activations_peak = 1, .saved_activations = 2, .blocks = 1, .other = 0}, {}), Catch::Contains("saved"));

  // ZeRO-Infinity's headline (Rajbhandari et al. 2021): a trillion parameters' model states are
  // 16 TB in mixed precision; on one DGX-2 node (16 GPUs) with optimizer state and parameters
  // on NVMe each GPU keeps no model state, and the node's NVMe holds 12 TB of them (its 28 TB
  // suffice) while the host keeps the fp32 gradient shards (4 TB: the paper's NVMe-offloaded
  // gradients are not modelled here; see docs/offload.md).
  const auto trillion = sim::zero_state_bytes(1e12, 16, 3, 2);
  CHECK(16 * trillion.total() == Approx(16e12));
  sim::TierOptions full;
  full.offload = sim::parse_offload("optimizer,params");
  full.buffer_bytes = 0;
  sim::TierInput states_only;
  states_only.states = trillion;
  const auto node = sim::offload_tiers(states_only, full);
  CHECK(node.bytes.device == 0);
  CHECK(16 * node.bytes.disk == Approx(12e12));
  CHECK(16 * node.bytes.disk < 28e12);
}

// ---------------------------------------------------------------- Korthikanti et al. 2022, Table 2

namespace {

/// The bytes one transformer block's forward leaves saved for its backward, measured from the
/// ledger on meta (the output dropped), and its forward's collectives.
struct BlockSaved {
  std::int64_t bytes = 0;
  std::vector<CommRecord> collectives;
};

template <class Plan>
BlockSaved block_saved(const nn::BlockConfig& config, Extent batch, int tp, bool full_recompute = false) {
  using Mesh = MetaMesh<"tp">;
  using Block = nn::Checkpointed<nn::TransformerBlock<dtensor::bfloat16, Mesh, Plan>>;
  const Mesh mesh(sim::world(0, tp), {tp});
  sim::Recorder rec;
  rec.phase("build");
  const Block block(full_recompute, "h.0", mesh, config, 1);
  const auto x = distribute_replicated<typename Block::In::layout>(
      mesh, Tensor<dtensor::bfloat16, 3, meta_space>(Shape<3>{batch, config.seq, config.dim}));
  rec.phase("forward");
  auto saved = block.forward(x).saved;  // the output is dropped at once
  rec.phase("saved");
  const auto report = rec.finish("block", 1);
  const auto total = [](const sim::TagBytes& bytes) { return std::accumulate(bytes.begin(), bytes.end(), std::int64_t(0)); };
  return {total(report.phase("saved").start) - total(report.phase("forward").start), report.phase("forward").collectives};
}

/// Our saved bytes per block, term by term from what the modules save (bf16 values, e = 2 bytes;
/// ops' statistics in double): norm input x (ln1, ln2); the qkv Linear's input (its input layout:
/// this rank's positions under SP, nn/linear.hpp); q, k, v [B, H/t, T, D]; attention's output
/// (heads); proj's input (the merged heads); the MLP's fc1 input, fc1's output h (4h wide, for
/// GELU's backward) and fc2's input GELU(h). Statistics: mean and rstd per row of each norm
/// (2 x 2 x 8 bytes), the attention's log-sum-exp per (row, head) (8 bytes). Fused attention: no
/// s x s scores or masks; no dropout. Per-module recomputation (nn/recompute.hpp) drops: core_attn
/// the attention output and log-sum-exp; norm the qkv and fc1 inputs (the norms' outputs); act
/// GELU(h); mlp the fc1 input, h and GELU(h). Full recomputation keeps the block input alone.
double our_block_bytes(double s, double b, double h, double a, double t, bool tp, bool sp, nn::Recompute r = {}) {
  const double e = 2, sbh = s * b * h, rows = s * b;
  const double norm_rows = sp ? rows / t : rows, heads = tp ? a / t : a;
  if (r.full) return e * sbh / (sp ? t : 1);
  // Values in units of s·b·h, whole on every tensor rank or split t ways:
  //   no TP     ln1 1, qkv input 1, q k v 3, out 1, proj input 1, ln2 1, fc1 input 1, h 4, GELU(h) 4
  //   TP        whole: ln1, qkv input, ln2, fc1 input; split: q k v, out, proj input, h, GELU(h)
  //   TP + SP   all split (the norms' and the column-wise Linears' inputs: this rank's positions)
  double whole = !tp ? 17 : sp ? 0 : 4, split = !tp ? 0 : sp ? 17 : 13;
  auto drop = [&](double n, bool whole_under_tp) { (!tp ? whole : (whole_under_tp && !sp) ? whole : split) -= n; };
  double lse = 8 * heads * rows;
  if (r.core_attn) drop(1, false), lse = 0;           // attention's output heads
  if (r.norm) drop(r.mlp ? 1 : 2, true);              // the qkv (and fc1) inputs
  if (r.act && !r.mlp) drop(4, false);                // GELU(h)
  if (r.mlp) drop(1, true), drop(8, false);           // fc1 input; h, GELU(h)
  return e * sbh * (whole + split / t) + 2 * 2 * 8 * norm_rows + lse;
}

/// Korthikanti et al. 2022, Table 2 (fp16 activations, 1-byte dropout masks, s x s scores kept):
/// bytes per layer; full recomputation keeps the block input, 2 s·b·h (with SP this rank's 1/t,
/// as Megatron stores it); selective (with SP) keeps 34 s·b·h / t.
double korthikanti_block_bytes(double s, double b, double h, double a, double t, bool tp, bool sp, nn::Recompute r = {}) {
  const double sbh = s * b * h, scores = 5 * a * s / h;
  if (r.full) return 2 * sbh / (sp ? t : 1);
  if (r.core_attn) return sp ? sbh / t * 34 : sbh * (10 + 24 / t);  // the scores' terms recomputed
  if (!tp) return sbh * (34 + scores);
  if (!sp) return sbh * (10 + 24 / t + scores / t);
  return sbh / t * (34 + scores);
}

/// Korthikanti's figure adjusted to what our model has, term by term (docs/dry-run.md): fused
/// attention keeps no s x s scores, softmax output or their dropout mask (5 a s / h → 0); no
/// dropout (their two 1-byte masks per s·b·h, whole under TP, split under SP: −2); attention's
/// output saved by the core besides the out projection's input (+2, split under TP; Megatron's
/// projection shares the core's output storage), none under selective recomputation. What is left
/// between this and the ledger is our statistics (norms' mean/rstd, attention's log-sum-exp).
double korthikanti_adjusted(double s, double b, double h, double a, double t, bool tp, bool sp, nn::Recompute r = {}) {
  const double sbh = s * b * h;
  if (r.full) return korthikanti_block_bytes(s, b, h, a, t, tp, sp, r);
  const double masks = sp ? 2 * sbh / t : 2 * sbh;
  const double out_copy = r.core_attn ? 0 : tp ? 2 * sbh / t : 2 * sbh;
  const double theirs = korthikanti_block_bytes(s, b, h, a, t, tp, sp, r);
  const double scores = r.core_attn ? 0 : 5 * a * s / h * sbh / (tp ? t : 1);
  return theirs - scores - masks + out_copy;
}

}  // namespace

TEST_CASE("sim: Korthikanti Table 2, a GPT-3 175B block's saved activations from the ledger", "[sim][figures]") {
  // GPT-3 175B's shape (s 2048, h 12288, a 96), one sequence, t = 8.
  const nn::BlockConfig config{.dim = 12288, .heads = 96, .seq = 2048};
  const double s = double(config.seq), b = 1, h = double(config.dim), a = double(config.heads), t = 8;
  struct Case {
    const char* name;
    bool tp, sp;
    BlockSaved measured;
  };
  const Case cases[] = {{"no parallelism", false, false, block_saved<nn::ReplicatedPlan>(config, 1, 1)},
                        {"TP", true, false, block_saved<parallel::MegatronPlan<false>>(config, 1, int(t))},
                        {"TP + SP", true, true, block_saved<parallel::MegatronPlan<true>>(config, 1, int(t))}};
  for (const auto& c : cases) {
    const double ours = our_block_bytes(s, b, h, a, t, c.tp, c.sp), theirs = korthikanti_block_bytes(s, b, h, a, t, c.tp, c.sp);
    const double adjusted = korthikanti_adjusted(s, b, h, a, t, c.tp, c.sp);
    CAPTURE(c.name, c.measured.bytes, ours, theirs, adjusted, double(c.measured.bytes) / adjusted);
    CHECK(double(c.measured.bytes) == ours);
    // Fused attention keeps no s x s scores: below their figure, which keeps 5 a s / h of them.
    CHECK(double(c.measured.bytes) < theirs);
    // Their formula, adjusted for what our model has: within 5 % (the rest is our statistics).
    CHECK(std::abs(double(c.measured.bytes) / adjusted - 1) < 0.05);
  }
  // The collectives of the forward: none without TP; with TP, one all-reduce per region exit (2);
  // with SP, an all-gather of the sequence at each entry and a reduce-scatter at each exit (2 + 2),
  // each of the gathered s·b·h values (the larger of input and output) in bf16.
  CHECK(cases[0].measured.collectives.empty());
  const double gathered = s * b * h * 2;
  for (const auto& c : {cases[1], cases[2]}) {
    CAPTURE(c.name);
    std::map<CollectiveKind, int> count;
    for (const auto& r : c.measured.collectives) {
      ++count[r.kind];
      CHECK(r.group == "tp");
      CHECK(double(r.bytes) == gathered);
    }
    if (c.sp) CHECK(count == std::map<CollectiveKind, int>{{CollectiveKind::all_gather, 2}, {CollectiveKind::reduce_scatter, 2}});
    else CHECK(count == std::map<CollectiveKind, int>{{CollectiveKind::all_reduce, 2}});
  }
}

TEST_CASE("sim: Korthikanti's formulas under recomputation: full, selective, and per module, from the ledger",
          "[sim][figures]") {
  // GPT-3 175B's shape, t = 8, bf16, on meta: the bytes one block's forward leaves saved.
  nn::BlockConfig config{.dim = 12288, .heads = 96, .seq = 2048};
  const double s = double(config.seq), b = 1, h = double(config.dim), a = double(config.heads), t = 8;
  auto measure = [&](bool tp, bool sp, nn::Recompute r) {
    config.recompute = r;
    if (!tp) return block_saved<nn::ReplicatedPlan>(config, 1, 1, r.full);
    if (!sp) return block_saved<parallel::MegatronPlan<false>>(config, 1, int(t), r.full);
    return block_saved<parallel::MegatronPlan<true>>(config, 1, int(t), r.full);
  };
  // Korthikanti's rows: full recomputation (2 s·b·h; with SP the 1/t Megatron keeps) and
  // selective with SP (34 s·b·h / t), within 5 % of their formula adjusted to our model.
  struct Row {
    const char* name;
    bool tp, sp;
    nn::Recompute r;
  };
  const Row korthikanti[] = {{"full, no parallelism", false, false, nn::Recompute::parse("full")},
                             {"full, TP + SP", true, true, nn::Recompute::parse("full")},
                             {"selective, TP + SP", true, true, nn::Recompute::parse("selective")}};
  for (const auto& row : korthikanti) {
    const auto m = measure(row.tp, row.sp, row.r);
    const double ours = our_block_bytes(s, b, h, a, t, row.tp, row.sp, row.r);
    const double adjusted = korthikanti_adjusted(s, b, h, a, t, row.tp, row.sp, row.r);
    CAPTURE(row.name, m.bytes, ours, adjusted, double(m.bytes) / adjusted);
    CHECK(double(m.bytes) == ours);
    CHECK(std::abs(double(m.bytes) / adjusted - 1) < 0.05);
  }
  // Full recomputation keeps exactly the block input.
  CHECK(double(measure(false, false, nn::Recompute::parse("full")).bytes) == 2 * s * b * h);
  // Per module (Megatron's --recompute-modules), TP + SP: each drops exactly its terms, the
  // forward's collectives unchanged (recomputation issues them again in backward, not here).
  const auto none = measure(true, true, {});
  for (const char* list : {"core_attn", "norm", "act", "mlp", "norm,act", "core_attn,norm,act", "core_attn,norm,mlp"}) {
    const auto r = nn::Recompute::parse(list);
    const auto m = measure(true, true, r);
    CAPTURE(list, m.bytes, none.bytes);
    CHECK(double(m.bytes) == our_block_bytes(s, b, h, a, t, true, true, r));
    CHECK(m.bytes < none.bytes);
    CHECK(m.collectives.size() == none.collectives.size());
  }
  // selective + norms + activation: 34 → 20 s·b·h / t (attention output 2, norms' outputs 4, GELU(h) 8).
  CHECK(double(measure(true, true, nn::Recompute::parse("core_attn,norm,act")).bytes) ==
        Approx(s * b * h / t * (34 - 2 - 4 - 8)).epsilon(0.01));
}

TEST_CASE("sim: a plan's dry run honours GPTConfig::recompute (plan_at_scale --recompute)", "[sim][recompute]") {
  // PP 2 x DP 4 x TP 2 + SP, bf16: the activations each class holds after its forward shrink with
  // each recomputation, in the order of the per-layer table (docs/dry-run.md); an MoE model
  // refuses recomputing norms (its feed-forward exposes no saved input) by name.
  const models::TrainingPlan base{
      .model = {.vocab = 512, .seq = 64, .dim = 64, .heads = 4, .layers = 4, .mlp_ratio = 4},
      .batch = 16,
      .microbatches = 4,
      .dp = 4,
      .tp = 2,
      .pp = 2};
  auto held = [&](const char* list) {
    auto p = base;
    p.model.recompute = nn::Recompute::parse(list);
    std::vector<std::int64_t> out;
    for (const auto& c : models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(p))
      out.push_back(c.report.phase("forward").end[std::size_t(MemoryTag::activations)]);
    return out;
  };
  const auto none = held("none"), selective = held("selective"), norm_act = held("norm,act"), mlp = held("mlp"),
             full = held("full");
  REQUIRE(none.size() == 2);
  for (std::size_t i = 0; i < none.size(); ++i) {
    CAPTURE(i, none[i], selective[i], norm_act[i], mlp[i], full[i]);
    CHECK(none[i] > selective[i]);
    CHECK(selective[i] > norm_act[i]);
    CHECK(norm_act[i] > mlp[i]);
    CHECK(mlp[i] > full[i]);
  }
  auto moe = base;
  moe.moe.router.experts = 8;
  moe.moe.router.topk = 2;
  moe.moe.every = 2;
  moe.ep = 4;
  moe.model.recompute = nn::Recompute::parse("norm");
  CHECK_THROWS_WITH(
      (models::dry_run_plan<dtensor::bfloat16, models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>, true>(
          moe)),
      Catch::Contains("recompute norm"));
  moe.model.recompute = nn::Recompute::parse("act,mlp");
  CHECK_NOTHROW(
      models::dry_run_plan<dtensor::bfloat16, models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>, true>(
          moe));
}

// ---------------------------------------------------------------- the Llama-3-405B plans

namespace {

/// Llama 3 405B (Llama 3 report, Table 3): 126 layers, 16384 wide, 128 heads, 8 KV heads, ffn 53248.
models::GPTConfig llama_405b(Extent seq) {
  return {.vocab = 128256, .seq = seq, .dim = 16384, .heads = 128, .layers = 126, .checkpoint = true, .kv_heads = 8,
          .ffn = 53248, .rope_theta = 500000, .bias = false};
}

/// The classes of a plan whose pipeline ranks hold only blocks (no embedding, no head).
std::vector<const models::PlanClass*> middle_ranks(const std::vector<models::PlanClass>& classes, int pp) {
  std::vector<const models::PlanClass*> middle;
  for (const auto& c : classes)
    if (c.pipeline_rank != 0 && c.pipeline_rank != pp - 1) middle.push_back(&c);
  return middle;
}

/// ZeRO-1 over the data ranks inside the stages: bf16 values and full gradients (2 + 2 bytes per
/// parameter), fp32 gradient shard (4 / d) and fp32 master values + AdamW moments (12 / d): the
/// Llama 3 report's distributed optimizer. d: the shard ranks, dp x cp (the context ranks shard
/// the states too, parallel::FsdpShardDims).
void check_zero1_states(const sim::RankReport& r, double data_ranks) {
  const auto m = model_states_after_step(r);
  const double psi = model_elements(r);
  CAPTURE(r.name, psi, m.params, m.grads, m.optimizer);
  CHECK(m.params == Approx(2 * psi).epsilon(1e-6));
  CHECK(m.grads == Approx(2 * psi).epsilon(1e-3));  // the fp32 gradient shard lives inside them
  CHECK(m.optimizer == Approx(12 * psi / data_ranks).epsilon(1e-3));
}

/// The plan's classes, after checking that they cover its 16,384 GPUs, that each fits in an
/// H100's 80 GB with the schedule's micro-batches in flight, and holds ZeRO-1's model states.
std::vector<models::PlanClass> llama_plan_fits(const models::TrainingPlan& plan) {
  auto classes = models::dry_run_plan<dtensor::bfloat16, models::LlamaLayers, true>(plan);
  REQUIRE(plan.gpus() == 16384);
  std::int64_t ranks = 0;
  for (const auto& c : classes) {
    ranks += c.report.ranks;
    CAPTURE(c.report.name, c.peak_in_flight);
    CHECK(c.peak_in_flight < 80e9);
    check_zero1_states(c.report, plan.dp * plan.cp);
  }
  CHECK(ranks == plan.gpus());
  return classes;
}

}  // namespace

TEST_CASE("sim: Llama-3-405B, TP 8 x PP 16 x DP 128 on 16,384 GPUs: memory and TP collectives", "[sim][figures][llama]") {
  // Llama 3 report, Table 4: seq 8192, 16M tokens a step (2048 sequences), 16 micro-batches.
  const models::TrainingPlan plan{
      .model = llama_405b(8192), .batch = 2048, .microbatches = 16, .dp = 128, .tp = 8, .pp = 16, .zero = 1};
  const auto classes = llama_plan_fits(plan);
  // Per block, forward, on "tp": the sequence all-gathered at the entry of attention and of the
  // feed-forward and reduce-scattered at their exits, each call of s·b·h bf16 values gathered
  // (s·b·h/t per rank): s = 8192, b = 2048 / 16 / 128 = 1, h = 16384.
  const auto stage_layers = parallel::pipeline::stage_layers(plan.model.layers, plan.pp);
  const auto middle = middle_ranks(classes, plan.pp);
  REQUIRE(!middle.empty());
  const double gathered = double(plan.model.seq) * double(plan.micro_batch() / plan.dp) * double(plan.model.dim) * 2;
  for (const auto* c : middle) {
    const auto [first, end] = stage_layers[std::size_t(c->pipeline_rank)];
    std::map<CollectiveKind, int> count;
    for (const auto& r : c->report.phase("forward").collectives) {
      if (r.group != "tp") continue;
      ++count[r.kind];
      CHECK(double(r.bytes) == gathered);
    }
    CAPTURE(c->report.name, end - first);
    CHECK(count == std::map<CollectiveKind, int>{{CollectiveKind::all_gather, int(2 * (end - first))},
                                                 {CollectiveKind::reduce_scatter, int(2 * (end - first))}});
  }
}

TEST_CASE("sim: Llama-3-405B long context, TP 8 x CP 16 x PP 16 x DP 8 at seq 131072", "[sim][figures][llama]") {
  // Llama 3 report, Table 4: the long-context stage, 16M tokens a step (128 sequences of 131072).
  // Context parallelism as Llama 3's: K and V all-gathered over the context group (load-balanced).
  const models::TrainingPlan plan{.model = llama_405b(131072),
                                  .batch = 128,
                                  .microbatches = 16,
                                  .dp = 8,
                                  .tp = 8,
                                  .pp = 16,
                                  .zero = 1,
                                  .cp = 16,
                                  .cp_kind = parallel::ContextKind::allgather};
  const auto classes = llama_plan_fits(plan);
  // Per block, forward, on "cp": one all-gather of K and one of V, each of the whole sequence
  // gathered: the KV heads, s·b·kv_heads/t·d bf16 values (s/cp of them per rank), as Llama 3
  // gathers them — grouped-query K/V are repeated to the query heads after the exchange.
  const auto stage_layers = parallel::pipeline::stage_layers(plan.model.layers, plan.pp);
  const double head_dim = double(plan.model.dim / plan.model.heads), b = double(plan.micro_batch() / plan.dp);
  const double llama3_kv = double(plan.model.seq) * b * double(plan.model.kv_heads / plan.tp) * head_dim * 2;
  const auto middle = middle_ranks(classes, plan.pp);
  REQUIRE(!middle.empty());
  for (const auto* c : middle) {
    const auto [first, end] = stage_layers[std::size_t(c->pipeline_rank)];
    int gathers = 0;
    for (const auto& r : c->report.phase("forward").collectives) {
      if (r.group != "cp") continue;
      CHECK(r.kind == CollectiveKind::all_gather);
      CHECK(double(r.bytes) == llama3_kv);
      ++gathers;
    }
    CAPTURE(c->report.name);
    CHECK(gathers == 2 * int(end - first));
  }
}

TEST_CASE("sim: expert parallelism, dry: the routed rows' all-to-alls and the experts' parameter bytes", "[sim][moe]") {
  // A small GPT, PP 2 x DP 4 x TP 2 + SP in bf16 (DDP), with MoE in blocks 1 and 3: 8 experts,
  // top-2, over EP 4. A rank's micro-batch is 16 / 4 / 4 = 1 sequence of 64 tokens; the MoE
  // routes whole tokens (SP gathers them). Balanced routing puts a token's two choices 4 experts
  // apart, on two of the 4 expert ranks, so every rank sends 64 x 2 units (32 and 32 pairs to
  // each peer) and receives as many; per peer the dispatch adds the pairs' side array (int32 +
  // bf16 each: 192 bytes, 2 rows of 64 bf16) and its adjoint their gate gradients (64 bytes, 1 row).
  constexpr Extent dim = 64, hidden = 4 * dim, experts = 8, topk = 2, tokens = 64;
  constexpr int ep = 4, tp = 2;
  const models::TrainingPlan dense{
      .model = {.vocab = 512, .seq = tokens, .dim = dim, .heads = 4, .layers = 4, .mlp_ratio = 4},
      .batch = 16,
      .microbatches = 4,
      .dp = 4,
      .tp = tp,
      .pp = 2};
  models::TrainingPlan moe = dense;
  moe.moe.router.experts = experts;
  moe.moe.router.topk = topk;
  moe.moe.every = 2;
  moe.ep = ep;
  const auto dense_classes = models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(dense);
  const auto moe_classes =
      models::dry_run_plan<dtensor::bfloat16, models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>, true>(
          moe);
  REQUIRE(moe_classes.size() == dense_classes.size());
  const auto rows = [](std::int64_t n) { return std::size_t(n * dim) * sizeof(dtensor::bfloat16); };
  const std::int64_t units = tokens * topk, per_peer = units / ep;
  const std::size_t dispatch = rows(units + ep * 2), combine = rows(units), dispatch_backward = rows(units + ep * 1);
  // Parameters per rank of one MoE block minus its dense MLP: the router [E, C] (replicated) and
  // E / ep experts (fc1, fc2 and their biases, replicated on "tp") replace the MLP, whose fc1 and
  // its bias are split on "tp" (column-parallel), fc2 split and its bias replicated (row-parallel).
  const Extent moe_block = experts * dim + experts / ep * (2 * hidden * dim + hidden + dim);
  const Extent mlp_block = 2 * hidden * dim / tp + hidden / tp + dim;
  const auto tag = std::size_t(MemoryTag::parameters);
  for (std::size_t i = 0; i < moe_classes.size(); ++i) {
    const auto& report = moe_classes[i].report;
    CAPTURE(report.name);
    REQUIRE(report.name == dense_classes[i].report.name);
    const int moe_blocks = 1;  // blocks 0, 1 on pipeline rank 0 and 2, 3 on rank 1: one MoE block each
    CHECK(per_peer * 6 == 192);  // the side array's bytes per peer, as said above
    for (const char* phase : {"forward", "backward"}) {
      const bool forward = std::string(phase) == "forward";
      std::vector<std::pair<CollectiveKind, std::size_t>> ep_log;
      for (const auto& r : report.phase(phase).collectives) {
        if (r.group != "ep") continue;
        CHECK(r.group_size == ep);
        ep_log.emplace_back(r.kind, r.bytes);
      }
      // The count exchange: per peer its units and its 2 experts' pairs (int64).
      using E = std::pair<CollectiveKind, std::size_t>;
      const auto expected =
          forward ? std::vector<E>{{CollectiveKind::all_to_all, std::size_t(ep * 3) * sizeof(std::int64_t)},
                                   {CollectiveKind::all_to_all_v, dispatch},
                                   {CollectiveKind::all_to_all_v, combine}}
                  : std::vector<E>{{CollectiveKind::all_to_all_v, combine},
                                   {CollectiveKind::all_to_all_v, dispatch_backward}};
      CHECK(ep_log.size() == expected.size() * moe_blocks);
      for (std::size_t j = 0; j < ep_log.size(); ++j) CHECK(ep_log[j] == expected[j % expected.size()]);
    }
    const auto moe_params = report.phase("parameters").end[tag], dense_params = dense_classes[i].report.phase("parameters").end[tag];
    CHECK(moe_params - dense_params == std::int64_t(moe_blocks * (moe_block - mlp_block)) * std::int64_t(sizeof(dtensor::bfloat16)));
    // The experts' gradients are reduce-scattered on "edp" by their FSDP group as their block's
    // backward ends (size dp x cp / ep = 1 here: no bytes on the wire), never all-reduced.
    int edp_reductions = 0, edp_all_reduces = 0;
    for (const auto& ph : report.phases)
      for (const auto& r : ph.collectives) {
        edp_reductions += r.group == "edp" && r.kind == CollectiveKind::reduce_scatter;
        edp_all_reduces += r.group == "edp" && r.kind == CollectiveKind::all_reduce;
      }
    CHECK(edp_reductions == moe_blocks);
    CHECK(edp_all_reduces == 0);
  }
  // The estimate reads the expert mesh's links (an "ep" group of 4 x tp 2 ranks lies inside a node of 8).
  const sim::Topology topology = models::plan_topology(moe, sim::Hardware{});
  CHECK(topology.inside_node("ep"));
  CHECK_FALSE(topology.inside_node("pp"));
  CHECK_THROWS_WITH(sim::check_plan([&] {
                      auto bad = moe;
                      bad.ep = 3;
                      return bad;
                    }()),
                    Catch::Contains("ep 3 must divide dp x cp = 4"));
}

TEST_CASE("sim: experts that do not divide over ep (5 over 2): the plan runs, and its classes are every rank's work",
          "[sim][moe]") {
  // The GPT of the test above, PP 2 x DP 4 x TP 2, MoE in blocks 1 and 3 with 5 experts over ep 2:
  // the expert ranks hold 3 and 2 experts (chunk_range), alternating over the data ranks.
  constexpr Extent dim = 64, experts = 5;
  using Layers = models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>;
  models::TrainingPlan p{.model = {.vocab = 512, .seq = 64, .dim = dim, .heads = 4, .layers = 4, .mlp_ratio = 4},
                         .batch = 16,
                         .microbatches = 4,
                         .dp = 4,
                         .tp = 2,
                         .pp = 2};
  p.moe.router.experts = experts;
  p.moe.router.topk = 2;
  p.moe.every = 2;
  p.ep = 2;
  REQUIRE_NOTHROW(sim::check_plan(p));
  const auto classes = models::dry_run_plan<dtensor::bfloat16, Layers, true>(p);
  std::int64_t covered = 0;
  for (const auto& c : classes) covered += c.report.ranks;
  CHECK(covered == p.gpus());
  // The step of every rank on its own (the same program, one class per rank): each rank's memory
  // and traffic is its class's, so the classes' largest figures are the ranks' largest. The
  // program is the plan as it runs: DDP in bf16 with fp32 master and moments (sim::as_run).
  const auto ran = sim::as_run(p, true);
  const auto shape = models::detail::pipeline_shape(ran);
  std::vector<sim::RankClass<5>> every_rank;
  for (int r = 0; r < p.gpus(); ++r) every_rank.push_back({detail::row_major_coordinate(shape, r), 1});
  const auto each = sim::dry_run<5>(shape, every_rank, [&](CommPtr world, sim::Recorder& rec) {
    models::detail::pipeline_rank_step<dtensor::bfloat16, Layers, true>(std::move(world), ran, rec);
  });
  // A pipeline send's peer is a rank of the whole world: the one thing ranks of a class do not share.
  auto without_peers = [](std::string s) {
    for (std::size_t at = s.find(" peer="); at != std::string::npos; at = s.find(" peer=", at)) {
      const std::size_t end = s.find('\n', at);
      s.erase(at, end - at);
    }
    return s;
  };
  // Every rank's collectives are its class's exactly; its memory per phase and tag within 1 % of
  // its class's: the experts are sharded over "edp", and which parameters' pieces a shard holds
  // (and so the optimizer's per-piece state) depends on the rank's place in "edp", by a few
  // hundred bytes, which the classes do not distinguish (as for the dense units over "fsdp").
  auto traffic = [&](const sim::RankReport& r) {
    std::string s;
    for (const auto& ph : r.phases) s += ph.name + "\n" + log_lines(ph.collectives);
    return without_peers(s);
  };
  // Per pipeline rank, each tag's figures of its ranks (after the optimizer step).
  constexpr std::array tags{MemoryTag::parameters, MemoryTag::gradients, MemoryTag::optimizer_state};
  std::map<int, std::array<std::vector<std::int64_t>, tags.size()>> held_by_stage;
  for (int r = 0; r < p.gpus(); ++r) {
    const auto& mine = each[std::size_t(r)];
    INFO("rank " << r << " at " << to_string(every_rank[std::size_t(r)].coordinate));
    const sim::RankReport* match = nullptr;
    for (const auto& c : classes)
      if (traffic(c.report) == traffic(mine) && c.pipeline_rank == every_rank[std::size_t(r)].coordinate[0]) {
        bool close = c.report.phases.size() == mine.phases.size();
        for (std::size_t i = 0; close && i < mine.phases.size(); ++i)
          for (std::size_t t = 0; t < memory_tag_count; ++t)
            close = close && std::abs(double(c.report.phases[i].peak[t] - mine.phases[i].peak[t])) <=
                                 0.01 * double(std::max<std::int64_t>(1, c.report.phases[i].peak[t]));
        if (close) match = &c.report;
      }
    CHECK(match != nullptr);
    for (std::size_t t = 0; t < tags.size(); ++t)
      held_by_stage[every_rank[std::size_t(r)].coordinate[0]][t].push_back(
          mine.phase("optimizer").end[std::size_t(tags[t])]);
  }
  // Per pipeline rank two groups of ranks: those with 3 experts in their one MoE block hold one
  // expert's model states more than those with 2 (each rank's amounts are its class's, checked
  // above), and nothing more: a flat buffer reserves a parameter's largest piece only along the
  // mesh dimensions where ranks align its ranges (nn::FlatEntry::slot), and along "ep" every
  // expert parameter is Shard, so a 2-expert rank's buffers hold 2 experts, no zero gap. The
  // experts run as DDP does in bf16 (ZeRO-1 over "edp", dp / ep = 2 ranks): bf16 values and
  // gradients whole (2 + 2 bytes per element), the fp32 master and two fp32 moments sharded over
  // "edp" ((4 + 8) / edp): 16 bytes per element of state. An expert is two dim x ffn matrices
  // and their biases, whole on every tensor rank. Within 1 %: the flat shards' padding.
  const double expert = 2.0 * dim * (4 * dim) + 4 * dim + dim;
  const double edp = double(p.dp / p.ep);
  const std::array<double, tags.size()> per_element{2.0, 2.0, (4.0 + 8.0) / edp};
  for (const auto& [stage, held] : held_by_stage)
    for (std::size_t t = 0; t < tags.size(); ++t) {
      INFO("pipeline rank " << stage << ", " << name_of(tags[t]));
      const auto [lo, hi] = std::minmax_element(held[t].begin(), held[t].end());
      CHECK(double(*hi - *lo) == Approx(per_element[t] * expert).epsilon(0.01));
    }
}

TEST_CASE("sim: group-limited routing: every rank's dry run sends and holds what its real step does", "[sim][moe]") {
  // 8 experts in 4 groups (a group per expert rank of ep 4), top-4 from 2 groups: each token's
  // row goes to 2 ranks with 2 choices each (the merged dispatch: 2 rows, not 4). The real step
  // on host tensors over 4 rank threads routes as the dry run assumes (force_balanced, which
  // keeps the group limit), so every rank's collectives (kind, group, bytes; every phase) are
  // its dry run's, the dispatch's bytes the merged ones, and so are its memory peaks per tag.
  constexpr Extent dim = 32, seq = 16;
  using MetaLayers = models::MoELayers<double, MetaMesh<"edp", "ep", "tp">>;
  using HostLayers = models::MoELayers<double, DeviceMesh<"edp", "ep", "tp">>;
  models::TrainingPlan p{.model = {.vocab = 64, .seq = seq, .dim = dim, .heads = 4, .layers = 1, .mlp_ratio = 4},
                         .batch = 4,
                         .microbatches = 1,
                         .dp = 4};
  p.moe.router.experts = 8;
  p.moe.router.topk = 4;
  p.moe.router.groups = 4;
  p.moe.router.topk_groups = 2;
  p.moe.router.force_balanced = true;
  p.ep = 4;
  const auto ran = sim::as_run(p, false);
  const auto shape = models::detail::pipeline_shape(ran);
  std::vector<sim::RankClass<5>> every_rank;
  for (int r = 0; r < 4; ++r) every_rank.push_back({detail::row_major_coordinate(shape, r), 1});
  const auto dry = sim::dry_run<5>(shape, every_rank, [&](CommPtr world, sim::Recorder& rec) {
    models::detail::pipeline_rank_step<double, MetaLayers, false>(std::move(world), ran, rec);
  });
  std::vector<sim::RankReport> real(4);
  threads::run(4, [&](CommPtr world) {
    sim::Recorder rec("host");
    const int rank = world->rank();
    models::detail::pipeline_rank_step<double, HostLayers, false, host_space>(std::move(world), ran, rec);
    real[std::size_t(rank)] = rec.finish("real");
  });
  // A rank's 16 tokens reach 2 ranks each: 32 units, 8 to each peer with 16 pairs (int32 + double:
  // 192 bytes, 1 row of 32 doubles); the dispatch sends 4 x (8 + 1) rows, not 16 x 4, and so
  // does its adjoint (16 gate gradients: 128 bytes, 1 row). Setup (the "parameters" phase) is
  // left out of the comparison: a real run's settings agreement all-gathers there, a dry run's
  // does not (distributed/settings_agreement.hpp).
  const std::size_t dispatch = std::size_t(4 * (8 + 1) * dim) * sizeof(double);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(dry[r].phases.size() == real[r].phases.size());
    int dispatches = 0;
    for (std::size_t ph = 0; ph < real[r].phases.size(); ++ph) {
      INFO("phase " << real[r].phases[ph].name);
      if (real[r].phases[ph].name != "parameters")
        CHECK(log_lines(dry[r].phases[ph].collectives) == log_lines(real[r].phases[ph].collectives));
      for (const auto& c : real[r].phases[ph].collectives)
        if (c.group == "ep" && c.kind == CollectiveKind::all_to_all_v && c.bytes == dispatch) ++dispatches;
      for (std::size_t t = 0; t < memory_tag_count; ++t) {
        INFO(name_of(MemoryTag(t)));
        CHECK(dry[r].phases[ph].peak[t] == real[r].phases[ph].peak[t]);
      }
    }
    CHECK(dispatches == 2);  // the one MoE block's dispatch and its adjoint
  }
}

TEST_CASE("sim: experts that do not divide over ep: every rank's dry run holds its real step's model states",
          "[sim][moe][memory]") {
  // 5 experts over ep 2 (3 + 2) on dp 4 (edp 2 x ep 2), every block MoE, bf16 with fp32 master
  // and moments: DDP (the trainer's ZeRO-1, the experts over "edp") and ZeRO-3. The same step
  // (models::detail::pipeline_rank_step) on meta tensors for every rank over the sim
  // communicator and on host tensors over 4 rank threads: every phase's parameters, gradients
  // and optimizer state are equal on every rank, the 3-expert ranks (ep 0: ranks 0, 2) and the
  // 2-expert ones (ep 1: ranks 1, 3) alike; and the two differ by exactly one expert per MoE
  // block in each (no gap of a third expert on the 2-expert ranks: nn::FlatEntry::slot).
  constexpr Extent dim = 32, experts = 5, layers = 2;
  using MetaLayers = models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>;
  using HostLayers = models::MoELayers<dtensor::bfloat16, DeviceMesh<"edp", "ep", "tp">>;
  for (const int zero : {0, 3}) {
    models::TrainingPlan p{.model = {.vocab = 64, .seq = 16, .dim = dim, .heads = 4, .layers = layers, .mlp_ratio = 4},
                           .batch = 8,
                           .microbatches = 1,
                           .dp = 4,
                           .zero = zero};
    p.moe.router.experts = experts;
    p.moe.router.topk = 2;
    p.ep = 2;
    INFO("ZeRO-" << zero << " (0: DDP)");
    const auto ran = sim::as_run(p, true);
    const auto shape = models::detail::pipeline_shape(ran);
    std::vector<sim::RankClass<5>> every_rank;
    for (int r = 0; r < 4; ++r) every_rank.push_back({detail::row_major_coordinate(shape, r), 1});
    const auto dry = sim::dry_run<5>(shape, every_rank, [&](CommPtr world, sim::Recorder& rec) {
      models::detail::pipeline_rank_step<dtensor::bfloat16, MetaLayers, false>(std::move(world), ran, rec);
    });
    std::vector<sim::RankReport> real(4);
    threads::run(4, [&](CommPtr world) {
      sim::Recorder rec("host");
      const int rank = world->rank();
      models::detail::pipeline_rank_step<dtensor::bfloat16, HostLayers, false, host_space>(std::move(world), ran, rec);
      real[std::size_t(rank)] = rec.finish("real");
    });
    constexpr std::array tags{MemoryTag::parameters, MemoryTag::gradients, MemoryTag::optimizer_state};
    for (std::size_t r = 0; r < 4; ++r) {
      REQUIRE(dry[r].phases.size() == real[r].phases.size());
      for (std::size_t ph = 0; ph < real[r].phases.size(); ++ph)
        for (const MemoryTag t : tags) {
          INFO("rank " << r << ", phase " << real[r].phases[ph].name << ", " << name_of(t));
          CHECK(dry[r].phases[ph].peak[std::size_t(t)] == real[r].phases[ph].peak[std::size_t(t)]);
          CHECK(dry[r].phases[ph].end[std::size_t(t)] == real[r].phases[ph].end[std::size_t(t)]);
        }
    }
    // The plan's rank classes (models::dry_run_plan): the 3-expert and the 2-expert shares, each
    // holding exactly what a real rank of its share holds.
    const auto classes = models::dry_run_plan<dtensor::bfloat16, MetaLayers, false>(p);
    REQUIRE(classes.size() == 2);
    std::set<std::size_t> matched;
    for (const auto& c : classes)
      for (std::size_t r = 0; r < 2; ++r) {
        bool same = c.report.phases.size() == real[r].phases.size();
        for (std::size_t ph = 0; same && ph < real[r].phases.size(); ++ph)
          for (const MemoryTag t : tags)
            same = same && c.report.phases[ph].peak[std::size_t(t)] == real[r].phases[ph].peak[std::size_t(t)] &&
                   c.report.phases[ph].end[std::size_t(t)] == real[r].phases[ph].end[std::size_t(t)];
        if (same) matched.insert(r);
      }
    CHECK(matched == std::set<std::size_t>{0, 1});  // rank 0: 3 experts, rank 1: 2
    // What a 3-expert rank holds beyond a 2-expert rank after the step, per element of one expert
    // per MoE block, on "edp" = dp / ep = 2 ranks: DDP (ZeRO-1) keeps bf16 values and gradients
    // whole (2 + 2) and shards the fp32 master and moments ((4 + 8) / edp); ZeRO-3 keeps the
    // shards only: the fp32 gradient shard (4 / edp) and the fp32 master and moments ((4 + 8) / edp).
    const double edp = double(p.dp / p.ep);
    const double expert = double(layers) * (2.0 * dim * (4 * dim) + 4 * dim + dim);
    const std::array<double, tags.size()> per_element =
        zero == 0 ? std::array{2.0, 2.0, 12.0 / edp} : std::array{0.0, 4.0 / edp, 12.0 / edp};
    for (std::size_t t = 0; t < tags.size(); ++t)
      for (const auto& [three, two] : {std::pair{0, 1}, std::pair{2, 3}}) {
        INFO(name_of(tags[t]) << ": rank " << three << " (3 experts) less rank " << two << " (2 experts)");
        const auto held = [&](int r) {
          return double(real[std::size_t(r)].phase("optimizer").end[std::size_t(tags[t])]);
        };
        CHECK(held(three) - held(two) == Approx(per_element[t] * expert).epsilon(0.01).margin(64));
      }
  }
}

TEST_CASE("sim: FP8 GEMMs, dry: the Linears' and experts' GEMMs as gemm_fp8, their amax all-reduces as a real step's",
          "[sim][fp8]") {
  // train_gpt --dtype fp8 (nn::Fp8Autocast: every nn::Linear's three GEMMs and the routed
  // experts' in FP8) on meta: the same GEMM FLOPs as the bf16 step, all now op "gemm_fp8", each
  // operand quantized ("quantize_fp8"), and each amax max-all-reduced over the mesh dimensions
  // that split its tensor (the experts': their rows' per expert over "edp"): phase by phase the
  // all-reduces of the same step on 4 rank threads (the MoE step of the test above: its routing,
  // and so its all-to-all bytes, are the data's on threads and balanced on meta; its all-reduces
  // are not).
  constexpr Extent dim = 32, experts = 5, layers = 2;
  using MetaLayers = models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>;
  using HostLayers = models::MoELayers<dtensor::bfloat16, DeviceMesh<"edp", "ep", "tp">>;
  models::TrainingPlan p{.model = {.vocab = 64, .seq = 16, .dim = dim, .heads = 4, .layers = layers, .mlp_ratio = 4},
                         .batch = 8,
                         .microbatches = 1,
                         .dp = 4};
  p.moe.router.experts = experts;
  p.moe.router.topk = 2;
  p.ep = 2;
  const auto ran = sim::as_run(p, true);
  const auto shape = models::detail::pipeline_shape(ran);
  std::vector<sim::RankClass<5>> every_rank;
  for (int r = 0; r < 4; ++r) every_rank.push_back({detail::row_major_coordinate(shape, r), 1});
  const auto dry = [&](bool fp8) {
    const nn::Fp8Autocast autocast(fp8);
    return sim::dry_run<5>(shape, every_rank, [&](CommPtr world, sim::Recorder& rec) {
      models::detail::pipeline_rank_step<dtensor::bfloat16, MetaLayers, false>(std::move(world), ran, rec);
    });
  };
  const auto dry_bf16 = dry(false), dry_fp8 = dry(true);
  std::vector<sim::RankReport> real(4);
  {
    const nn::Fp8Autocast autocast(true);
    threads::run(4, [&](CommPtr world) {
      sim::Recorder rec("host");
      const int rank = world->rank();
      models::detail::pipeline_rank_step<dtensor::bfloat16, HostLayers, false, host_space>(std::move(world), ran, rec);
      real[std::size_t(rank)] = rec.finish("real");
    });
  }
  const auto flops = [](const sim::RankReport& r, std::string_view op) {
    std::int64_t n = 0;
    for (const auto& ph : r.phases)
      for (const auto& o : ph.ops)
        if (o.op == op) n += o.flops;
    return n;
  };
  const auto all_reduces = [](const sim::RankReport& r) {
    std::vector<std::string> out;
    for (const auto& ph : r.phases)
      for (const auto& c : ph.collectives)
        if (c.kind == CollectiveKind::all_reduce) out.push_back(detail::cat(ph.name, " ", c.group, " ", c.bytes));
    return out;
  };
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(flops(dry_fp8[r], "gemm_fp8") > 0);
    CHECK(flops(dry_fp8[r], "quantize_fp8") > 0);
    CHECK(flops(dry_fp8[r], "gemm") + flops(dry_fp8[r], "gemm_fp8") == flops(dry_bf16[r], "gemm"));
    CHECK(flops(dry_fp8[r], "gemm") == 0);  // the experts' too (attention is fused: no batched GEMM)
    CHECK(flops(dry_bf16[r], "gemm_fp8") == 0);
    CHECK(all_reduces(dry_fp8[r]) == all_reduces(real[r]));
    // The amaxes: per Linear x's in its forward and dy's in its backward over the data ranks
    // (tp 1: the weights are whole), for the attention's two Linears and the router in each
    // block, and the head; per MoE block the experts' rows' over "edp" (dp 4 / ep 2): x and w2's
    // input forward, dy and the hidden gradient backward, a float per local expert (3 or 2).
    CHECK(all_reduces(dry_fp8[r]).size() == all_reduces(dry_bf16[r]).size() + 2 * (3 * layers + 1) + 4 * layers);
    const std::string edp_amaxes = detail::cat(" edp ", 4 * (r % 2 == 0 ? 3 : 2));
    std::size_t edp = 0;
    for (const auto& a : all_reduces(dry_fp8[r])) edp += a.ends_with(edp_amaxes) ? 1 : 0;
    CHECK(edp == 4 * layers);
  }
  // The time model charges them, and an A100 refuses them.
  const auto step = [&](const std::vector<sim::RankReport>& reports, const sim::Hardware& hw) {
    std::vector<sim::ClassInput> inputs;
    for (const auto& rep : reports) inputs.push_back({&rep, {0}});
    return sim::estimate_plan(inputs, models::plan_topology(ran, hw), models::detail::plan_schedule(ran), {})
        .step_seconds;
  };
  // Each GEMM record timed by the device: the same GEMMs take less time in FP8 on an H100 (its
  // FP8 peak is twice its bf16 one; these tiny GEMMs are bound by their bytes, which FP8 halves
  // for the operands) and the amaxes' all-reduces make the step longer than its GEMMs' saving.
  const auto h100 = sim::device("h100");
  const auto gemm_seconds = [&](const sim::RankReport& r) {
    double t = 0;
    for (const auto& ph : r.phases)
      for (const auto& o : ph.ops)
        if (o.op == "gemm" || o.op == "gemm_fp8") t += sim::op_seconds(o, h100);
    return t;
  };
  for (std::size_t r = 0; r < 4; ++r) CHECK(gemm_seconds(dry_fp8[r]) < gemm_seconds(dry_bf16[r]));
  CHECK(step(dry_fp8, h100) > step(dry_bf16, h100));
  CHECK_THROWS_WITH(step(dry_fp8, sim::device("a100")), Catch::Contains("no FP8 tensor cores"));
  // The plan's own checks: FP8 with full or mlp recomputation is refused, as train_gpt refuses it;
  // an fp32 model's dry run too.
  auto recomputed = p;
  recomputed.fp8 = true;
  recomputed.model.checkpoint = true;
  CHECK_THROWS_WITH(models::check_plan(recomputed), Catch::Contains("fp8 with full or mlp recomputation"));
  auto fp32 = p;
  fp32.fp8 = true;
  CHECK_THROWS_WITH((models::dry_run_plan<float, models::MoELayers<float, MetaMesh<"edp", "ep", "tp">>, false>(fp32)),
                    Catch::Contains("fp8 is the bf16 model"));
}

TEST_CASE("sim: the Chrome trace of an estimated step is strict JSON with its two tracks", "[sim][cost]") {
  const models::TrainingPlan plan{.model = {.vocab = 256, .seq = 32, .dim = 64, .heads = 4, .layers = 4},
                                  .batch = 8,
                                  .microbatches = 4,
                                  .dp = 2,
                                  .tp = 2,
                                  .pp = 2};
  const auto classes = models::dry_run_plan<float, models::DenseLayers, true>(plan);
  const auto schedule = parallel::pipeline::make_schedule(parallel::pipeline::parse_schedule_kind(plan.schedule), plan.pp,
                                                           plan.microbatches);
  const auto topology = models::plan_topology(plan, sim::Hardware{});
  for (const auto& c : classes) {
    const auto est = sim::estimate_step(c.report, topology, schedule, 1);
    const std::string text = sim::chrome_trace(est, c.pipeline_rank, c.report.name);
    CAPTURE(c.report.name);
    Json doc;
    REQUIRE_NOTHROW(doc = JsonParser(text).document());
    std::map<double, std::string> track_names;
    int forwards = 0, backwards = 0, communication = 0;
    for (const auto& event : doc["traceEvents"].array()) {
      const std::string ph = event["ph"].text();
      if (ph == "M") {
        if (event["name"].text() == "thread_name") track_names[event["tid"].number()] = event["args"]["name"].text();
        else CHECK(event["args"]["name"].text() == c.report.name);
        continue;
      }
      REQUIRE(ph == "X");
      CHECK(event["dur"].number() > 0);
      CHECK(event["ts"].number() >= 0);
      // Compute spans of the schedule are named like actions, "<stage>F<micro-batch>", "<stage>B<micro-batch>".
      const std::string name = event["name"].text();
      const char kind = name[name.find_first_not_of("0123456789")];
      if (event["tid"].number() == 1) ++communication;
      else if (kind == 'F') ++forwards;
      else if (kind == 'B') ++backwards;
    }
    CHECK(track_names == std::map<double, std::string>{{0, "compute"}, {1, "communication"}});
    CHECK(forwards == plan.microbatches);  // one span per micro-batch's forward and backward
    CHECK(backwards == plan.microbatches);
    CHECK(communication > 0);
  }
}

// ---------------------------------------------------------------- the planner: calibration, memory, search

TEST_CASE("sim: one calibration predicts the published runs within 15 %", "[sim][figures][calibration]") {
  // Korthikanti Table 5 iteration times, Narayanan Table 1 TFLOP/s per GPU, Llama 3 Table 4
  // (sim/published_runs.hpp); the same sim::calibration for every row, each row timed by its dry
  // run (docs/dry-run.md's table is `plan_at_scale --published`).
  const auto& runs = published_dry_rows();
  int korthikanti = 0, narayanan = 0, llama = 0, held_out = 0, fit = 0;
  for (const auto& run : runs) {
    const auto p = sim::predict(run);
    CAPTURE(run.name, run.fit, run.time_model, run.dry_run_note, p.predicted, p.published);
    // The issue's rows, and every H100 row (Llama 3 at 700 W; torchtitan's on h100-500w).
    const bool named = run.name.rfind("Korthikanti", 0) == 0 || run.name.rfind("Narayanan", 0) == 0 ||
                       run.name.rfind("Llama 3", 0) == 0 || run.name.rfind("torchtitan", 0) == 0;
    korthikanti += run.name.rfind("Korthikanti", 0) == 0;
    narayanan += run.name.rfind("Narayanan", 0) == 0;
    llama += run.name.rfind("Llama 3", 0) == 0;
    (run.fit ? fit : held_out) += 1;
    if (named) CHECK(std::abs(p.ratio() - 1) <= 0.15);
    if (run.name.rfind("BLOOM", 0) == 0) CHECK(std::abs(p.ratio() - 1) <= 0.15);
  }
  CHECK(korthikanti == 4);
  CHECK(narayanan >= 5);
  CHECK(llama == 3);
  CHECK(std::size_t(fit) <= runs.size() / 2);  // more rows held out than fitted
  CHECK(held_out >= 3 + 4 + 4 + 1);  // Llama 3, four Narayanan rows, MT-NLG, BLOOM, torchtitan's 405B
  // Rows of more than one device in the fit set; of three devices in all.
  std::vector<std::string> fit_devices, devices;
  for (const auto& run : runs) {
    if (run.fit && std::find(fit_devices.begin(), fit_devices.end(), run.device) == fit_devices.end())
      fit_devices.push_back(run.device);
    if (std::find(devices.begin(), devices.end(), run.device) == devices.end()) devices.push_back(run.device);
  }
  CHECK(fit_devices.size() >= 2);
  CHECK(devices.size() >= 3);
}

TEST_CASE("sim: the calibration is the fit of the fit rows; held-out and leave-one-out errors", "[sim][figures][calibration]") {
  const auto& runs = published_dry_rows();
  // Every fit row is timed by its dry run (the fit is the dry run's, not the analytic estimate's).
  for (const auto& run : sim::fit_rows(runs)) {
    CAPTURE(run.name, run.dry_run_note);
    CHECK(run.time_model == "dry run");
  }
  // The two fitted constants are what the stated fit gives on the stated rows (none tuned by hand).
  const auto fitted = sim::fit_calibration(sim::fit_rows(runs));
  CHECK(fitted.gemm_max_fraction == sim::calibration.gemm_max_fraction);
  CHECK(fitted.gemm_half_intensity == sim::calibration.gemm_half_intensity);
  CHECK(fitted.attention_fraction == sim::calibration.attention_fraction);  // measured: never fitted
  CHECK(fitted.hbm_fraction == sim::calibration.hbm_fraction);
  CHECK(fitted.link_fraction == sim::calibration.link_fraction);
  // The power-limited H100's compute_scale is the fit of its own fit rows under that calibration.
  CHECK(sim::fit_device_scale(sim::fit_rows(runs), "h100-500w", fitted) == sim::h100_500w_compute_scale);
  CHECK_THROWS_WITH(sim::fit_device_scale(sim::fit_rows(runs), "b200"), Catch::Contains("no runs on device 'b200'"));
  // Without it (the SXM's rated compute), torchtitan's rows are 1.3-2x too fast: the device, not
  // the calibration of the A100 and 700 W H100 rows, is what they measure.
  // (The Float8 row's GEMMs are half its bf16 twin's time, so the scale moves it less: > 1.1.)
  for (const auto& run : runs)
    if (run.device == "h100-500w") {
      CAPTURE(run.name);
      CHECK(sim::predict(run, sim::calibration, 1.0).ratio() > (run.plan.fp8 ? 1.1 : 1.3));
    }
  // Leave-one-out: each fit row predicted by the calibration fitted without it; held-out rows by
  // the fit rows' calibration. The issue's rows stay within 15 % either way.
  const auto loo = sim::leave_one_out(runs);
  REQUIRE(loo.size() == runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(runs[i].name, runs[i].fit, loo[i]);
    // (torchtitan's rows are in the last branch, within 15 %: each 8B row with the device's
    // scale refitted on the other, the 405B row held out.)
    if (runs[i].name.rfind("MT-NLG", 0) == 0) {
      // Held out, and missed: the same model and TP 8 x PP 35 as Narayanan's 530B row (163
      // TFLOP/s) ran at 126 TFLOP/s under DeepSpeed's pipeline; we predict Megatron's speed.
      CHECK(loo[i] < 0.85);
      CHECK(loo[i] > 0.75);
    } else if (runs[i].name.rfind("DeepSeek-V3", 0) == 0) {
      // Held out, and over by what docs/dry-run.md ("MLA charged") leaves out in DeepSeek's
      // favour (its kernels' overlap of the NVLink forwarding with the network transfer,
      // DualPipe's finer overlap): +17.5 % in its dry run since GEMMs carry their shape (+15.5 %
      // before; +14.9 % in the analytic estimate, whose MoE blocks are 2.2 % shorter), asserted
      // where it is so that a change shows.
      CHECK(loo[i] > 1.10);
      CHECK(loo[i] < 1.20);
    } else {
      CHECK(std::abs(loo[i] - 1) <= 0.15);
    }
  }
  // A fit needs rows; a device override a row names must be a real field.
  CHECK_THROWS_WITH(sim::fit_calibration({}), Catch::Contains("no runs to fit"));
  auto bad = sim::published_runs().back();
  bad.device_fields = {{"network_gbit", "50"}};
  CHECK_THROWS_WITH(models::published_dry_run(bad, dry_run_any),
                    Catch::Contains("unknown device field 'network_gbit'"));
  CHECK_THROWS_WITH(sim::predict_analytic(bad), Catch::Contains("unknown device field 'network_gbit'"));
}

TEST_CASE("sim: --published's figures are the dry run's; the analytic estimate agrees with it on the published rows",
          "[sim][figures][calibration][analytic]") {
  const auto& runs = published_dry_rows();
  // The figure of a row is its dry run's estimate: the row's plan dry-run (models::dry_run_plan
  // with its software) and costed by sim::estimate_plan, here again from scratch.
  const auto& korthikanti = runs.front();
  REQUIRE(korthikanti.name == "Korthikanti T5 22B");
  const auto dry = models::dry_run_published(korthikanti, dry_run_any);
  std::vector<sim::ClassInput> inputs;
  for (const auto& c : dry->classes) inputs.push_back({&c.report, c.pipeline_ranks});
  const auto options = models::estimate_options(dry->plan);
  CHECK(!options.overlap_gradient_reduction);  // Megatron-LM's, as the row states
  const auto direct = sim::estimate_plan(inputs, models::plan_topology(dry->plan, korthikanti.hardware()),
                                         models::plan_schedule(dry->plan), options);
  CHECK(sim::predict(korthikanti).step_seconds == direct.step_seconds);
  CHECK(sim::predict(korthikanti).predicted == direct.step_seconds);  // an iteration time
  CHECK(!dry->plan.fused_attention);
  CHECK(!dry->plan.overlap_gradient_reduction);
  // Under another calibration too (what the fits try): re-costed, not dry-run again.
  const sim::Calibration other{.gemm_max_fraction = 0.80, .gemm_half_intensity = 100};
  CHECK(sim::predict(korthikanti, other).step_seconds == dry->estimate(other).step_seconds);
  CHECK(sim::predict(korthikanti, other).step_seconds != sim::predict(korthikanti).step_seconds);

  // The analytic estimate against the dry run on every row (the search's fast twin; issue 43
  // asks 5 %): the same software on both sides (the rows' PlanShape: Megatron's rows unfused and
  // unoverlapped in both), so the bound is the twins' own gap: 5 %, but on five rows where one
  // of the analytic estimate's two known approximations is large (docs/dry-run.md, "One time
  // model"), each asserted where it is so that a change that moves it shows:
  //  - one-layer pipeline stages (Narayanan's 530B: 105 stages, 1T: 128): the dry run charges a
  //    stage's receive and its send in each direction, the analytic one transfer per stage and
  //    direction; with a layer per stage the transfers are a large share: 0.91 and 0.94;
  //  - the head on the last rank: pipeline::stage_layers gives the remainder layers to the
  //    first stages, so the rank holding the head holds fewer layers, where the analytic charges
  //    it ceil(L / p) (Llama 3 at 8K: 7 layers and the head against 8; BLOOM: 5 against 6, and
  //    its 250,880-row head is 1.5 layers): 1.07 each.
  const auto bound = [](const std::string& name) -> std::pair<double, double> {
    if (name == "Narayanan T1 530B" || name == "Narayanan T1 1T") return {0.90, 0.95};
    if (name.rfind("Llama 3 T4 8K", 0) == 0 || name.rfind("BLOOM", 0) == 0) return {1.05, 1.10};
    return {0.95, 1.05};
  };
  for (const auto& run : runs) {
    CAPTURE(run.name, run.dry_run_note);
    if (!run.dry_run_note.empty()) {
      // Only torchtitan's Float8 405B row (FP8 with full recomputation: the trainer refuses it).
      CHECK(run.name.find("Float8") != std::string::npos);
      continue;
    }
    CHECK(run.time_model == "dry run");
    const double ratio = sim::analytic_of(run).step_seconds / sim::predict(run).step_seconds;
    const auto [lo, hi] = bound(run.name);
    CAPTURE(ratio, lo, hi);
    CHECK(ratio >= lo);
    CHECK(ratio <= hi);
  }
}

TEST_CASE("sim: a plan's software: scores in HBM as the analytic charges them, the gradient reduction exposed",
          "[sim][cost][analytic]") {
  // The meta attention under kernels::meta::MaterializedScores records the unfused kernels: the
  // records of materialized_attention_records, the function the analytic estimate costs too.
  const Extent B = 2, H = 4, T = 64, D = 16;
  const auto q = kernels::meta::MetaTensor<dtensor::bfloat16, 4>::uninitialized(Shape<4>{B, H, T, D});
  const auto records = [&](bool materialized, bool backward) {
    const kernels::meta::MaterializedScores scores(materialized);
    kernels::meta::CostLog log;
    const auto f = kernels::meta::attention(q, q, q);
    if (backward) {
      log.clear();
      (void)kernels::meta::attention_backward(q, q, q, f.out, f.lse, f.out);
    }
    return log.records();
  };
  const auto expected = [&](bool backward) {
    return kernels::meta::materialized_attention_records(double(B * H), double(T), double(T), double(D), double(D), 2,
                                                         backward);
  };
  for (const bool backward : {false, true}) {
    CAPTURE(backward);
    const auto got = records(true, backward), want = expected(backward);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].op == want[i].op);
      CHECK(got[i].flops == want[i].flops);
      CHECK(got[i].bytes_read == want[i].bytes_read);
      CHECK(got[i].bytes_written == want[i].bytes_written);
      CHECK((got[i].m == want[i].m && got[i].n == want[i].n && got[i].k == want[i].k && got[i].batch == want[i].batch));
    }
    CHECK(records(false, backward).size() == 1);  // the fused kernel: one record
  }
  CHECK(!kernels::meta::materialized_scores());                    // the scope ended
  CHECK(expected(false).back().bytes_read == 13 * B * H * T * T);  // 13 bytes per score
  CHECK((expected(false)[0].batch == B * H && expected(false)[0].m == T && expected(false)[0].n == T &&
         expected(false)[0].k == D));  // QK^T's shape, for the wave quantisation

  // A plan's dry run honours both fields: no fused attention record, and the step charges the
  // whole gradient reduction after the backward.
  models::TrainingPlan plan{.model = {.vocab = 1000, .seq = 128, .dim = 256, .heads = 4, .layers = 2},
                            .batch = 8,
                            .microbatches = 2,
                            .dp = 4,
                            .tp = 2};
  plan.bf16_moments = true;
  plan.fused_attention = false;
  plan.overlap_gradient_reduction = false;
  const auto classes = models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(plan);
  for (const auto& c : classes)
    for (const auto& ph : c.report.phases)
      for (const auto& op : ph.ops) {
        CAPTURE(ph.name, op.op);
        CHECK(op.op != "attention");
        CHECK(op.op != "attention_backward");
      }
  const sim::Hardware hw = sim::device("a100");
  const auto exposed = models::estimate_dry_run(plan, classes, hw);
  auto overlapped_plan = plan;
  overlapped_plan.overlap_gradient_reduction = true;
  const auto overlapped = models::estimate_dry_run(overlapped_plan, classes, hw);
  const auto& e = exposed.classes[exposed.slowest];
  REQUIRE(e.gradient_reduction_seconds > 0);
  CHECK(e.once_per_step_seconds >= e.gradient_reduction_seconds);  // all of it after the backward
  CHECK(exposed.step_seconds > overlapped.step_seconds);
  CHECK(exposed.step_seconds - overlapped.step_seconds <= e.gradient_reduction_seconds * (1 + 1e-9));
  CHECK(sim::exposed_gradient_reduction(2, 0.5, true) == 1.5);
  CHECK(sim::exposed_gradient_reduction(2, 0.5, false) == 2);
  CHECK(sim::exposed_gradient_reduction(0.2, 0.5, true) == 0);
}

TEST_CASE("sim: the analytic estimate follows the dry run's", "[sim][cost][analytic]") {
  // Small plans on meta, dry-run and estimated (sim::estimate_plan), against the analytic
  // estimate of the same plan: the search prunes with the latter and ranks finalists by the
  // former, so they are one time model (issue 43 item 1): within 5 % on every plan here. The
  // analytic counts the records the dry run makes: each block's memory-bound passes (norms,
  // residual and bias adds, the heads' permutes and splits, GELU or SwiGLU, rotary, GQA's
  // repeats, ring attention's merges), the parameters' passes (gradient accumulation, the fp32
  // casts of mixed precision, ZeRO-3's shard casts), one collective per FSDP unit (its
  // latency), the ends' TP collectives, the parameters whole on every tp rank (positions,
  // norms, row-wise biases: also summed over "tp"), and the rank holding both ends under pp 1
  // and the V schedules. Before, the analytic step was 8-18 % shorter on the first four plans
  // (ratios 0.906, 0.853, 0.859, 0.824) and 33 % longer on the ZeRO-3 one (its gathers in fp32,
  // per layer).
  struct Case {
    int dp, tp, pp, zero, microbatches;
    bool checkpoint;
    int cp = 1;
    const char* schedule = "1f1b";
    int v = 1;
    bool llama = false;
    bool narrow = false;  // dim 1536, 12 heads: tp 3 and 6 (the vocabulary 32000 splits unevenly)
    bool fp8 = false;     // every Linear's GEMMs in FP8 (their amax all-reduces too)
    // Llama blocks with DeepSeek's multi-head latent attention (issue 43): latents of 512 (queries;
    // 0 with q_latent false: q_proj) and 256 (keys and values), per head 128 + 64 rotary query/key
    // and 128 value features.
    bool mla = false, q_latent = true;
    bool sp = true;
  };
  const Case cases[] = {
      {8, 8, 1, 0, 1, false},
      {8, 8, 2, 0, 8, false},
      {16, 4, 2, 1, 8, true},
      {4, 8, 4, 0, 16, true},
      {8, 8, 1, 3, 2, false},               // ZeRO-3: its gathers behind compute
      {4, 8, 2, 2, 4, false},               // ZeRO-2, pp 2
      {4, 4, 2, 1, 8, false, 2},            // context ring
      {4, 4, 2, 1, 8, false, 1, "zbv", 2},  // ZB-V: both ends on rank 0
      {4, 4, 2, 1, 8, false, 1, "interleaved", 2},
      {8, 4, 2, 1, 8, true, 1, "1f1b", 1, true},                 // Llama (GQA, SwiGLU), checkpointing
      {4, 3, 2, 1, 4, true, 1, "1f1b", 1, false, true},          // tp 3
      {4, 6, 1, 3, 2, false, 1, "1f1b", 1, false, true},         // tp 6, ZeRO-3
      {8, 8, 2, 0, 8, false, 1, "1f1b", 1, false, false, true},  // FP8
      {4, 4, 2, 1, 8, false, 2, "1f1b", 1, false, false, true},  // FP8, context ring, HSDP-free ZeRO-1
      {8, 4, 2, 1, 4, false, 1, "1f1b", 1, true, false, true},   // FP8 Llama
      {8, 4, 2, 3, 4, false, 1, "1f1b", 1, true},                // ZeRO-3, stages kept gathered
      {8, 4, 2, 3, 4, false, 1, "1f1b", 1, true, false, true},   // the same in FP8
      // MLA (issue 43): TP + SP (the latents' gathers), tp 3 (the vocabulary uneven) with
      // checkpointing, no SP, q_proj without a query latent, a context ring, ZeRO-3, FP8, ZB-V.
      {8, 4, 2, 1, 8, false, 1, "1f1b", 1, true, false, false, true},
      {4, 3, 2, 1, 4, true, 1, "1f1b", 1, true, true, false, true},
      {8, 4, 2, 1, 8, false, 1, "1f1b", 1, true, false, false, true, true, false},
      {8, 4, 1, 0, 2, false, 1, "1f1b", 1, true, false, false, true, false},
      {4, 4, 2, 1, 8, false, 2, "1f1b", 1, true, false, false, true},
      {8, 4, 2, 3, 4, false, 1, "1f1b", 1, true, false, false, true},
      {8, 4, 2, 1, 4, false, 1, "1f1b", 1, true, false, true, true},
      {4, 4, 2, 1, 8, false, 1, "zbv", 2, true, false, false, true}};
  for (const Case& c : cases) {
    CAPTURE(c.dp, c.tp, c.pp, c.zero, c.microbatches, c.checkpoint, c.cp, c.schedule, c.llama, c.narrow, c.fp8, c.mla,
            c.q_latent, c.sp);
    const std::int64_t dim = c.narrow ? 1536 : 2048, heads = c.narrow ? 12 : 16;
    // (Llama's SwiGLU width a multiple of tp 3 when narrow.)
    const std::int64_t kv = c.llama && !c.mla ? 4 : 0, ffn = c.llama ? (c.narrow ? 4608 : 5504) : 0;
    models::GPTConfig model{.vocab = 32000, .seq = 2048, .dim = dim, .heads = heads, .layers = 8};
    model.kv_heads = kv, model.ffn = ffn;
    if (c.mla)
      model.mla = {.q_lora_rank = c.q_latent ? 512 : 0,
                   .kv_lora_rank = 256,
                   .qk_nope_head_dim = 128,
                   .qk_rope_head_dim = 64,
                   .v_head_dim = 128};
    models::TrainingPlan plan{.model = model,
                              .batch = c.dp * c.microbatches,
                              .microbatches = c.microbatches,
                              .dp = c.dp,
                              .tp = c.tp,
                              .pp = c.pp,
                              .schedule = c.schedule,
                              .stages_per_rank = c.v > 1 ? c.v : 0,
                              .zero = c.zero,
                              .cp = c.cp};
    plan.model.checkpoint = c.checkpoint;
    plan.fp8 = c.fp8;
    const auto classes = !c.sp     ? models::dry_run_plan<dtensor::bfloat16, models::LlamaLayers, false>(plan)
                         : c.llama ? models::dry_run_plan<dtensor::bfloat16, models::LlamaLayers, true>(plan)
                                   : models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(plan);
    std::vector<sim::ClassInput> inputs;
    for (const auto& k : classes) inputs.push_back({&k.report, k.pipeline_ranks});
    const auto dry = sim::estimate_plan(inputs, models::plan_topology(plan, sim::Hardware{}),
                                        models::detail::plan_schedule(plan), {.zero = c.zero});
    const sim::ModelShape shape{.layers = 8,
                                .dim = dim,
                                .heads = heads,
                                .kv_heads = kv,
                                .ffn = ffn,
                                .vocab = 32000,
                                .seq = 2048,
                                .llama = c.llama,
                                .kv_lora_rank = model.mla.kv_lora_rank,
                                .q_lora_rank = model.mla.q_lora_rank,
                                .qk_nope_dim = model.mla.qk_nope_head_dim,
                                .qk_rope_dim = model.mla.qk_rope_head_dim,
                                .v_head_dim = model.mla.v_head_dim};
    const sim::PlanShape analytic_plan{.batch = plan.batch,
                                       .microbatch = 1,
                                       .dp = c.dp,
                                       .tp = c.tp,
                                       .pp = c.pp,
                                       .cp = c.cp,
                                       .zero = c.zero,
                                       .sp = c.sp,
                                       .recompute = c.checkpoint,
                                       .schedule = c.schedule,
                                       .stages_per_rank = c.v,
                                       .fp8 = c.fp8};
    const auto a = sim::analytic_estimate(shape, analytic_plan, sim::Hardware{});
    double memory = 0;
    for (const auto& k : classes) memory = std::max(memory, k.peak_in_flight);
    CAPTURE(dry.step_seconds, a.step_seconds, memory, a.memory_bytes);
    CHECK(a.step_seconds == Approx(dry.step_seconds).epsilon(0.05));
    CHECK(a.memory_bytes == Approx(memory).epsilon(0.5));
  }
}

TEST_CASE("sim: building the trainer holds the sharded states, not the model; the verdict states the reserve",
          "[sim][memory]") {
  // ZeRO-3 on 64 ranks, the parameters drawn as shards (deferred initialisation, issue 40):
  // building holds what the rank keeps (a 64th of the fp32 master state and gradient shards)
  // plus at most one unit's flat buffer (the 50257-row head in bf16, the largest; in fact only
  // the bf16 shard drawn for one unit) — before, the unsharded bf16 model (2 bytes per
  // parameter), more than the step. The step's peak (units gathered, activations) is judged apart.
  const models::GPTConfig model{.vocab = 50257, .seq = 64, .dim = 1024, .heads = 16, .layers = 8};
  const auto run = zero_run(model, 64, 3);
  const auto& built = run.report.phase(sim::RankReport::construction_phase);
  std::int64_t held = 0;
  for (auto b : built.end) held += b;
  const std::int64_t unit = std::int64_t(50257) * 1024 * 2;
  CAPTURE(held, run.report.step_peak_total(), run.report.construction_peak_total());
  CHECK(run.report.construction_peak_total() <= held + unit);
  CHECK(run.report.construction_peak_total() - held <= unit / 64 + 64);  // one unit's bf16 shard, drawn then widened
  CHECK(run.report.construction_peak_total() < run.report.step_peak_total());
  CHECK(run.peak_in_flight == double(run.report.step_peak_total()));
  CHECK(run.report.peak_total() == run.report.step_peak_total());
  const auto h100 = sim::device("h100");
  CHECK(sim::fits(72e9, h100));
  CHECK_FALSE(sim::fits(72.1e9, h100));
}

TEST_CASE("sim: --search ranks fitting plans by the analytic estimate, fast", "[sim][search]") {
  // Llama 3 405B on 16,384 H100s at 8K: every plan enumerated in well under a second.
  const sim::ModelShape llama{.layers = 126, .dim = 16384, .heads = 128, .kv_heads = 8, .ffn = 53248, .vocab = 128256,
                              .seq = 8192, .llama = true};
  const auto h100 = sim::device("h100");
  const auto started = std::chrono::steady_clock::now();
  const auto ranked = sim::search_plans(llama, {.gpus = 16384, .batch = 2048}, h100);
  // HSDP, three context kinds, zero-bubble schedules and six recomputation choices: ~20,000 fitting
  // plans of ~10^5 considered, in seconds (the issue's bound is a minute on two cores).
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() < 40);
  REQUIRE(ranked.size() > 5);
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    CHECK(ranked[i].plan.gpus() == 16384);
    CHECK(ranked[i].estimate.fits);
    if (i > 0) CHECK(ranked[i].estimate.step_seconds >= ranked[i - 1].estimate.step_seconds);
  }
  // The published plan's shape (TP 8, PP 16, DP 128) is among them; its gap to the best is
  // explained by a term of the estimate.
  const auto is_published = [](const sim::RankedPlan& r) {
    return r.plan.tp == 8 && r.plan.pp == 16 && r.plan.dp == 128 && r.plan.cp == 1 && r.plan.schedule == "interleaved";
  };
  const auto published = std::find_if(ranked.begin(), ranked.end(), is_published);
  REQUIRE(published != ranked.end());
  CHECK_THAT(sim::why_slower(*published, ranked.front()), Catch::Contains("most from"));
  // Why it is not in the top 5 (docs/dry-run.md, "Search"): only its recomputing variants fit;
  // without recomputation it is faster but does not fit: with sequence-parallel saved
  // activations (34/t per layer) they alone nearly fill the 72 GB budget (80 GB less the
  // reserve), and with the model states the total overflows it. Even then the pipeline bubble
  // of 16 micro-batches (dp 128) is the term that loses most to the first.
  // Per-module recomputation: the fastest variant that fits recomputes a module list, not the block.
  CHECK_FALSE(published->plan.recomputes().none());
  CHECK_FALSE(published->plan.recomputes().full);
  CHECK(published - ranked.begin() >= 5);
  CHECK(ranked.front().plan.recomputes().none());  // the first fits without recomputing
  const auto all = sim::search_plans(llama, {.gpus = 16384, .batch = 2048, .keep_unfit = true}, h100);
  CHECK(all.size() > ranked.size());
  const auto unfit = std::find_if(all.begin(), all.end(), is_published);
  REQUIRE(unfit != all.end());
  CHECK_FALSE(unfit->plan.recompute);
  CHECK_FALSE(unfit->estimate.fits);
  CHECK(unfit->estimate.step_seconds < published->estimate.step_seconds);
  const double budget = h100.memory_bytes * (1 - sim::memory_reserve_fraction);
  CHECK(unfit->estimate.activations > 0.9 * budget);
  CHECK(unfit->estimate.memory_bytes > budget);
  CHECK_THAT(sim::why_slower(*unfit, ranked.front()), Catch::Contains("most from pipeline bubble"));
  const auto table = sim::compare_plans(*unfit, ranked.front());
  CHECK_THAT(table, Catch::Contains("pipeline bubble") && Catch::Contains("step") && Catch::Contains("memory"));
  // A model that fits nowhere is an error naming the device and the memory.
  CHECK_THROWS_WITH(sim::search_plans(llama, {.gpus = 8, .batch = 8}, h100), Catch::Contains("80 GB each, less the reserve"));
  // Sizes past int64 are errors, not wrapped counts.
  sim::ModelShape huge = llama;
  huge.dim = std::int64_t(1) << 40;
  huge.heads = 1;
  CHECK_THROWS_WITH(sim::analytic_estimate(huge, {.batch = 1 << 20}, h100), Catch::Contains("overflows"));
}

TEST_CASE("sim: the search recomputes per module where memory forces it, and not otherwise", "[sim][search][recompute]") {
  // GPT-3 175B on 256 GPUs, batch 1024: on H100s (72 GB usable) the fastest plan fits only by
  // recomputing a module (its variant without recomputation does not fit). Without per-module
  // choices (none or full only) H100s get a slower plan: what selective recomputation buys.
  // Without context parallelism (max_cp 1); with it, and on H200s (127 GB), the fastest plan
  // recomputes only where its variant without recomputation does not fit. (Before the analytic
  // step counted the dry run's per-micro-batch passes, issue 43, the H200's and the cp search's
  // fastest recomputed nothing: larger micro-batches now pay back cheap recomputation.)
  const sim::ModelShape gpt{.layers = 96, .dim = 12288, .heads = 96, .vocab = 51200, .seq = 2048};
  const auto h100 = sim::device("h100"), h200 = sim::device("h200");
  const auto tight = sim::search_plans(gpt, {.gpus = 256, .batch = 1024, .max_cp = 1}, h100);
  const auto& best = tight.front();
  INFO(sim::describe(best.plan));
  CHECK_FALSE(best.plan.recomputes().none());
  CHECK_FALSE(best.plan.recomputes().full);
  CHECK_THAT(sim::describe(best.plan), Catch::Contains("recompute "));
  sim::PlanShape bare = best.plan;
  bare.recompute_modules = {};
  const auto without = sim::analytic_estimate(gpt, bare, h100);
  CHECK_FALSE(without.fits);
  CHECK(without.step_seconds <= best.estimate.step_seconds);  // recomputation costs time, never saves it
  CHECK(best.estimate.recompute_seconds > 0);
  CHECK(best.estimate.memory_bytes < without.memory_bytes);
  const auto coarse = sim::search_plans(gpt, {.gpus = 256, .batch = 1024, .max_cp = 1, .recompute_modules = false}, h100);
  CHECK(coarse.front().estimate.step_seconds > best.estimate.step_seconds);
  const auto roomy = sim::search_plans(gpt, {.gpus = 256, .batch = 1024, .max_cp = 1}, h200);
  // With context parallelism: a larger space, a plan at least as fast.
  const auto with_cp = sim::search_plans(gpt, {.gpus = 256, .batch = 1024}, h100);
  CHECK(with_cp.front().estimate.step_seconds <= best.estimate.step_seconds);
  for (const auto& [first, device] : {std::pair{&with_cp.front(), h100}, std::pair{&roomy.front(), h200}}) {
    INFO(sim::describe(first->plan));
    if (first->plan.recomputes().none()) continue;
    sim::PlanShape plain = first->plan;
    plain.recompute_modules = {}, plain.recompute = plain.selective = false;
    CHECK_FALSE(sim::analytic_estimate(gpt, plain, device).fits);
  }
  // Each module's memory and time in the estimate, one plan (TP 8 + SP): the saved units per layer
  // of docs/dry-run.md's table (34, 32, 26, 20, 12, 2 of s b h / t bytes); recomputation never
  // makes the step faster than none, and full is the slowest.
  const sim::PlanShape base{.batch = 64, .microbatch = 1, .dp = 8, .tp = 8, .pp = 8, .schedule = "1f1b"};
  double none_step = 0, slowest = 0;
  for (const auto& [spec, units] : std::vector<std::pair<const char*, double>>{
           {"none", 34}, {"selective", 32}, {"act", 26}, {"core_attn,norm,act", 20}, {"core_attn,norm,mlp", 12}, {"full", 2}}) {
    sim::PlanShape p = base;
    p.recompute_modules = nn::Recompute::parse(spec);
    const auto e = sim::analytic_estimate(gpt, p, h100);
    INFO(spec);
    // activations = units x layers x in-flight micro-batches (+ one layer's recomputed state).
    const double per_unit = 2048.0 * 12288 / 8 * 12 * 8;
    const double recompute_peak = std::string(spec) == "none" ? 0 : std::string(spec) == "full" ? 34 * 2048.0 * 12288 / 8
                                                                                                 : (34 - units) * 2048.0 * 12288 / 8;
    CHECK(e.activations == Approx(units * per_unit + recompute_peak).epsilon(1e-9));
    if (none_step == 0) none_step = e.step_seconds;
    CHECK(e.step_seconds >= none_step);
    if (std::string(spec) == "full") CHECK(e.step_seconds > slowest);
    slowest = std::max(slowest, e.step_seconds);
  }
}

TEST_CASE("sim: zero-bubble schedules in the analytic estimate are the executor's, simulated", "[sim][search][pipeline]") {
  namespace pl = parallel::pipeline;
  // The search stands a small simulation in for a large one (sim/analytic.hpp): check it against
  // the full simulation of the schedule the executor runs, for several costs and sizes.
  for (const char* kind : {"zb", "zbv", "dualpipev"})
    for (const auto& [F, I, W] : std::vector<std::array<double, 3>>{{1, 1, 1}, {1, 1.6, 0.4}, {0.7, 1.2, 1.1}, {1, 3, 0.9}})
      for (const auto& [p, m] : std::vector<std::pair<int, int>>{{4, 8}, {8, 24}, {16, 32}, {24, 48}}) {
        INFO(kind << " p " << p << " m " << m << " F " << F << " I " << I << " W " << W);
        const auto k = pl::parse_schedule_kind(kind);
        const int v = pl::fixed_stages_per_rank(k);
        const auto s = pl::make_schedule(k, p, m, v);
        const auto t = pl::simulate(s, pl::Costs{.forward = F / v, .backward_input = I / v, .backward_weight = W / v});
        const auto held = pl::detail::count_memory(s).peak_saved;
        const auto est = sim::detail::zero_bubble_pipeline(kind, p, m, F, I, W);
        const double idle = t.makespan - m * (F + I + W);
        // Exact for ZB-H1 and ZB-V (the cost shares rounded to 1e-3); DualPipeV's grows slowly with p.
        CHECK(est.idle == Approx(idle).epsilon(std::string(kind) == "dualpipev" && p > 16 ? 0.03 : 0.005));
        CHECK(est.held == *std::max_element(held.begin(), held.end()));
        // Fewer idle units than 1F1B's (p - 1)(F + I + W).
        CHECK(idle < (p - 1) * (F + I + W));
      }
  // In a plan: the same shape under 1F1B, ZB-H1 and ZB-V: the same work, less bubble, 1F1B's memory.
  const sim::ModelShape gpt{.layers = 96, .dim = 12288, .heads = 96, .vocab = 51200, .seq = 2048};
  const auto h100 = sim::device("h100");
  sim::PlanShape p{.batch = 256, .microbatch = 1, .dp = 8, .tp = 8, .pp = 8, .schedule = "1f1b"};
  const auto one = sim::analytic_estimate(gpt, p, h100);
  p.schedule = "zb";
  const auto h1 = sim::analytic_estimate(gpt, p, h100);
  p.schedule = "zbv", p.stages_per_rank = 2;
  const auto zbv = sim::analytic_estimate(gpt, p, h100);
  CHECK(h1.bubble_seconds < 0.7 * one.bubble_seconds);
  CHECK(zbv.bubble_seconds < h1.bubble_seconds);
  // 1F1B's forwards in flight, and the weight-gradient contexts the deferred W passes keep on top
  // (the next case checks those against the dry run).
  CHECK(h1.activations >= one.activations);
  CHECK(zbv.activations >= one.activations);
  CHECK(h1.weight_contexts > 0);
  CHECK(h1.activations <= one.activations + h1.weight_contexts * (1 + 1e-9));
  CHECK(h1.compute_per_microbatch == Approx(one.compute_per_microbatch));
  p.schedule = "dualpipev";
  p.batch = 8 * 8;  // m = 8 < 2 pp
  CHECK_THROWS_WITH(sim::analytic_estimate(gpt, p, h100), Catch::Contains("dualpipev needs m >= 2 pp"));
  p.schedule = "zbv", p.stages_per_rank = 1;
  CHECK_THROWS_WITH(sim::analytic_estimate(gpt, p, h100), Catch::Contains("puts 2 stage(s) on each rank"));
}

TEST_CASE("sim: DualPipeV's overlapped pairs hide the expert all-to-alls, in the dry run and the analytic estimate",
          "[sim][pipeline][moe][issue43]") {
  namespace pl = parallel::pipeline;
  // The analytic's small simulation against the full one, with the pairs' hideable parts.
  for (const auto& [F, I, W, Fh, Bh] :
       std::vector<std::array<double, 5>>{{1, 1.6, 0.4, 0.3, 0.5}, {1, 1, 1, 0.9, 0.5}, {0.7, 1.2, 1.1, 0.1, 0.2}})
    for (const auto& [p, m] : std::vector<std::pair<int, int>>{{4, 8}, {4, 20}, {8, 24}, {16, 32}}) {
      INFO("p " << p << " m " << m << " F " << F << " I " << I << " W " << W << " Fh " << Fh << " Bh " << Bh);
      const pl::Costs per_stage{F / 2, I / 2, W / 2, Fh / 2, Bh / 2};
      const auto t =
          pl::simulate(pl::dual_pipe_v(p, m), per_stage, pl::SendMode::asynchronous, pl::dual_pipe_v_overlapped(p, m));
      const auto est = sim::detail::zero_bubble_pipeline("dualpipev", p, m, F, I, W, Fh, Bh);
      CHECK(est.hidden == Approx((2 * m - 3 * p + 1) * per_stage.pair_saving()));  // rank 0's pairs
      CHECK(m * (F + I + W) + est.idle - est.hidden == Approx(t.makespan).epsilon(0.01));
      CHECK(t.makespan < pl::simulate(pl::dual_pipe_v(p, m), pl::Costs{F / 2, I / 2, W / 2}).makespan);
    }
  // A MoE plan under DualPipeV (pp 2, ep 4 of dp 4, m 4): its dry run estimated with the pairs
  // (models::estimate_options) hides part of the expert all-to-alls, never more than they take,
  // and the analytic estimate follows it as for the other schedules; ZB-V (the same V, no pairs)
  // hides nothing.
  models::TrainingPlan plan{.model = {.vocab = 512, .seq = 1024, .dim = 1024, .heads = 8, .layers = 4, .mlp_ratio = 4},
                            .batch = 16,
                            .microbatches = 4,
                            .dp = 4,
                            .pp = 2,
                            .schedule = "dualpipev",
                            .stages_per_rank = 2};
  plan.moe.router.experts = 8;
  plan.moe.router.topk = 2;
  plan.ep = 4;
  const auto classes =
      models::dry_run_plan<dtensor::bfloat16, models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>, true>(
          plan);
  std::vector<sim::ClassInput> inputs;
  for (const auto& k : classes) inputs.push_back({&k.report, k.pipeline_ranks});
  const auto topology = models::plan_topology(plan, sim::Hardware{});
  const auto schedule = models::detail::plan_schedule(plan);
  const auto options = models::estimate_options(plan);
  CHECK(options.overlapped == pl::dual_pipe_v_overlapped(2, 4));
  const auto paired = sim::estimate_plan(inputs, topology, schedule, options);
  const auto unpaired = sim::estimate_plan(inputs, topology, schedule, {.zero = plan.zero});
  double all_to_all = 0;  // the slowest class's expert all-to-alls per step, exposed without pairs
  for (const auto& t : unpaired.classes[unpaired.slowest].phases)
    all_to_all += t.expert_all_to_all * (sim::is_microbatch_phase(t.name) ? plan.microbatches : 1);
  CAPTURE(paired.step_seconds, unpaired.step_seconds, all_to_all);
  CHECK(all_to_all > 0);
  CHECK(paired.step_seconds < unpaired.step_seconds);
  CHECK(unpaired.step_seconds - paired.step_seconds <= all_to_all * (1 + 1e-9));
  const auto& slow = paired.classes[paired.slowest];
  CHECK(slow.exposed_communication_seconds < unpaired.classes[paired.slowest].exposed_communication_seconds);
  const sim::ModelShape wide{.layers = 4, .dim = 1024, .heads = 8, .vocab = 512, .seq = 1024, .experts = 8, .topk = 2};
  sim::PlanShape p{
      .batch = 16, .microbatch = 1, .dp = 4, .pp = 2, .ep = 4, .schedule = "dualpipev", .stages_per_rank = 2};
  const auto a = sim::analytic_estimate(wide, p, sim::Hardware{});
  p.schedule = "zbv";
  const auto zbv = sim::analytic_estimate(wide, p, sim::Hardware{});
  CAPTURE(a.step_seconds, a.ep_seconds, zbv.ep_seconds);
  CHECK(a.step_seconds == Approx(paired.step_seconds).epsilon(0.25));
  CHECK(a.ep_seconds < zbv.ep_seconds);
  CHECK(a.ep_seconds > 0);
}

TEST_CASE("sim: HSDP and Ulysses in the analytic estimate and the search", "[sim][search]") {
  const auto h100 = sim::device("h100");
  // HSDP: ZeRO-3 over the 8 GPUs of a node, replicated 8 times, against ZeRO-3 over all 64: its
  // per-micro-batch gathers ride NVLink (less exposed), its model states are sharded 8x less.
  const sim::ModelShape gpt13{.layers = 40, .dim = 5120, .heads = 40, .vocab = 51200, .seq = 2048};
  sim::PlanShape flat{.batch = 512, .microbatch = 1, .dp = 64, .zero = 3};
  sim::PlanShape hsdp = flat;
  hsdp.hsdp = 8;
  const auto f = sim::analytic_estimate(gpt13, flat, h100), h = sim::analytic_estimate(gpt13, hsdp, h100);
  CHECK(h.gather_seconds < f.gather_seconds);
  CHECK(h.model_states > f.model_states);
  CHECK(h.step_seconds < f.step_seconds);
  CHECK_THROWS_WITH(sim::analytic_estimate(gpt13, {.batch = 512, .dp = 64, .hsdp = 8}, h100), Catch::Contains("under ZeRO 1..3"));
  CHECK_THROWS_WITH(sim::analytic_estimate(gpt13, {.batch = 512, .dp = 64, .zero = 3, .hsdp = 3}, h100),
                    Catch::Contains("hsdp 3 with dp 64"));
  // Ulysses: all-to-alls exposed where the ring hides behind attention; the heads must split over tp x cp.
  const sim::ModelShape llama{.layers = 32, .dim = 4096, .heads = 32, .kv_heads = 8, .ffn = 14336, .vocab = 128256,
                              .seq = 32768, .llama = true};
  sim::PlanShape ring{.batch = 64, .microbatch = 1, .dp = 8, .tp = 2, .cp = 4, .zero = 1, .cp_kind = "ring"};
  sim::PlanShape ulysses = ring;
  ulysses.cp_kind = "ulysses";
  const auto r = sim::analytic_estimate(llama, ring, h100), u = sim::analytic_estimate(llama, ulysses, h100);
  CHECK(u.cp_seconds > 0);
  // The same attention pairs; the ring also casts and merges each key block's result (memory-bound).
  CHECK(u.compute_per_microbatch < r.compute_per_microbatch);
  CHECK(u.compute_per_microbatch == Approx(r.compute_per_microbatch).epsilon(0.05));
  ulysses.tp = 8, ulysses.cp = 8, ulysses.dp = 1;
  CHECK_THROWS_WITH(sim::analytic_estimate(llama, ulysses, h100), Catch::Contains("ulysses splits the heads over tp x cp"));
  // The search enumerates each new dimension, and a space without it has none of it.
  const auto all = sim::search_plans(llama, {.gpus = 64, .batch = 64, .keep_unfit = true}, h100);
  const auto count = [&](const std::vector<sim::RankedPlan>& v, auto pred) { return std::count_if(v.begin(), v.end(), pred); };
  const auto is_hsdp = [](const sim::RankedPlan& x) { return x.plan.hsdp > 1; };
  const auto is_ulysses = [](const sim::RankedPlan& x) { return x.plan.cp_kind == "ulysses"; };
  const auto is_zb = [](const sim::RankedPlan& x) { return x.plan.zero_bubble(); };
  const auto is_module = [](const sim::RankedPlan& x) { return x.plan.recomputes().modules() && !x.plan.recomputes().full; };
  CHECK(count(all, is_hsdp) > 0);
  CHECK(count(all, is_ulysses) > 0);
  CHECK(count(all, is_zb) > 0);
  CHECK(count(all, is_module) > 0);
  // ZeRO at dp 1 under context parallelism shards over the cp ranks (torchtitan's FSDP 1 x CP 8):
  // the search has it (issue 43: it skipped every ZeRO plan at dp 1); at dp 1 x cp 1 there is
  // nothing to shard.
  const auto zero_over_cp = [](const sim::RankedPlan& x) { return x.plan.dp == 1 && x.plan.cp > 1 && x.plan.zero > 0; };
  const auto zero_alone = [](const sim::RankedPlan& x) { return x.plan.dp == 1 && x.plan.cp == 1 && x.plan.zero > 0; };
  CHECK(count(all, zero_over_cp) > 0);
  CHECK(count(all, zero_alone) == 0);
  const auto basic = sim::search_plans(llama, {.gpus = 64, .batch = 64, .keep_unfit = true, .hsdp = false, .cp_kinds = false,
                                               .zero_bubble = false, .recompute_modules = false}, h100);
  CHECK(count(basic, is_hsdp) + count(basic, is_ulysses) + count(basic, is_zb) + count(basic, is_module) == 0);
  CHECK(basic.size() < all.size());
}

TEST_CASE("sim: once-per-step collectives are charged once, ZeRO-1 as a reduce-scatter", "[sim][cost][zero]") {
  // The issue's symptom: the gradient reduction sat in the simulated micro-batch and doubled
  // with m; ZeRO-1 paid an all-reduce. Now the reduction is the same for every m, the step
  // grows by the schedule's compute only, and ZeRO-1's reduction costs what ZeRO-2's does.
  const models::GPTConfig model{.vocab = 32000, .seq = 1024, .dim = 2048, .heads = 16, .layers = 8, .checkpoint = true};
  auto estimate = [&](int zero, int m) {
    models::TrainingPlan plan{
        .model = model, .batch = 16 * m, .microbatches = m, .dp = 16, .tp = 4, .pp = 2, .zero = zero};
    const auto classes = models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(plan);
    std::vector<sim::ClassInput> inputs;
    for (const auto& k : classes) inputs.push_back({&k.report, k.pipeline_ranks});
    return sim::estimate_plan(inputs, models::plan_topology(plan, sim::Hardware{}), models::detail::plan_schedule(plan),
                              {.zero = zero});
  };
  const auto m16 = estimate(1, 16), m32 = estimate(1, 32), m64 = estimate(1, 64);
  const auto reduction = [](const sim::PlanEstimate& e) { return e.classes.front().gradient_reduction_seconds; };
  REQUIRE(reduction(m16) > 0);
  CHECK(reduction(m32) == Approx(reduction(m16)));
  CHECK(reduction(m64) == Approx(reduction(m16)));
  // 1F1B in steady state: each 16 more micro-batches add the same time.
  CHECK(m64.step_seconds - m32.step_seconds == Approx(2 * (m32.step_seconds - m16.step_seconds)).epsilon(0.02));
  const auto zero2 = estimate(2, 16), ddp = estimate(0, 16);
  CHECK(reduction(m16) == Approx(reduction(zero2)).epsilon(0.01));
  CHECK(m16.step_seconds == Approx(zero2.step_seconds).epsilon(0.02));
  CHECK(reduction(ddp) > 0);
}

TEST_CASE("sim: zero-bubble W contexts: the analytic in-flight bytes are the dry run's within 5 %", "[sim][search][pipeline]") {
  // ZB-H1 and ZB-V defer each micro-batch's weight gradients (W) past its input gradient (I): the
  // stage keeps each Linear's matmul input and output gradient until then (nn/linear.hpp
  // WeightCtx). The dry run now runs a zero-bubble step's backward as I then W and measures the
  // contexts on the ledger; both it and the analytic estimate weigh the schedule's forwards and
  // contexts in flight at the rank's peak (sim::detail::held_at_peak). A GPT of 16 layers over
  // pp 2 (8 per rank), TP 2 + SP, bf16, 8 micro-batches.
  const models::GPTConfig model{.vocab = 256, .seq = 512, .dim = 256, .heads = 4, .layers = 16};
  const sim::ModelShape shape{.layers = 16, .dim = 256, .heads = 4, .vocab = 256, .seq = 512};
  for (const char* schedule : {"zb", "zbv"}) {
    CAPTURE(schedule);
    const int v = std::string(schedule) == "zbv" ? 2 : 1;
    models::TrainingPlan plan{
        .model = model, .batch = 8, .microbatches = 8, .dp = 1, .tp = 2, .pp = 2, .schedule = schedule};
    const auto classes = models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(plan);
    const auto first =
        std::find_if(classes.begin(), classes.end(), [](const models::PlanClass& c) { return c.pipeline_rank == 0; });
    REQUIRE(first != classes.end());
    CHECK(first->contexts_per_stage > 0);
    CHECK(first->contexts_at_peak > 0);
    const auto a = sim::analytic_estimate(
        shape, {.batch = 8, .microbatch = 1, .dp = 1, .tp = 2, .pp = 2, .schedule = schedule, .stages_per_rank = v},
        sim::Hardware{});
    // The analytic figure is the busiest rank's (every rank with the same layers); the dry run's per class.
    double dry = 0;
    for (const auto& c : classes) dry = std::max(dry, c.in_flight_bytes);
    CAPTURE(first->saved_per_stage, first->contexts_per_stage, first->held_at_peak, first->contexts_at_peak,
            first->in_flight_bytes, dry, a.activations_in_flight, a.weight_contexts);
    CHECK(a.activations_in_flight == Approx(dry).epsilon(0.05));
    // The contexts are more than the 5 %: without them the two would not agree.
    CHECK(a.weight_contexts > 0.05 * a.activations_in_flight);
    // The dry run's estimate splits the backward as the schedule does.
    CHECK(first->report.phase("backward_weight").flops() > 0);
  }
}

TEST_CASE("sim: expert parallelism in the search: ep > 1 first where the experts fill memory; the all-to-alls are the dry run's",
          "[sim][search][moe]") {
  // A GPT whose every block is a MoE of 16 experts (top-2) on 8 GPUs: at ep 1 each rank holds all
  // 16 experts of its blocks whole (values and gradients in bf16 under DDP and ZeRO-1; the fp32
  // master and moments sharded over "edp"): more than an 80 MB device less the reserve (at pp 4,
  // 8.4 M parameters at 10 bytes); ep 2 and more split them. (ZeRO-3 shards the experts' values
  // too, over ep x edp = the token ranks whatever ep: its ep 1 plans may fit.)
  const sim::ModelShape shape{.layers = 4, .dim = 256, .heads = 4, .vocab = 512, .seq = 256, .experts = 16, .topk = 2};
  auto hw = sim::device("h100");
  hw.memory_bytes = 0.08e9;
  const auto all = sim::search_plans(shape, {.gpus = 8, .batch = 16, .keep_unfit = true}, hw);
  const auto ranked = sim::search_plans(shape, {.gpus = 8, .batch = 16}, hw);
  REQUIRE(!ranked.empty());
  CHECK(ranked.front().plan.ep > 1);
  bool saw_ep1 = false;
  for (const auto& r : all)
    if (r.plan.ep == 1 && r.plan.zero <= 1) {
      saw_ep1 = true;
      CHECK_FALSE(r.estimate.fits);
      CHECK(r.estimate.expert_states > 0.5 * r.estimate.memory_bytes);  // the experts dominate
    }
  CHECK(saw_ep1);
  // Every ep the search chose from divides the token ranks and is at most the experts.
  for (const auto& r : all) CHECK((r.plan.dp * r.plan.cp) % r.plan.ep == 0);
  // On a roomy device the same model's best plan is reported with its all-to-alls.
  const auto roomy = sim::search_plans(shape, {.gpus = 8, .batch = 16}, sim::device("h100"));
  CHECK(roomy.front().estimate.step_seconds > 0);

  // The analytic all-to-all bytes and counts against the dry run's CommLog, for EP 1, 2, 4, 8 of
  // a DP 8 plan and EP 2 under TP 2 + SP (the MoE gathers whole tokens), PP 2.
  struct Case {
    int dp, tp, pp, ep;
  };
  // A wider model than above (dim 1024, seq 1024), so that the step is the GEMMs' and the
  // collectives', not microseconds of latency, as in the dense comparison above.
  const sim::ModelShape wide{.layers = 4, .dim = 1024, .heads = 8, .vocab = 512, .seq = 1024, .experts = 16, .topk = 2};
  for (const Case c : {Case{8, 1, 1, 1}, Case{8, 1, 1, 2}, Case{8, 1, 1, 8}, Case{2, 2, 2, 2}, Case{4, 1, 2, 4}}) {
    CAPTURE(c.dp, c.tp, c.pp, c.ep);
    const int microbatches = 2;
    models::TrainingPlan plan{
        .model = {.vocab = 512, .seq = 1024, .dim = 1024, .heads = 8, .layers = 4, .mlp_ratio = 4},
        .batch = c.dp * microbatches,
        .microbatches = microbatches,
        .dp = c.dp,
        .tp = c.tp,
        .pp = c.pp};
    plan.moe.router.experts = 16;
    plan.moe.router.topk = 2;
    plan.ep = c.ep;
    const auto classes =
        models::dry_run_plan<dtensor::bfloat16, models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>,
                             true>(plan);
    const sim::PlanShape p{.batch = plan.batch, .microbatch = 1, .dp = c.dp, .tp = c.tp, .pp = c.pp, .ep = c.ep};
    const auto a = sim::analytic_estimate(wide, p, sim::Hardware{});
    const auto bytes = sim::moe_all_to_all_bytes(wide, p);
    for (const auto& k : classes) {
      CAPTURE(k.report.name);
      int dispatch = 0, counts = 0;
      for (const auto& ph : k.report.phases) {
        // Per block forward the dispatch and combine, backward combine's and the dispatch's adjoints.
        const bool forward = ph.name == "forward";
        for (const auto& r : ph.collectives) {
          if (r.group != "ep") continue;
          if (r.kind == CollectiveKind::all_to_all_v) {
            const bool first = (dispatch++ % 2) == 0;
            CHECK(double(r.bytes) == (forward ? (first ? bytes.dispatch : bytes.combine)
                                              : (first ? bytes.combine : bytes.dispatch_backward)));
          } else if (r.kind == CollectiveKind::all_to_all) ++counts;
        }
      }
      const int blocks = int(wide.layers / c.pp);  // every block is a MoE; one micro-batch dry-run
      if (c.ep > 1) {  // forward 2, backward 2 per block, and the count exchange
        CHECK(dispatch == 4 * blocks);
        CHECK(counts == blocks);
      }
    }
    // Step and memory against the dry run's, as the dense plans (the analytic is the pruning estimate).
    std::vector<sim::ClassInput> inputs;
    double memory = 0;
    for (const auto& k : classes) inputs.push_back({&k.report, k.pipeline_ranks}), memory = std::max(memory, k.peak_in_flight);
    const auto dry =
        sim::estimate_plan(inputs, models::plan_topology(plan, sim::Hardware{}), models::detail::plan_schedule(plan));
    const auto& slow = dry.classes[dry.slowest];
    CAPTURE(dry.step_seconds, a.step_seconds, memory, a.memory_bytes, a.expert_states, a.activations, a.ep_seconds,
            slow.compute_seconds, slow.exposed_communication_seconds, slow.once_per_step_seconds, a.forward, a.backward,
            a.compute_per_microbatch, a.gradient_reduction, a.optimizer, a.tp_seconds);
    CHECK(a.step_seconds == Approx(dry.step_seconds).epsilon(0.25));
    CHECK(a.memory_bytes == Approx(memory).epsilon(0.25));
  }
  // Llama blocks with SwiGLU experts and DeepSeek's shared experts (models::LlamaMoE): the
  // analytic counts an expert's 3 GEMMs and 3 x dim x width parameters, and the shared experts'
  // dense feed-forward (its GEMMs, its TP pair); against the dry run as above, and the
  // parameters a rank holds exactly (an expert's weights have no biases).
  const sim::ModelShape llama_moe{.layers = 4,
                                  .dim = 1024,
                                  .heads = 8,
                                  .kv_heads = 2,
                                  .ffn = 2048,
                                  .vocab = 512,
                                  .seq = 1024,
                                  .llama = true,
                                  .experts = 8,
                                  .topk = 2,
                                  .expert_ffn = 512,
                                  .shared_experts = 2};
  // llama_moe as a plan on a mesh, with 2 micro-batches.
  const auto llama_moe_plan = [](int batch, int dp, int tp, int pp, int ep) {
    models::TrainingPlan plan{
        .model = {.vocab = 512, .seq = 1024, .dim = 1024, .heads = 8, .layers = 4, .kv_heads = 2, .ffn = 2048},
        .batch = batch,
        .microbatches = 2,
        .dp = dp,
        .tp = tp,
        .pp = pp};
    plan.moe.router.experts = 8;
    plan.moe.router.topk = 2;
    plan.moe.hidden = 512;
    plan.moe.shared = 2;
    plan.ep = ep;
    return plan;
  };
  using Layers = models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">, models::LlamaLayers>;
  for (const Case c : {Case{8, 1, 1, 2}, Case{2, 2, 2, 2}}) {
    CAPTURE(c.dp, c.tp, c.pp, c.ep);
    const auto plan = llama_moe_plan(c.dp * 2, c.dp, c.tp, c.pp, c.ep);
    const auto classes = models::dry_run_plan<dtensor::bfloat16, Layers, true>(plan);
    const sim::PlanShape p{.batch = plan.batch, .microbatch = 1, .dp = c.dp, .tp = c.tp, .pp = c.pp, .ep = c.ep};
    const auto a = sim::analytic_estimate(llama_moe, p, sim::Hardware{});
    std::vector<sim::ClassInput> inputs;
    double memory = 0;
    for (const auto& k : classes)
      inputs.push_back({&k.report, k.pipeline_ranks}), memory = std::max(memory, k.peak_in_flight);
    const auto dry =
        sim::estimate_plan(inputs, models::plan_topology(plan, sim::Hardware{}), models::detail::plan_schedule(plan));
    CAPTURE(dry.step_seconds, a.step_seconds, memory, a.memory_bytes);
    CHECK(a.step_seconds == Approx(dry.step_seconds).epsilon(0.25));
    CHECK(a.memory_bytes == Approx(memory).epsilon(0.25));
    // Every expert's and shared expert's weights are the model's: the pipeline ranks' bf16
    // parameters (whole on ZeRO-1's data ranks, the experts one ep rank's share, the dense ones
    // split over tp) add up to the formula's count.
    if (c.tp == 1 && c.pp == 1) {
      const auto& k = classes.front();
      const double held =
          double(k.report.phase(sim::RankReport::construction_phase).end[std::size_t(MemoryTag::parameters)]);
      const double expert_share = double(llama_moe.layers) * llama_moe.experts / c.ep * llama_moe.expert_params();
      const double dense =
          llama_moe.params() - double(llama_moe.layers) * llama_moe.experts * llama_moe.expert_params();
      CHECK(held == Approx(2 * (dense + expert_share)).epsilon(0.001));
    }
  }
  // --dense-first (DeepSeek-V3's first 3 of 61 blocks dense): the dry run builds the first blocks
  // with the dense feed-forward, the analytic counts moe_layers() = 3 of 4; the parameters a rank
  // holds add up to its formula; a plan without a MoE block left is refused.
  {
    auto first_dense = llama_moe;
    first_dense.dense_first = 1;
    CHECK(first_dense.moe_layers() == 3);
    auto plan = llama_moe_plan(4, 2, 1, 1, 2);
    plan.moe.dense_first = 1;
    const auto classes = models::dry_run_plan<dtensor::bfloat16, Layers, true>(plan);
    const double held = double(
        classes.front().report.phase(sim::RankReport::construction_phase).end[std::size_t(MemoryTag::parameters)]);
    const double expert_params = first_dense.expert_params() * double(first_dense.experts);
    const double dense = first_dense.params() - 3 * expert_params;
    CHECK(held == Approx(2 * (dense + 3 * expert_params / 2)).epsilon(0.001));
    CHECK(first_dense.params() < llama_moe.params());
    // A pipeline stage whose blocks are all dense (pp 2, the first 2 of 4 dense: stage 0) holds no
    // expert: the experts' FSDP there shards nothing (fully_shard refused "the model has no units").
    auto staged = plan;
    staged.pp = 2, staged.moe.dense_first = 2;
    CHECK_NOTHROW(models::dry_run_plan<dtensor::bfloat16, Layers, true>(staged));
    staged.zero = 3;
    CHECK_NOTHROW(models::dry_run_plan<dtensor::bfloat16, Layers, true>(staged));
    first_dense.dense_first = 4;
    CHECK_THROWS_WITH(
        sim::analytic_estimate(first_dense, {.batch = 4, .microbatch = 1, .dp = 2, .ep = 2}, sim::Hardware{}),
        Catch::Contains("at least one MoE block"));
  }
  // FP8 (--dtype fp8): every Linear's and expert's GEMM as gemm_fp8 (parallel/experts.hpp), on an
  // H100 (the default device has no FP8 peak). The analytic counts the experts' as the Linears'
  // (the one-byte GEMM, its quantizing and amax passes, the rows' amax all-reduces over "edp"): it
  // follows the dry run as in bf16, and so does what FP8 saves.
  {
    const auto h100 = sim::device("h100");
    auto plan = llama_moe_plan(16, 8, 1, 1, 2);
    const auto step = [&](bool fp8) {
      plan.fp8 = fp8;
      const auto classes = models::dry_run_plan<dtensor::bfloat16, Layers, true>(plan);
      std::vector<sim::ClassInput> inputs;
      for (const auto& k : classes) inputs.push_back({&k.report, k.pipeline_ranks});
      const double dry =
          sim::estimate_plan(inputs, models::plan_topology(plan, h100), models::detail::plan_schedule(plan))
              .step_seconds;
      const sim::PlanShape p{.batch = plan.batch, .microbatch = 1, .dp = 8, .ep = 2, .fp8 = fp8};
      return std::pair{dry, sim::analytic_estimate(llama_moe, p, h100).step_seconds};
    };
    const auto [dry_bf16, a_bf16] = step(false);
    const auto [dry_fp8, a_fp8] = step(true);
    CAPTURE(dry_bf16, a_bf16, dry_fp8, a_fp8);
    CHECK(a_fp8 == Approx(dry_fp8).epsilon(0.25));
    CHECK(a_fp8 / a_bf16 == Approx(dry_fp8 / dry_bf16).epsilon(0.05));
    CHECK(dry_fp8 != dry_bf16);
  }

  // Bad expert parallelism: more ranks than experts, not dividing the token ranks, without experts.
  const sim::PlanShape p{.batch = 16, .microbatch = 1, .dp = 8, .ep = 3};
  CHECK_THROWS_WITH(sim::analytic_estimate(shape, p, sim::Hardware{}), Catch::Contains("ep 3 must divide dp x cp = 8"));
  auto few = shape;
  few.experts = 4;
  CHECK_THROWS_WITH(sim::analytic_estimate(few, {.batch = 16, .microbatch = 1, .dp = 8, .ep = 8}, sim::Hardware{}),
                    Catch::Contains("at most the 4 experts"));
  auto dense = shape;
  dense.experts = 0;
  CHECK_THROWS_WITH(sim::analytic_estimate(dense, {.batch = 16, .microbatch = 1, .dp = 8, .ep = 2}, sim::Hardware{}),
                    Catch::Contains("1 without experts"));
}

TEST_CASE("sim: a dry run's rank class as the tiers' input; the transfers compute cannot hide", "[sim][offload]") {
  // plan_at_scale --offload (docs/dry-run.md): tier_input_of reads the states between steps from
  // a class's report (the optimizer_state tag split 4 : 8 into master and moments under
  // fully_shard<float>, the parameters and gradients the optimizer phase holds), and the rest of
  // the peak is activations; the tiers then lose no byte, and the disk holds master + moments
  // under optimizer,params.
  sim::RankReport report;
  report.phases.resize(2);
  report.phases[0].name = "forward";
  report.phases[0].peak[std::size_t(MemoryTag::optimizer_state)] = 1200;
  report.phases[0].peak[std::size_t(MemoryTag::parameters)] = 900;  // a unit gathered: not between steps
  report.phases[1].name = "optimizer";
  report.phases[1].peak[std::size_t(MemoryTag::optimizer_state)] = 1200;
  report.phases[1].peak[std::size_t(MemoryTag::parameters)] = 100;
  report.phases[1].peak[std::size_t(MemoryTag::gradients)] = 50;
  const auto in = sim::tier_input_of(report, 5000, true);
  CHECK(in.states.master == 400);
  CHECK(in.states.moments == 800);
  CHECK(in.states.params == 100);
  CHECK(in.states.grads == 50);
  CHECK(in.activations_peak == 5000 - 1350);
  CHECK(in.saved_activations == 0);
  const auto moments_only = sim::tier_input_of(report, 5000, false);
  CHECK(moments_only.states.master == 0);
  CHECK(moments_only.states.moments == 1200);
  const sim::TierOptions both{.offload = sim::parse_offload("optimizer,params"), .buffer_bytes = 64,
                              .disk_bytes_per_second = 100, .pcie_bytes_per_second = 1000};
  const auto r = sim::offload_tiers(in, both);
  CHECK(r.bytes.disk == 1200);
  CHECK(r.bytes.total() == 5000 + 64);
  CHECK(r.bytes.device == 5000 - 1200 - 50);  // the gradient shard to the host with the update
  CHECK(r.disk_seconds == Approx((2 * 800 + 4 * 400) / 100.0));
  // Exposed: what the longer link's time exceeds the compute by.
  CHECK(sim::exposed_transfer_seconds(r, 0) == Approx(r.disk_seconds));
  CHECK(sim::exposed_transfer_seconds(r, r.disk_seconds / 2) == Approx(r.disk_seconds / 2));
  CHECK(sim::exposed_transfer_seconds(r, 2 * r.disk_seconds) == 0);
}

TEST_CASE("sim: activation offload, bytes per tier and the transfers hidden behind the next block", "[sim][offload]") {
  // 1F1B on the first of 4 stages: 4 micro-batches in flight of 8, 6 blocks of 1 GiB saved each.
  const double gib = double(1 << 30);
  sim::ActivationOffloadInput in{.saved_per_block = gib, .blocks = 6, .microbatches = 8, .held = 4,
                                 .forward_seconds = 0.05, .backward_seconds = 0.1};
  // PCIe at 25 GB/s: one block moves in 43 ms, under the forward (50 ms) and the backward: all hidden.
  const auto pcie = sim::activation_offload(in, {.bytes_per_second = 25e9});
  CHECK(pcie.tier_bytes == 24 * gib);
  CHECK(pcie.compute_saved_bytes == 2 * gib);
  CHECK(pcie.compute_drop == 22 * gib);
  CHECK(pcie.bytes_per_step == 2 * 8 * 6 * gib);
  CHECK(pcie.io_seconds == Approx(96 * gib / 25e9));
  CHECK(pcie.exposed_seconds == 0);
  CHECK(pcie.hidden() == 1);
  // A disk at 6 GB/s: 179 ms a block, 129 ms past the forward and 79 ms past the backward, for
  // 5 of the 6 blocks of each of the 8 micro-batches.
  const auto disk = sim::activation_offload(in, {.bytes_per_second = 6e9});
  const double t = gib / 6e9;
  CHECK(disk.exposed_seconds == Approx(8 * 5 * ((t - 0.05) + (t - 0.1))));
  CHECK(disk.hidden() == Approx(1 - disk.exposed_seconds / disk.io_seconds));
  CHECK(disk.hidden() > 0);
  CHECK(disk.hidden() < 1);
  CHECK_THAT(disk.to_string(), Catch::Contains("tier 24 GiB"));
  // Bad input names the call and the values.
  CHECK_THROWS_WITH(sim::activation_offload({.blocks = 2, .microbatches = 2, .held = 3}, {}),
                    Catch::Contains("sim::activation_offload") && Catch::Contains("held 3"));
  CHECK_THROWS_WITH(sim::activation_offload(in, {.bytes_per_second = 0}), Catch::Contains("positive bandwidth"));
}

TEST_CASE("sim: activation offload on meta tensors, the dry run's ledger shows the tiers", "[sim][offload]") {
  // nn::ActivationOffload with the host tier on a meta GPT (nothing moves, the bytes are recorded):
  // the meta space's activations peak drops by all but ~2 blocks' saved state, the host tier holds
  // every block's at the end of the forward — 6 × one block's bytes (nn::saved_bytes) — and none after.
  using Mesh = MetaMesh<"fsdp">;
  const models::GPTConfig config{.vocab = 256, .seq = 16, .dim = 64, .heads = 4, .layers = 6};
  auto step = [&](bool offload) {
    Mesh mesh(sim::world(0, 2), {2});
    models::GPT<float, Mesh> model(mesh, config);
    if (offload)
      model.set_activation_offload(std::make_shared<nn::ActivationOffload>(nn::ActivationOffloadOptions{.tier = nn::OffloadTier::host}));
    const auto ids = distribute_replicated<typename models::GPT<float, Mesh>::Ids::layout>(
        mesh, Tensor<std::int32_t, 2, meta_space>(Shape<2>{2, config.seq}));
    MemoryLedger ledger;
    MemoryTagScope tag(MemoryTag::activations);
    auto [loss, saved] = model.forward(ids, ids);
    const std::size_t block = offload ? 0 : nn::saved_bytes(saved.blocks[0]);
    model.backward(std::move(saved));
    return std::tuple{ledger.peak("meta", MemoryTag::activations), ledger.peak("host", MemoryTag::activations),
                      ledger.current("host", MemoryTag::activations), block};
  };
  const auto [meta_peak, host_peak0, host_after0, block] = step(false);
  const auto [meta_peak_off, host_peak, host_after, unused] = step(true);
  CAPTURE(meta_peak, meta_peak_off, block, host_peak);
  REQUIRE(block > 0);
  CHECK(host_peak0 < 64);  // without offload: a scalar or so on the host (the loss), no activations
  CHECK(host_peak == host_peak0 + std::int64_t(6 * block));
  CHECK(host_after == 0);
  CHECK(meta_peak - meta_peak_off >= std::int64_t(3 * block));
}

TEST_CASE(
    "sim: the dry run's step is the real step's, per rank and tag: DDP and FSDP on the trainer's path at pp 1 and 2",
    "[sim][memory][fsdp]") {
  // The same function (models::detail::pipeline_rank_step: the Trainer's own step) on meta
  // tensors over the sim communicator, and on host tensors over 4 rank threads: every phase's
  // peak by tag and its collectives are equal (the model states exactly; the activations within
  // 1 %, or within the bytes the rank sends: a sent activation is freed when its send finishes,
  // at once in a dry run, when the peer takes it in a real one). With cp 2 FSDP shards over
  // "fsdp*cp" (N' = 4 with fsdp 2) in both.
  struct Case {
    int zero, pp, cp;
  };
  // zero 0: DDP, the trainer's ZeRO-1 over a size-1 "fsdp" (no second assembly of the step).
  for (const auto& [zero, pp, cp] :
       {Case{3, 1, 1}, Case{2, 1, 1}, Case{3, 2, 1}, Case{3, 1, 2}, Case{0, 1, 1}, Case{0, 2, 1}}) {
    models::TrainingPlan p{.model = {.vocab = 61, .seq = 16, .dim = 32, .heads = 4, .layers = 3},
                           .batch = 8,
                           .microbatches = pp,
                           .dp = 4 / pp / cp,
                           .pp = pp,
                           .zero = zero,
                           .cp = cp};
    INFO("ZeRO-" << zero << ", pp " << pp << ", dp " << p.dp << ", cp " << cp);
    const auto dry = models::dry_run_plan<float, models::DenseLayers, false>(p);
    std::vector<sim::RankReport> real(4);
    threads::run(4, [&](CommPtr world) {
      sim::Recorder rec("host");
      const int rank = world->rank();
      models::detail::pipeline_rank_step<float, models::DenseLayers, false, host_space>(std::move(world), p, rec);
      real[std::size_t(rank)] = rec.finish("real");
    });
    for (const auto& c : dry) {
      // The real rank at this class's pipeline rank, data and context coordinates 0 (one class:
      // balanced context ranks do equal work).
      const sim::RankReport& r = real[std::size_t(c.pipeline_rank * (4 / pp))];
      REQUIRE(r.phases.size() == c.report.phases.size());
      std::int64_t sent = 0;
      for (const auto& ph : r.phases)
        for (const auto& x : ph.collectives) sent += x.kind == CollectiveKind::send ? std::int64_t(x.bytes) : 0;
      for (std::size_t ph = 0; ph < r.phases.size(); ++ph) {
        const auto& a = c.report.phases[ph];
        const auto& b = r.phases[ph];
        INFO("pipeline rank " << c.pipeline_rank << ", phase " << a.name);
        if (cp > 1 && a.name == "optimizer") {  // the states over "fsdp*cp": nothing all-reduced on "cp"
          for (const auto& x : a.collectives) CHECK_FALSE((x.group == "cp" && x.kind == CollectiveKind::all_reduce));
        }
        CHECK(a.name == b.name);
        for (MemoryTag t : {MemoryTag::parameters, MemoryTag::gradients, MemoryTag::optimizer_state}) {
          INFO(name_of(t));
          CHECK(a.peak[std::size_t(t)] == b.peak[std::size_t(t)]);
          CHECK(a.end[std::size_t(t)] == b.end[std::size_t(t)]);
        }
        const auto act = std::size_t(MemoryTag::activations);
        CHECK(a.peak[act] <= b.peak[act]);
        CHECK(double(a.peak[act]) ==
              Approx(double(b.peak[act])).epsilon(0.01).margin(double(std::max<std::int64_t>(256, sent))));
        std::string names_a, names_b;
        for (const auto& x : a.collectives) names_a += std::string(name_of(x.kind)) + " on " + x.group + "; ";
        for (const auto& x : b.collectives) names_b += std::string(name_of(x.kind)) + " on " + x.group + "; ";
        INFO("dry: " << names_a << " real: " << names_b);
        // Building: the real backends agree on the schedule and settings first (one all-gather
        // over the mesh, distributed/settings_agreement.hpp), which a dry run has no peers for.
        if (a.name == sim::RankReport::construction_phase) continue;
        REQUIRE(a.collectives.size() == b.collectives.size());
        for (std::size_t k = 0; k < a.collectives.size(); ++k) {
          CHECK(a.collectives[k].kind == b.collectives[k].kind);
          CHECK(a.collectives[k].group == b.collectives[k].group);
          CHECK(a.collectives[k].bytes == b.collectives[k].bytes);
        }
      }
    }
  }
}

TEST_CASE("sim: an op without FLOPs costs its bytes, and data ranks without a sequence are no NaN", "[sim][cost][issue43]") {
  // A GEMM with an empty dimension (the shard of a data rank that gets no sequence) moves its
  // weights and computes nothing: its efficiency, intensity 0, was 0, and 0 FLOPs / 0 FLOP/s NaN
  // ("compute -nan s" in plan_at_scale's report, "-nan" in its JSON).
  const auto h100 = sim::device("h100");
  const kernels::meta::CostRecord empty{"gemm", 0, 1'000'000, 0};
  CHECK(sim::op_seconds(empty, h100) == Approx(1e6 / (h100.hbm_bytes_per_second * sim::calibration.hbm_fraction)));
  CHECK(sim::op_seconds({"gemm", 0, 0, 0}, h100) == 0);
  // A micro-batch of 4 sequences over dp 8: four data ranks without work, their own class.
  const models::TrainingPlan plan{.model = {.vocab = 1000, .seq = 128, .dim = 256, .heads = 4, .layers = 2},
                                  .batch = 4,
                                  .microbatches = 1,
                                  .dp = 8};
  const auto classes = models::dry_run_plan<float, models::DenseLayers, true>(plan);
  std::vector<sim::ClassInput> inputs;
  for (const auto& c : classes) inputs.push_back({&c.report, c.pipeline_ranks});
  auto hw = h100;
  hw.fp32 = true;
  const auto est = sim::estimate_plan(inputs, models::plan_topology(plan, hw), models::detail::plan_schedule(plan));
  REQUIRE(classes.size() >= 2);
  for (const auto& c : est.classes) {
    CAPTURE(c.name, c.compute_seconds, c.step_seconds);
    CHECK(std::isfinite(c.compute_seconds));
    CHECK(std::isfinite(c.step_seconds));
  }
  CHECK(std::isfinite(est.step_seconds));
}

TEST_CASE("sim: DDP in bf16 keeps fp32 master values and moments unless bf16 moments are asked", "[sim][memory][issue43]") {
  // Mixed precision as practised (and as train_gpt --dtype bf16 runs DDP): bf16 values and
  // gradients, fp32 master values and two fp32 moments, 2 + 2 + 12 bytes per parameter; with
  // bf16_moments AdamW runs in bf16 on the values, 2 + 2 + 4. The dry run and the analytic
  // estimate say the same.
  const models::GPTConfig model{.vocab = 1000, .seq = 64, .dim = 256, .heads = 4, .layers = 2};
  for (const bool moments16 : {false, true}) {
    CAPTURE(moments16);
    models::TrainingPlan plan{.model = model, .batch = 4, .microbatches = 1, .dp = 4};
    plan.bf16_moments = moments16;
    const auto run = first_class(models::dry_run_plan<dtensor::bfloat16, models::DenseLayers, true>(plan));
    const double psi = model_elements(run.report);
    const auto m = model_states_after_step(run.report);
    CAPTURE(psi, m.params, m.grads, m.optimizer);
    CHECK(m.params == Approx(2 * psi).epsilon(1e-3));
    CHECK(m.grads == Approx(2 * psi).epsilon(1e-3));
    CHECK(m.optimizer == Approx((moments16 ? 4 : 12) * psi).epsilon(1e-3));
    // The analytic estimate's model states, per parameter.
    const sim::ModelShape shape{.layers = 2, .dim = 256, .heads = 4, .vocab = 1000, .seq = 64};
    const sim::PlanShape p{.batch = 4, .microbatch = 1, .dp = 4, .bf16 = true, .bf16_moments = moments16};
    const auto a = sim::analytic_estimate(shape, p, sim::device("h100"));
    CHECK(a.model_states == Approx((moments16 ? 8 : 16) * shape.params()).epsilon(1e-9));
    CHECK_THAT(sim::describe(p), Catch::EndsWith(moments16 ? "1f1b, DDP (bf16 moments)" : "1f1b, DDP + fp32 master"));
  }
  // An fp32 model's master is its values: 4 + 4 + 8 bytes, as before.
  const sim::ModelShape shape{.layers = 2, .dim = 256, .heads = 4, .vocab = 1000, .seq = 64};
  const auto f32 = sim::analytic_estimate(shape, {.batch = 4, .microbatch = 1, .dp = 4, .bf16 = false}, sim::device("h100"));
  CHECK(f32.model_states == Approx(16 * shape.params()).epsilon(1e-9));
  // A MoE model's MFU counts the parameters a token multiplies: the router and top-k experts.
  const sim::ModelShape moe{.layers = 2, .dim = 256, .heads = 4, .vocab = 1000, .seq = 64, .experts = 8, .topk = 2};
  sim::ModelShape all = moe;
  all.topk = 8;
  CHECK(moe.model_flops_per_token() > 0);
  CHECK(moe.model_flops_per_token() < all.model_flops_per_token());
  const auto e = sim::analytic_estimate(moe, {.batch = 8, .microbatch = 1, .dp = 8, .ep = 2}, sim::device("h100"));
  CHECK(e.mfu > 0);
  CHECK(std::isfinite(e.mfu));
}

// Issue 43: the planner charges DeepSeek's multi-head latent attention. sim::ModelShape's MLA
// parameters are exactly those the dry run builds (nn::MultiHeadLatentAttention's five Linears
// and two latent norms; with and without the query latent; in a dense Llama and in a Llama MoE),
// and the analytic estimate of an MLA MoE plan follows its dry run as the dense MLA plans of "the
// analytic estimate follows the dry run's" do.
TEST_CASE("sim: MLA in the planner: the parameters the dry run builds, the FLOPs, a MoE plan's step", "[sim][mla]") {
  // The bf16 values a data rank of a one-stage, one-tp plan holds (ZeRO-1 over one shard: whole).
  const auto held = [](const std::vector<models::PlanClass>& classes) {
    return double(
        classes.front().report.phase(sim::RankReport::construction_phase).end[std::size_t(MemoryTag::parameters)]);
  };
  const sim::ModelShape dense{
      .layers = 3, .dim = 256, .heads = 4, .ffn = 640, .vocab = 1000, .seq = 128, .llama = true};
  for (const Extent q_lora_rank : {Extent(96), Extent(0)}) {
    CAPTURE(q_lora_rank);
    const nn::LatentAttentionConfig c{.q_lora_rank = q_lora_rank,
                                      .kv_lora_rank = 64,
                                      .qk_nope_head_dim = 48,
                                      .qk_rope_head_dim = 16,
                                      .v_head_dim = 40};
    const auto shape = sim::with_mla(dense, c);
    models::TrainingPlan plan{
        .model = {.vocab = 1000, .seq = 128, .dim = 256, .heads = 4, .layers = 3, .ffn = 640, .mla = c},
        .batch = 4,
        .microbatches = 2,
        .dp = 2};
    const auto classes = models::dry_run_plan<dtensor::bfloat16, models::LlamaLayers, true>(plan);
    CHECK(held(classes) == 2 * shape.params());
    CHECK(shape.params() != dense.params());
    // FLOPs per token (PaLM's count): 6 x the parameters a token passes (the built ones, less the
    // embedding's lookup and the final norm) + the score and value products with the query/key
    // head (48 + 16) and the value head (40): 6 L s H (64 + 40), not GQA's 12 L s dim.
    const double passed = shape.params() - double(dense.vocab * dense.dim) - double(dense.dim);
    CHECK(shape.model_flops_per_token() == Approx(6 * passed + 6.0 * 3 * 128 * 4 * (64 + 40)).epsilon(1e-12));
  }
  // MoE: a Llama MoE with MLA (DeepSeek-V3's shape, small): the parameters a rank holds are the
  // formula's (the experts one ep rank's share). The analytic step of this MoE model is 0.86-0.89
  // x its dry run's with GQA as with MLA (the MoE blocks' terms, not MLA's: the Llama MoE
  // plans above are held within 25 %), so MLA's charge is checked as the change it makes: the
  // ratio analytic / dry run with MLA within 5 % of the same plan's with GQA.
  const nn::LatentAttentionConfig c{
      .q_lora_rank = 256, .kv_lora_rank = 128, .qk_nope_head_dim = 96, .qk_rope_head_dim = 32, .v_head_dim = 64};
  const sim::ModelShape moe = sim::with_mla({.layers = 4,
                                             .dim = 1024,
                                             .heads = 8,
                                             .ffn = 2048,
                                             .vocab = 512,
                                             .seq = 1024,
                                             .llama = true,
                                             .experts = 8,
                                             .topk = 2,
                                             .expert_ffn = 512,
                                             .shared_experts = 1,
                                             .dense_first = 1},
                                            c);
  using Layers = models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">, models::LlamaLayers>;
  struct Case {
    int dp, tp, pp, ep;
  };
  for (const Case k : {Case{4, 1, 1, 2}, Case{2, 2, 2, 2}, Case{4, 2, 1, 4}}) {
    CAPTURE(k.dp, k.tp, k.pp, k.ep);
    double ratio[2] = {0, 0};  // analytic / dry run: GQA (2 KV heads), MLA
    for (const bool with_mla : {false, true}) {
      CAPTURE(with_mla);
      models::TrainingPlan plan{
          .model = {.vocab = 512, .seq = 1024, .dim = 1024, .heads = 8, .layers = 4, .ffn = 2048, .mla = c},
          .batch = 2 * k.dp,
          .microbatches = 2,
          .dp = k.dp,
          .tp = k.tp,
          .pp = k.pp};
      plan.moe.router.experts = 8, plan.moe.router.topk = 2, plan.moe.hidden = 512, plan.moe.shared = 1;
      plan.moe.dense_first = 1, plan.ep = k.ep;
      auto shape = moe;
      if (!with_mla) {
        plan.model.mla = {}, plan.model.kv_heads = 2;
        shape = sim::with_mla(moe, nn::LatentAttentionConfig{}), shape.kv_heads = 2;
      }
      const auto classes = models::dry_run_plan<dtensor::bfloat16, Layers, true>(plan);
      if (with_mla && k.tp == 1 && k.pp == 1) {
        const double experts = double(moe.moe_layers()) * double(moe.experts) * moe.expert_params();
        CHECK(held(classes) == 2 * (moe.params() - experts + experts / k.ep));
      }
      const sim::PlanShape p{.batch = plan.batch, .microbatch = 1, .dp = k.dp, .tp = k.tp, .pp = k.pp, .ep = k.ep};
      const auto a = sim::analytic_estimate(shape, p, sim::Hardware{});
      std::vector<sim::ClassInput> inputs;
      for (const auto& x : classes) inputs.push_back({&x.report, x.pipeline_ranks});
      const auto dry =
          sim::estimate_plan(inputs, models::plan_topology(plan, sim::Hardware{}), models::detail::plan_schedule(plan));
      CAPTURE(dry.step_seconds, a.step_seconds);
      CHECK(a.step_seconds == Approx(dry.step_seconds).epsilon(0.25));
      ratio[with_mla] = a.step_seconds / dry.step_seconds;
    }
    CAPTURE(ratio[0], ratio[1]);
    CHECK(ratio[1] == Approx(ratio[0]).epsilon(0.05));
  }
  // A bad MLA shape is refused naming its fields; serving counts every head's cached key and value.
  auto odd = moe;
  odd.qk_rope_dim = 31;
  CHECK_THROWS_WITH(sim::analytic_estimate(odd, {.batch = 4, .microbatch = 1, .dp = 4, .ep = 2}, sim::Hardware{}),
                    Catch::Contains("qk_rope_dim 31"));
  auto gqa = moe;
  gqa.kv_heads = 2;
  CHECK_THROWS_WITH(sim::analytic_estimate(gqa, {.batch = 4, .microbatch = 1, .dp = 4, .ep = 2}, sim::Hardware{}),
                    Catch::Contains("a key and value per head"));
  const auto served = sim::serving_memory(sim::with_mla(dense, c), {.batch = 2, .context = 128, .tp = 2});
  CHECK(served.kv_per_token == 3 * 4 * (96 + 32 + 64) / 2 * 2);
  CHECK_THROWS_WITH(sim::serving_memory(sim::with_mla(dense, c), {.batch = 2, .context = 128, .cp = 2}),
                    Catch::Contains("no KV cache split"));
}

// Issue 41: which blocks have experts is one formula (nn/moe_blocks.hpp); the analytic estimate's
// ModelShape, the parameter count before a build and the flags' check read it, and agree with the
// blocks the predicate marks, counted one by one.
TEST_CASE("sim: the number of MoE blocks is one formula for the estimate, the size check and the flags", "[sim][moe]") {
  struct Case {
    Extent layers, every, dense_first;
  };
  const std::vector<Case> cases{{61, 1, 3}, {61, 1, 0}, {8, 2, 0}, {8, 2, 3}, {7, 3, 2},  {7, 3, 3}, {10, 4, 5},
                                {9, 2, 8},  {5, 5, 0},  {5, 5, 4}, {5, 2, 5}, {12, 5, 7}, {1, 1, 0}, {6, 4, 3}};
  for (const auto& c : cases) {
    CAPTURE(c.layers, c.every, c.dense_first);
    Extent counted = 0;
    for (Extent l = 0; l < c.layers; ++l) counted += nn::is_moe_block(l, c.every, c.dense_first);
    CHECK(nn::moe_block_count(c.layers, c.every, c.dense_first) == counted);
    // The analytic estimate's model.
    sim::ModelShape m;
    m.layers = c.layers, m.experts = 4, m.moe_every = c.every, m.dense_first = c.dense_first;
    CHECK(m.moe_layers() == counted);
    // The parameter count before a build: each MoE block has 4 MLPs of 2 dim x ffn where a dense one has 1.
    models::GPTConfig cfg;
    cfg.layers = c.layers, cfg.dim = 8, cfg.vocab = 16, cfg.seq = 4;
    const long double extra =
        models::approx_parameter_count(cfg, 4, c.every, c.dense_first) - models::approx_parameter_count(cfg);
    CHECK(extra == (long double)counted * 3 * 2 * 8 * 32);
    // The flags: refused exactly when no block would have experts.
    models::cli::MoEFlags flags;
    flags.experts = 4, flags.moe_every = c.every, flags.dense_first = c.dense_first;
    const train::cli::MeshFlags mesh;
    if (counted > 0) CHECK_NOTHROW(models::cli::check_moe_flags(flags, mesh, c.layers));
    else
      CHECK_THROWS_WITH(models::cli::check_moe_flags(flags, mesh, c.layers),
                        Catch::Contains("no block would have experts"));
  }
  CHECK(nn::moe_block_count(61, 1, 3) == 58);  // DeepSeek-V3
  CHECK(nn::moe_block_count(3, 1, 7) == 0);    // every block within the dense ones
  CHECK_THROWS_WITH(nn::moe_block_count(8, 0, 0), Catch::Contains("every 0 must be >= 1"));
  CHECK_THROWS_WITH(nn::is_moe_block(1, 2, -1), Catch::Contains("dense_first -1"));
}

TEST_CASE("sim: the node-level dispatch: its all-to-alls from the formula, the dry run's CommLog, fewer network bytes",
          "[sim][moe][nodes]") {
  using K = CollectiveKind;
  // Exact figures: 16 experts over ep 16 (one per rank) in nodes of 4 (4 nodes), top-4 within 2
  // of 4 groups (a group per node): balanced routing puts each token's 4 choices on 4 ranks of
  // 2 nodes, 2 on each. A micro-batch of 128 tokens is 8 periods of E = 16 tokens; dim 256 in
  // bf16: 512-byte rows.
  sim::ModelShape m{.layers = 2, .dim = 256, .heads = 4, .vocab = 1024, .seq = 128, .experts = 16, .topk = 4};
  m.expert_groups = 4, m.topk_groups = 2, m.expert_ffn = 512;
  sim::PlanShape p{.batch = 32, .microbatch = 1, .dp = 16, .ep = 16};
  const auto one = sim::moe_all_to_all_bytes(m, p);
  p.ep_node_size = 4;
  const auto two = sim::moe_all_to_all_bytes(m, p);
  const double row = 512;
  // One stage: per peer 8 x 4 units and pairs (a token's row once per expert rank), the side
  // array (32 pairs x 6 bytes) one row: 16 x 33 rows each way; combine 16 x 32.
  CHECK(one.dispatch == 16 * 33 * row);
  CHECK(one.combine == 16 * 32 * row);
  CHECK(one.dispatch_backward == 16 * 33 * row);  // 32 gate gradients x 2 bytes: one row
  CHECK(one.counts == 8 * 16 * (1 + 1));
  CHECK(one.node_dispatch == 0);
  // Stage 1 over the 4 nodes: per node 8 x 16 tokens x 2 nodes / 4 = 64 units, 128 pairs (side:
  // 768 bytes, 2 rows forward; 256 bytes, 1 row backward): 4 x 66, 4 x 64 and 4 x 65 rows.
  CHECK(two.dispatch == 4 * 66 * row);
  CHECK(two.combine == 4 * 64 * row);
  CHECK(two.dispatch_backward == 4 * 65 * row);
  CHECK(two.counts == 8 * 4 * (1 + 4));
  // Stage 2 inside a node: the peer forwards 4 sources x 32 units to each of the node's 4 ranks
  // (128 units and pairs each; side 768 bytes: 2 rows, backward 256: 1 row).
  CHECK(two.node_dispatch == 4 * 130 * row);
  CHECK(two.node_combine == 4 * 128 * row);
  CHECK(two.node_dispatch_backward == 4 * 129 * row);
  CHECK(two.node_counts == 8 * 4 * (1 + 1));
  CHECK(two.forwarded == 4 * 128);
  // The rows that cross between nodes: one-stage 12 of each rank's 16 peers' rows are remote;
  // here at most 3 of 4 node peers' (half the units: a token reaches 2 nodes, not 4 ranks).
  CHECK(two.combine * 3 / 4 < one.combine * 12 / 16);

  // The analytic estimate charges them on their groups: stage 1 on "ep_across", stage 2 on
  // "ep_node" (H100 nodes of 8: nodes of 4 expert ranks, two per machine).
  const auto hw = sim::device("h100");
  const sim::Topology topo = [&] {
    sim::Topology t(std::array<std::string_view, 5>{"pp", "rep", "dp", "cp", "tp"}, std::array{1, 1, 16, 1, 1}, hw);
    t.add_dims(std::array<std::string_view, 4>{"pp", "edp", "ep", "tp"}, std::array{1, 1, 16, 1});
    t.add_dims(std::array<std::string_view, 5>{"pp", "edp", "ep_across", "ep_node", "tp"}, std::array{1, 1, 4, 4, 1});
    return t;
  }();
  const auto a2a = [&](K k, const char* g, int n, double b) {
    return sim::collective_seconds(sim_record(k, g, n, b), topo, g);
  };
  const double per_block =
      a2a(K::all_to_all, "ep_across", 4, two.counts) + a2a(K::all_to_all, "ep_node", 4, two.node_counts) +
      a2a(K::all_to_all_v, "ep_across", 4, two.dispatch) + a2a(K::all_to_all_v, "ep_node", 4, two.node_dispatch) +
      2 * (a2a(K::all_to_all_v, "ep_across", 4, two.combine) + a2a(K::all_to_all_v, "ep_node", 4, two.node_combine)) +
      a2a(K::all_to_all_v, "ep_across", 4, two.dispatch_backward) +
      a2a(K::all_to_all_v, "ep_node", 4, two.node_dispatch_backward);
  const auto a = sim::analytic_estimate(m, p, hw);
  CHECK(a.ep_seconds == Approx(p.batch / p.dp / p.microbatch * m.layers * per_block));
  CHECK(topo.placement("ep_node").inside_node());
  CHECK_FALSE(topo.placement("ep_across").inside_node());
  // A node size that does not divide ep, or that leaves a node without experts, is refused.
  p.ep_node_size = 3;
  CHECK_THROWS_WITH(sim::analytic_estimate(m, p, hw), Catch::Contains("ep_node_size 3 must divide ep 16"));

  // The dry run's CommLog (the real MoE on meta over the sim backend) against the formula: a
  // DP 16 plan with EP 16 in nodes of 4, and EP 8 in nodes of 4 under TP 2 + SP.
  struct Case {
    int dp, tp, ep, node;
  };
  const sim::ModelShape wide{.layers = 2,
                             .dim = 1024,
                             .heads = 8,
                             .vocab = 512,
                             .seq = 1024,
                             .experts = 16,
                             .topk = 4,
                             .expert_groups = 4,
                             .topk_groups = 2};
  for (const Case c : {Case{16, 1, 16, 4}, Case{8, 2, 8, 4}}) {
    CAPTURE(c.dp, c.tp, c.ep, c.node);
    models::TrainingPlan plan{
        .model = {.vocab = 512, .seq = 1024, .dim = 1024, .heads = 8, .layers = 2, .mlp_ratio = 4},
        .batch = c.dp,
        .microbatches = 1,
        .dp = c.dp,
        .tp = c.tp};
    plan.moe.router.experts = 16, plan.moe.router.topk = 4;
    plan.moe.router.groups = 4, plan.moe.router.topk_groups = 2;
    plan.moe.node_size = c.node;
    plan.ep = c.ep;
    const auto classes =
        models::dry_run_plan<dtensor::bfloat16, models::MoELayers<dtensor::bfloat16, MetaMesh<"edp", "ep", "tp">>,
                             true>(plan);
    const sim::PlanShape ps{
        .batch = plan.batch, .microbatch = 1, .dp = c.dp, .tp = c.tp, .ep = c.ep, .ep_node_size = c.node};
    const auto bytes = sim::moe_all_to_all_bytes(wide, ps);
    for (const auto& k : classes) {
      CAPTURE(k.report.name);
      std::vector<std::pair<std::string, double>> forward, backward, expected_forward, expected_backward;
      for (const auto& ph : k.report.phases)
        for (const auto& r : ph.collectives)
          if ((ph.name == "forward" || ph.name == "backward") &&
              (r.kind == K::all_to_all || r.kind == K::all_to_all_v) &&
              (r.group == "ep_across" || r.group == "ep_node" || r.group == "ep")) {
            auto& to = ph.name == "forward" ? forward : backward;
            to.emplace_back(detail::cat(name_of(r.kind), " ", r.group), double(r.bytes));
          }
      for (int block = 0; block < 2; ++block) {
        expected_forward.insert(expected_forward.end(), {{"all_to_all ep_across", bytes.counts},
                                                         {"all_to_all_v ep_across", bytes.dispatch},
                                                         {"all_to_all ep_node", bytes.node_counts},
                                                         {"all_to_all_v ep_node", bytes.node_dispatch},
                                                         {"all_to_all_v ep_node", bytes.node_combine},
                                                         {"all_to_all_v ep_across", bytes.combine}});
        expected_backward.insert(expected_backward.end(), {{"all_to_all_v ep_across", bytes.combine},
                                                           {"all_to_all_v ep_node", bytes.node_combine},
                                                           {"all_to_all_v ep_node", bytes.node_dispatch_backward},
                                                           {"all_to_all_v ep_across", bytes.dispatch_backward}});
      }
      CHECK(forward == expected_forward);
      CHECK(backward == expected_backward);
    }
    // The step against the dry run's, as for the one-stage dispatch above (25 %).
    std::vector<sim::ClassInput> inputs;
    for (const auto& k : classes) inputs.push_back({&k.report, k.pipeline_ranks});
    const auto dry =
        sim::estimate_plan(inputs, models::plan_topology(plan, sim::Hardware{}), models::detail::plan_schedule(plan));
    const auto an = sim::analytic_estimate(wide, ps, sim::Hardware{});
    CAPTURE(dry.step_seconds, an.step_seconds, an.ep_seconds);
    CHECK(an.step_seconds == Approx(dry.step_seconds).epsilon(0.25));
  }
}
