// The ViT classifier (models/vit.hpp: its parts — patch embedding, non-causal encoder blocks, a
// pooled head — run by nn::Stack, with no unit, hook or stage code of its own) trained under
// DDP (overlapped), ZeRO-1/2/3, HSDP, TP + SP, CP (ring, all-gather, Ulysses) and all at once,
// each against its one-rank run in double, within 1e-12 per step; then cut into pipeline stages
// under every schedule, with MoE experts over "ep", and all of it at once (below). Uneven on
// purpose: 7 patches over cp and SP ranks, a batch of 7 over the data and context ranks, 5 classes, ZeRO units that 3 shards do not divide. Exact collectives are
// asserted where the model adds its own: the pooled features' one reduce-scatter on "cp" per
// forward (all-gather back in backward), on top of context attention's.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "cp_parity.hpp"  // expected_cp_counts, Counts
#include "dtensor/comm/comm_log.hpp"
#include "dtensor/models/moe_gpt.hpp"        // models::MoELayers: the blocks' MoE policy the ViT shares with the GPT
#include "dtensor/models/training_plan.hpp"  // models::phase_observer: the dry run's phases
#include "dtensor/models/vit.hpp"
#include "dtensor/models/vit_data.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/optim/param_set.hpp"
#include "dtensor/parallel/context_grads.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "dtensor/sim/dry_run.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the parity test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_vit_parity {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

using DdpMesh = DeviceMesh<"dp", "cp", "tp">;           // DDP over "dp" (a size-1 "fsdp" would leave its Partial)
using FsdpMesh = DeviceMesh<"dp", "fsdp", "cp", "tp">;  // fully_shard over "fsdp*cp", HSDP's replicas over "dp"
constexpr int steps = 6;
constexpr Extent batch = 7;

models::ViTConfig config(parallel::ContextAttentionOptions ctx = {}) {
  return {.patches = 7, .patch_dim = 10, .classes = 5, .dim = 24, .heads = 6, .layers = 2, .mlp_ratio = 2, .seed = 3,
          .context = ctx};
}

struct Setup {
  std::array<int, 4> shape{1, 1, 1, 1};  // dp, fsdp, cp, tp
  int zero = 0;                          // 0: DDP over "dp" (fsdp 1); 1..3: fully_shard over "fsdp" (HSDP with dp > 1)
  parallel::ContextAttentionOptions ctx{.kind = parallel::ContextKind::ring, .load_balanced = false};
};

struct Run {
  std::vector<double> losses;
  Counts on_cp;  // step 1's forward + backward on the groups that hold "cp", by kind/group
};

/// Trains `steps` AdamW steps (clipped at norm 1) of the ViT on `s.shape`.
template <class Plan, class Mesh>
Run train_on(const Setup& s, const Mesh& mesh) {
  const auto cfg = config(s.ctx);
  models::ViT<double, Mesh, Plan> model(mesh, cfg);
  using Model = decltype(model);
  // One step loop for both: ps are the optimizer's parameters, finish the gradient sync of the
  // data dimensions, after_step ZeRO-1/2's all-gather.
  auto loop = [&](nn::ParamList<double, Mesh::ndim>& ps, auto finish, auto after_step) {
    optim::AdamW<double, Mesh::ndim> opt(ps, {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
    Run out;
    for (int step = 0; step < steps; ++step) {
      auto [x, y] = models::synthetic_images<double>(cfg, batch, std::uint64_t(step));
      auto images = distribute_replicated<typename Model::Images::layout>(mesh, x);
      auto labels = distribute_replicated<typename Model::Labels::layout>(mesh, y);
      opt.zero_grad();
      CommLog log;
      auto [loss, saved] = model.forward(images, labels);
      model.backward(std::move(saved));
      if (step == 0)
        for (const auto& [k, n] : counts_of(log))
          // (Not FSDP's all-gathers: under CP it shards over the flattened "fsdp*cp" group.)
          if (k.find("cp") != std::string::npos && k.find("fsdp") == std::string::npos) out.on_cp[k] = n;
      finish();
      parallel::context_parallel_grads(ps, mesh, {.bucket_bytes = 2048});
      parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = 2048});
      optim::clip_grad_norm(ps, mesh, 1.0);
      opt.step();
      after_step();
      out.losses.push_back(full_tensor(loss)[0]);
    }
    return out;
  };
  if constexpr (Mesh::ndim == 3) {
    nn::ParamList<double, 3> ps;
    nn::collect(model, ps);
    parallel::DataParallel<Mesh> ddp(mesh, {.bucket_bytes = 2048});
    ddp.attach(model);
    return loop(ps, [&] { ddp.finish_gradient_sync(); }, [] {});
  } else {
    auto fsdp = parallel::fully_shard(model, mesh, {.stage = s.zero});
    return loop(fsdp.params(), [&] { fsdp.finish_gradient_sync(); }, [&] { fsdp.sync_parameters(); });
  }
}

template <class Plan>
Run train(CommPtr world, const Setup& s) {
  if (s.zero == 0) return train_on<Plan>(s, DdpMesh(world, {s.shape[0], s.shape[2], s.shape[3]}));
  return train_on<Plan>(s, FsdpMesh(world, s.shape));
}

const std::vector<double>& reference() {
  static const std::vector<double> ref = [] {
    std::vector<double> l;
    threads::run(1, [&](CommPtr w) { l = train<nn::ReplicatedPlan>(w, {}).losses; });
    return l;
  }();
  return ref;
}

std::string compare(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return "different number of steps";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - ref[i]) <= 1e-12 * std::max(1.0, std::abs(ref[i]))))
      return "step " + std::to_string(i) + ": loss " + std::to_string(got[i]) + " vs " + std::to_string(ref[i]) +
             " (diff " + std::to_string(std::abs(got[i] - ref[i])) + ")";
  return {};
}

template <class Plan>
void check(const char* what, const Setup& s) {
  const auto& ref = reference();
  const int n = s.shape[0] * s.shape[1] * s.shape[2] * s.shape[3];
  auto f = on_ranks(n, [&](CommPtr world, auto report) {
    const auto r = train<Plan>(world, s);
    report(compare(r.losses, ref));
    // The pooling's reduce-scatter on "cp" (its adjoint an all-gather), besides attention's.
    if (s.shape[2] > 1) {
      // Attention's collectives on "cp" (cp_parity.hpp's table), and the pooling's: one reduction
      // of the pooled features (over "cp", or "cp*tp" under SP) forward, its all-gather backward.
      auto rest = r.on_cp;
      for (const auto& [k, n] : expected_cp_counts(s.ctx.kind, s.shape[2], 2)) rest[k] -= n;
      rest["all_gather/cp"] -= 1;
      std::size_t reductions = 0;
      for (auto& [k, n] : rest)
        if (k.starts_with("reduce_scatter/") || k.starts_with("all_reduce/")) reductions += n, n = 0;
      std::erase_if(rest, [](const auto& kv) { return kv.second == 0; });
      if (reductions != 1 || !rest.empty())
        report("collectives on cp " + to_string(r.on_cp) + ": expected attention's " +
               to_string(expected_cp_counts(s.ctx.kind, s.shape[2], 2)) + " + one reduction + all_gather/cp x1");
    }
  });
  INFO(what << ": " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

// The oracle itself is a model that learns: on one rank, 30 AdamW steps of 16 images take the
// loss of a held-out batch from chance (log 5) well down.
TEST_CASE("ViT learns the synthetic task on one rank", "[parity][vit]") {
  double before = 0, after = 0;
  threads::run(1, [&](CommPtr w) {
    DdpMesh mesh(w, {1, 1, 1});
    const auto cfg = config();
    models::ViT<double, DdpMesh> model(mesh, cfg);
    using Model = decltype(model);
    nn::ParamList<double, 3> ps;
    nn::collect(model, ps);
    optim::AdamW<double, 3> opt(ps, {.lr = 1e-2});
    parallel::DataParallel<DdpMesh> ddp(mesh);  // one rank: it marks the gradients reduced, at no cost
    ddp.attach(model);
    auto batch_of = [&](Extent n, std::uint64_t seed) {
      auto [x, y] = models::synthetic_images<double>(cfg, n, seed);
      return std::pair{distribute_replicated<typename Model::Images::layout>(mesh, x),
                       distribute_replicated<typename Model::Labels::layout>(mesh, y)};
    };
    const auto val = batch_of(64, 999);
    before = full_tensor(model.evaluate(val.first, val.second))[0];
    for (int step = 0; step < 30; ++step) {
      const auto [x, y] = batch_of(16, std::uint64_t(step));
      opt.zero_grad();
      auto [loss, saved] = model.forward(x, y);
      model.backward(std::move(saved));
      ddp.finish_gradient_sync();
      parallel::context_parallel_grads(ps, mesh);
      parallel::sequence_parallel_grads(ps, mesh);
      opt.step();
    }
    after = full_tensor(model.evaluate(val.first, val.second))[0];
  });
  INFO("held-out loss " << before << " -> " << after);
  CHECK(std::abs(before - std::log(5.0)) < 0.2);
  CHECK(after < 0.7 * before);
}

TEST_CASE("ViT parity: DDP (3 replicas, overlapped) and ZeRO-1/2/3 (3 shards)", "[parity][vit]") {
  check<nn::ReplicatedPlan>("DDP dp 3", {.shape = {3, 1, 1, 1}});
  for (int zero : {1, 2, 3}) check<nn::ReplicatedPlan>("ZeRO fsdp 3", {.shape = {1, 3, 1, 1}, .zero = zero});
}

TEST_CASE("ViT parity: HSDP (dp 2 x fsdp 2, ZeRO-3)", "[parity][vit]") {
  check<nn::ReplicatedPlan>("HSDP", {.shape = {2, 2, 1, 1}, .zero = 3});
}

TEST_CASE("ViT parity: TP 2 + SP, and TP 2 without SP", "[parity][vit]") {
  check<parallel::MegatronPlan<true>>("TP+SP", {.shape = {1, 1, 1, 2}});
  check<parallel::MegatronPlan<false>>("TP", {.shape = {1, 1, 1, 2}});
}

TEST_CASE("ViT parity: CP 2, ring, all-gather and Ulysses", "[parity][vit]") {
  for (auto kind : {parallel::ContextKind::ring, parallel::ContextKind::allgather, parallel::ContextKind::ulysses})
    check<nn::ReplicatedPlan>(parallel::name_of(kind).data(),
                              {.shape = {1, 1, 2, 1}, .ctx = {.kind = kind, .load_balanced = false}});
}

TEST_CASE("ViT parity: all at once, dp 2 x fsdp 2 (ZeRO-3) x cp 2 (ring) x tp 2 + SP", "[parity][vit]") {
  check<parallel::MegatronPlan<true>>("all", {.shape = {2, 2, 2, 2}, .zero = 3});
}

// ---------------------------------------------------------------- pipeline stages and experts
//
// The ViT cut into pipeline stages by pipeline::split (models::ViTParts: patch embedding, encoder
// blocks, pooled head, classification loss), each stage FSDP-sharded inside
// pipeline::ShardedPipeline, under every schedule; and with models::MoELayers (every other block a
// mixture of 4 experts, top-2, dropless) expert-parallel over an "ep" dimension. The oracle is the
// whole model on one rank (models::ViT, no pipeline code), with one AdamW and one clip over every
// parameter, dense and expert. Uneven: 5 blocks over 2 or 4 stages (3/2, 2/1/1/1), micro-batches
// of 3 or 6 images over 2 or 4 data ranks, 7 patches over cp and SP ranks, 5 classes.

namespace {

namespace pp = dtensor::parallel::pipeline;
using PipeMesh = DeviceMesh<"pp", "dp", "fsdp", "cp", "tp">;
using StageM = DeviceMesh<"dp", "fsdp", "cp", "tp">;
using EMesh = DeviceMesh<"edp", "ep", "tp">;
constexpr Extent pipe_batch = 12;

models::ViTConfig pipe_config(parallel::ContextAttentionOptions ctx = {}) {
  auto c = config(ctx);
  c.layers = 5;
  return c;
}
models::MoELayersConfig vit_moe() {  // a capacity factor of experts / topk: no expert can overflow
  return {.router = {.experts = 4, .topk = 2, .capacity_factor = 2.0, .aux_loss_coeff = 0.01, .z_loss_coeff = 1e-3},
          .hidden = 16, .every = 2};
}
template <bool MoE>
using LayersOf = std::conditional_t<MoE, models::MoELayers<double, EMesh>, models::DenseLayers>;
template <bool MoE, class DenseMesh>
LayersOf<MoE> layers_on(const DenseMesh& mesh, int ep) {
  if constexpr (MoE) return LayersOf<MoE>(parallel::make_expert_mesh<EMesh>(mesh, ep), vit_moe());
  else return {};
}
const optim::AdamWOptions pipe_adamw{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

/// The oracle: the whole ViT (dense or MoE) on one rank, the batch in one piece.
template <bool MoE>
const std::vector<double>& whole_reference() {
  static const std::vector<double> ref = [] {
    std::vector<double> losses;
    threads::run(1, [&](CommPtr w) {
      DdpMesh mesh(w, {1, 1, 1});
      const auto cfg = pipe_config();
      models::ViT<double, DdpMesh, nn::ReplicatedPlan, LayersOf<MoE>> model(mesh, cfg, layers_on<MoE>(mesh, 1));
      using Model = decltype(model);
      nn::ParamList<double, 3> dense;
      nn::collect_on<DdpMesh>(model, dense);
      parallel::DataParallel<DdpMesh> ddp(mesh);  // one rank: marks the gradients reduced (MoE: the experts' too)
      ddp.attach(model);
      auto run = [&](auto all) {
        auto opt = optim::make_adamw(all, pipe_adamw);
        for (int step = 0; step < steps; ++step) {
          auto [x, y] = models::synthetic_images<double>(cfg, pipe_batch, std::uint64_t(step));
          opt.zero_grad();
          auto [loss, saved] = model.forward(distribute_replicated<typename Model::Images::layout>(mesh, x),
                                             distribute_replicated<typename Model::Labels::layout>(mesh, y));
          model.backward(std::move(saved));
          ddp.finish_gradient_sync();
          parallel::context_parallel_grads(dense, mesh);  // one rank: marks them reduced
          optim::clip_grad_norm(all, 1.0);
          opt.step();
          losses.push_back(full_tensor(loss)[0]);
        }
      };
      if constexpr (MoE) run(nn::parameter_set(model));
      else run(nn::param_set(nn::on(mesh, dense)));
    });
    return losses;
  }();
  return ref;
}

struct PipeSetup {
  std::array<int, 5> shape{2, 1, 1, 1, 1};  // pp, dp, fsdp, cp, tp
  int ep = 1;                               // MoE runs: expert ranks over dp x fsdp x cp
  int zero = 3;
  std::string schedule = "1f1b";
  int microbatches = 4;
  parallel::ContextKind kind = parallel::ContextKind::ring;
};

/// The per-step losses of the pipelined (and sharded, and expert-parallel) ViT, on every rank.
template <class Plan, bool MoE>
std::vector<double> train_pipeline(CommPtr world, const PipeSetup& s) {
  PipeMesh mesh(world, s.shape);
  const StageM stage_mesh = pp::stage_mesh_of(mesh);
  const auto cfg = pipe_config({.kind = s.kind, .load_balanced = false});
  using Parts = models::ViTParts<double, StageM, Plan, LayersOf<MoE>>;
  using Stage = pp::Stage<Parts>;
  auto schedule = pp::make_schedule(pp::parse_schedule_kind(s.schedule), s.shape[0], s.microbatches);
  pp::ShardedPipeline<Stage, PipeMesh> run(
      mesh, schedule, pp::split(Parts(stage_mesh, cfg, layers_on<MoE>(stage_mesh, s.ep)), schedule.layout, mesh.coordinate(0)),
      {.stage = s.zero}, 2048);
  auto opt = optim::make_adamw(run.params(), pipe_adamw);  // every parameter: the shards and (MoE) the experts
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = models::synthetic_images<double>(cfg, pipe_batch, std::uint64_t(step));
    run.zero_grad();
    auto stats = run.step(pp::split_microbatches<typename Stage::Input, typename Stage::Target>(stage_mesh, x, y, s.microbatches));
    run.clip_grad_norm(1.0);
    opt.step();
    run.sync_parameters();
    double loss = stats.loss.value_or(-std::numeric_limits<double>::infinity());  // on the last stage's ranks
    mesh.group(0).all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
    losses.push_back(loss);
  }
  return losses;
}

template <class Plan, bool MoE = false>
void check_pipeline(const char* what, const PipeSetup& s) {
  const auto& ref = whole_reference<MoE>();
  const int n = s.shape[0] * s.shape[1] * s.shape[2] * s.shape[3] * s.shape[4];
  auto f = on_ranks(n, [&](CommPtr world, auto report) { report(compare(train_pipeline<Plan, MoE>(world, s), ref)); });
  INFO(what << " (" << s.schedule << " x " << s.microbatches << "): " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

TEST_CASE("ViT pipeline: every schedule (GPipe, 1F1B, interleaved, ZB-H1, ZB-V, DualPipeV) over 2 ranks",
          "[parity][vit][pipeline]") {
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb", "zbv", "dualpipev"})
    check_pipeline<nn::ReplicatedPlan>("pp 2", {.schedule = schedule});
}

TEST_CASE("ViT pipeline x FSDP x TP + SP x CP", "[parity][vit][pipeline]") {
  check_pipeline<parallel::MegatronPlan<true>>("pp 2 x dp 2 x tp 2 + SP, 1F1B", {.shape = {2, 2, 1, 1, 2}, .zero = 1});
  check_pipeline<nn::ReplicatedPlan>("pp 2 x fsdp 2 (ZeRO-3) x cp 2 (Ulysses), ZB-V",
                                     {.shape = {2, 1, 2, 2, 1}, .schedule = "zbv", .microbatches = 2,
                                      .kind = parallel::ContextKind::ulysses});
}

TEST_CASE("ViT with experts: EP 2 over dp 2, and EP x PP x TP + SP", "[parity][vit][moe]") {
  check_pipeline<nn::ReplicatedPlan, true>("dp 2 x ep 2", {.shape = {1, 2, 1, 1, 1}, .ep = 2, .zero = 1, .microbatches = 1});
  check_pipeline<parallel::MegatronPlan<true>, true>("pp 2 x fsdp 2 x tp 2 + SP x ep 2",
                                                     {.shape = {2, 1, 2, 1, 2}, .ep = 2, .schedule = "gpipe", .microbatches = 2});
}

TEST_CASE("ViT all at once: pp 2 x dp 2 x fsdp 2 (ZeRO-3) x cp 2 (ring) x tp 2 + SP x ep 4", "[parity][vit][moe][pipeline]") {
  check_pipeline<parallel::MegatronPlan<true>, true>("all", {.shape = {2, 2, 2, 2, 2}, .ep = 4, .microbatches = 2});
}

// The dry run (sim/dry_run.hpp): a ViT-B/16-sized model (196 patches, dim 768, 12 heads, 12
// layers, 1000 classes) on meta tensors over a 512-rank mesh dp 4 x fsdp 8 x cp 4 x tp 4 + SP,
// ZeRO-3, once for rank 0's class: the step runs with no data, the model has ViT-B/16's 86.6M
// parameters, rank 0 keeps exactly its chunk of each unit, and on "cp" the pooled features cost
// exactly one reduction forward and one all-gather backward besides ring attention's send/recv.
TEST_CASE("ViT dry run on meta: ViT-B/16 on 512 ranks, ZeRO-3 x CP x TP + SP", "[vit][sim]") {
  using MetaM = MetaMesh<"dp", "fsdp", "cp", "tp">;
  const std::array<int, 4> shape{4, 8, 4, 4};
  const models::ViTConfig cfg{.patches = 196,
                              .patch_dim = 768,
                              .classes = 1000,
                              .dim = 768,
                              .heads = 12,
                              .layers = 12,
                              .context = {.kind = parallel::ContextKind::ring, .load_balanced = false}};
  const Extent images = 256;
  std::int64_t full_params = 0, shard_bytes = 0, master_bytes = 0;
  const auto reports = sim::dry_run<4>(shape, {sim::RankClass<4>{{0, 0, 0, 0}, 1}}, [&](CommPtr world, sim::Recorder& rec) {
    MetaM mesh(world, shape);
    rec.phase("parameters");
    std::optional<models::ViT<float, MetaM, parallel::MegatronPlan<true>>> model;
    {
      MemoryTagScope tag(MemoryTag::parameters);
      model.emplace(mesh, cfg);
    }
    for (auto& u : model->units())
      for (const auto& e : u.group->entries()) {
        std::int64_t n = 1;
        for (Extent x : e.global_shape) n *= std::int64_t(x);
        full_params += n;
      }
    // FSDP shards over fsdp x cp (parallel/fsdp/group.hpp FsdpShardDims): rank 0's chunk.
    const std::int64_t shards = shape[1] * shape[2];
    for (auto& u : model->units()) shard_bytes += (std::int64_t(u.group->size()) + shards - 1) / shards * 4;
    auto fsdp = parallel::fully_shard(*model, mesh, {.stage = 3});
    master_bytes = std::int64_t(fsdp.memory().master);
    optim::AdamW<float, 4, meta_space> opt(fsdp.params(), {});
    using M = std::remove_cvref_t<decltype(*model)>;
    auto x = distribute_replicated<typename M::Images::layout>(mesh, Tensor<float, 3, meta_space>(Shape<3>{images, 196, 768}));
    auto y = distribute_replicated<typename M::Labels::layout>(mesh, Tensor<std::int32_t, 1, meta_space>(Shape<1>{images}));
    rec.phase("forward");
    auto [loss, saved] = [&] {
      MemoryTagScope tag(MemoryTag::activations);
      return model->forward(x, y);
    }();
    rec.phase("backward");
    {
      MemoryTagScope tag(MemoryTag::activations);
      model->backward(std::move(saved));
    }
    rec.phase("optimizer");
    fsdp.finish_gradient_sync();
    parallel::context_parallel_grads(fsdp.params(), mesh);
    parallel::sequence_parallel_grads(fsdp.params(), mesh);
    optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
    opt.step();
  });
  REQUIRE(reports.size() == 1);
  const auto& r = reports[0];
  auto count = [&](const char* phase, CollectiveKind kind, const char* group) {
    std::size_t n = 0;
    for (const auto& ph : r.phases)
      if (ph.name == phase)
        for (const auto& c : ph.collectives) n += c.kind == kind && c.group == group ? 1 : 0;
    return n;
  };
  // 86.6M parameters, the ViT-B/16's (with a 1000-class head), whatever the mesh.
  CHECK(full_params == 768 * 768 + 768 + 196 * 768 + 12 * (12 * 768 * 768 + 13 * 768) + 2 * 768 + 768 * 1000 + 1000);
  // One reduction of the pooled features on "cp" (with "tp" under SP: one collective over "cp*tp")
  // forward, its all-gather back in backward; the rest on "cp" is ring attention's send/recv.
  CHECK(count("forward", CollectiveKind::reduce_scatter, "cp*tp") + count("forward", CollectiveKind::all_reduce, "cp*tp") +
            count("forward", CollectiveKind::reduce_scatter, "cp") == 1);
  CHECK(count("backward", CollectiveKind::all_gather, "cp") == 1);
  CHECK(count("forward", CollectiveKind::send_recv, "cp") == 12 * 2 * (4 - 1));  // ring: 2 (cp - 1) per block
  // ZeRO-3 keeps rank 0 the first chunk (torch.chunk: ceil) over fsdp x cp of each unit's tensor-parallel piece, in fp32.
  CHECK(master_bytes == shard_bytes);
}

// The dry run of the pipelined MoE ViT on meta: ViT-B/16 with every other block a mixture of 8
// experts (top-2), 4 pipeline stages of 3 blocks x fsdp 8 (ZeRO-3) x cp 2 (ring) x tp 4 + SP,
// the experts over ep 8 (edp 2): 256 ranks, run once for the first and once for the last pipeline
// rank (the pipeline's executor over one micro-batch through this rank's stages, the
// neighbours' activations received on the sim communicator). Each holds exactly its stage's
// units (embed or head, its 3 blocks) and the expert units of its MoE blocks (h.1 on the first;
// h.9 and h.11 on the last), of each expert unit its one expert of 8; the experts' all-to-alls
// on "ep" scale with the MoE blocks a stage holds (1 : 2).
TEST_CASE("ViT dry run on meta: MoE ViT-B/16, pp 4 x fsdp 8 x cp 2 x tp 4 + SP x ep 8 (256 ranks)", "[vit][sim][pipeline][moe]") {
  using Mesh5 = MetaMesh<"pp", "dp", "fsdp", "cp", "tp">;
  using MStage = MetaMesh<"dp", "fsdp", "cp", "tp">;
  using MExperts = MetaMesh<"edp", "ep", "tp">;
  using Layers = models::MoELayers<float, MExperts>;
  using Parts = models::ViTParts<float, MStage, parallel::MegatronPlan<true>, Layers>;
  using Stage = pp::Stage<Parts>;
  const std::array<int, 5> shape{4, 1, 8, 2, 4};
  const models::ViTConfig cfg{.patches = 196,
                              .patch_dim = 768,
                              .classes = 1000,
                              .dim = 768,
                              .heads = 12,
                              .layers = 12,
                              .context = {.kind = parallel::ContextKind::ring, .load_balanced = false}};
  models::MoELayersConfig mc;
  mc.router.experts = 8, mc.router.topk = 2, mc.every = 2;
  const Extent images = 64;
  struct Seen {
    std::vector<std::string> units, expert_units;
    std::int64_t expert_global = 0, expert_local = 0;
  };
  std::vector<Seen> seen;
  const auto reports = sim::dry_run<5>(
      shape, {sim::RankClass<5>{{0, 0, 0, 0, 0}, 64}, sim::RankClass<5>{{3, 0, 0, 0, 0}, 64}},
      [&](CommPtr world, sim::Recorder& rec) {
        Mesh5 mesh(world, shape);
        const MStage stage_mesh = pp::stage_mesh_of(mesh);
        auto schedule = pp::make_schedule(pp::ScheduleKind::one_f_one_b, 4, 1);
        rec.phase("parameters");
        std::vector<Stage> stages;
        {
          MemoryTagScope tag(MemoryTag::parameters);
          stages = pp::split(Parts(stage_mesh, cfg, Layers(parallel::make_expert_mesh<MExperts>(stage_mesh, 8), mc)),
                             schedule.layout, mesh.coordinate(0));
        }
        Seen s;
        for (auto& u : stages.front().units()) s.units.push_back(u.group->name());
        for (auto& u : *std::get<1>(nn::parameter_groups(stages.front())).units) {
          s.expert_units.push_back(u.group->name());
          for (const auto& e : u.group->entries()) {
            std::int64_t n = 1;
            for (Extent x : e.global_shape) n *= std::int64_t(x);
            s.expert_global += n;
          }
          s.expert_local += std::int64_t(u.group->size());
        }
        seen.push_back(s);
        pp::ShardedPipeline<Stage, Mesh5> run(mesh, schedule, std::move(stages), {.stage = 3});
        auto opt = optim::make_adamw(run.params(), {});
        run.zero_grad();
        auto x = distribute_replicated<typename Stage::Input::layout>(
            stage_mesh, Tensor<float, 3, meta_space>(Shape<3>{images, 196, 768}));
        auto y = distribute_replicated<typename Stage::Target::layout>(stage_mesh,
                                                                       Tensor<std::int32_t, 1, meta_space>(Shape<1>{images}));
        // The pipeline's own executor over the one micro-batch (FSDP's hooks around each stage),
        // the report's phases marked as it goes (models::phase_observer drives nothing).
        typename pp::Executor<Stage, Mesh5>::Microbatches batch;
        batch.emplace_back(std::move(x), std::move(y));
        run.executor().step(batch, models::phase_observer(rec, false).before_action);
        rec.phase("optimizer");
        run.finish_gradient_syncs();
        run.clip_grad_norm(1.0);
        opt.step();
        run.sync_parameters();
      });
  REQUIRE(reports.size() == 2);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].units == std::vector<std::string>{"embed", "h.0", "h.1", "h.2"});
  CHECK(seen[1].units == std::vector<std::string>{"h.9", "h.10", "h.11", "head"});
  CHECK(seen[0].expert_units == std::vector<std::string>{"h.1.experts"});
  CHECK(seen[1].expert_units == std::vector<std::string>{"h.9.experts", "h.11.experts"});
  // 1 / ep of each expert unit: 1 of its 8 experts (not split on "tp": every tensor rank runs the MoE alike).
  for (const auto& s : seen) CHECK(s.expert_local * 8 == s.expert_global);
  auto all_to_alls = [](const sim::RankReport& r) {
    std::size_t n = 0;
    for (const auto& ph : r.phases)
      for (const auto& c : ph.collectives) n += c.kind == CollectiveKind::all_to_all && c.group.find("ep") != std::string::npos;
    return n;
  };
  INFO("all-to-alls on ep: first " << all_to_alls(reports[0]) << ", last " << all_to_alls(reports[1]));
  CHECK(all_to_alls(reports[0]) > 0);
  CHECK(2 * all_to_alls(reports[0]) == all_to_alls(reports[1]));
}

}  // namespace test_vit_parity
