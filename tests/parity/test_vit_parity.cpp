// The ViT classifier (models/vit.hpp: an nn::Sequential of patch embedding, non-causal encoder
// blocks and a pooled head, with no unit or hook code of its own) trained under every
// parallelism that needs no pipeline: DDP (overlapped), ZeRO-1/2/3, HSDP, TP + SP, CP (ring,
// all-gather, Ulysses) and all at once, each against its one-rank run in double, within 1e-12
// per step. Uneven on purpose: 7 patches over cp and SP ranks, a batch of 7 over the data and
// context ranks, 5 classes, ZeRO units that 3 shards do not divide. Exact collectives are
// asserted where the model adds its own: the pooled features' one reduce-scatter on "cp" per
// forward (all-gather back in backward), on top of context attention's.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <optional>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/models/vit.hpp"
#include "dtensor/models/vit_data.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/parallel/context_grads.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "support/on_ranks.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

using Mesh = DeviceMesh<"dp", "fsdp", "cp", "tp">;
constexpr int steps = 6;
constexpr Extent batch = 7;

nn::ViTConfig config(parallel::ContextAttentionOptions ctx = {}) {
  return {.patches = 7, .patch_dim = 10, .classes = 5, .dim = 24, .heads = 6, .layers = 2, .mlp_ratio = 2, .seed = 3,
          .context = ctx};
}

struct Setup {
  std::array<int, 4> shape{1, 1, 1, 1};  // dp, fsdp, cp, tp
  int zero = 0;                          // 0: DDP over "dp"; 1..3: fully_shard over "fsdp" (HSDP with dp > 1)
  parallel::ContextAttentionOptions ctx{.kind = parallel::ContextKind::ring, .load_balanced = false};
};

struct Run {
  std::vector<double> losses;
  std::size_t cp_reduce_scatters = 0, cp_all_gathers = 0;  // of step 1's forward + backward
};

/// Trains `steps` AdamW steps (clipped at norm 1) of the ViT on `s.shape`.
template <class Plan>
Run train(CommPtr world, const Setup& s) {
  Mesh mesh(world, s.shape);
  const auto cfg = config(s.ctx);
  nn::ViT<double, Mesh, Plan> model(mesh, cfg);
  using Model = decltype(model);
  nn::ParamList<double, 4> all;
  nn::collect(model, all);
  std::optional<parallel::DataParallel<Mesh>> ddp;
  std::optional<decltype(parallel::fully_shard(model, mesh))> fsdp;
  if (s.zero == 0) {
    ddp.emplace(mesh, parallel::DataParallelOptions{.bucket_bytes = 2048});
    ddp->attach(model);
  } else {
    fsdp.emplace(parallel::fully_shard(model, mesh, {.stage = s.zero}));
  }
  auto& ps = fsdp ? fsdp->params() : all;
  optim::AdamW<double, 4> opt(ps, {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  Run out;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = nn::synthetic_images<double>(cfg, batch, std::uint64_t(step));
    auto images = distribute_replicated<typename Model::Images::layout>(mesh, x);
    auto labels = distribute_replicated<typename Model::Labels::layout>(mesh, y);
    opt.zero_grad();
    CommLog log;
    auto [loss, saved] = model.forward(images, labels);
    model.backward(std::move(saved));
    if (step == 0) {
      out.cp_reduce_scatters = log.count(CollectiveKind::reduce_scatter, "cp");
      out.cp_all_gathers = log.count(CollectiveKind::all_gather, "cp");
    }
    if (fsdp) fsdp->finish_gradient_sync();
    else ddp->finish_gradient_sync();
    parallel::context_parallel_grads(ps, mesh, {.bucket_bytes = 2048});
    parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = 2048});
    optim::clip_grad_norm(ps, mesh, 1.0);
    opt.step();
    if (fsdp) fsdp->sync_parameters();
    out.losses.push_back(full_tensor(loss)[0]);
  }
  return out;
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
void check(const char* what, const Setup& s, std::size_t cp_collectives = 0) {
  const auto& ref = reference();
  const int n = s.shape[0] * s.shape[1] * s.shape[2] * s.shape[3];
  auto f = on_ranks(n, [&](CommPtr world, auto report) {
    const auto r = train<Plan>(world, s);
    report(compare(r.losses, ref));
    // The pooling's reduce-scatter on "cp" (its adjoint an all-gather), besides attention's.
    if (s.shape[2] > 1 && s.ctx.kind == parallel::ContextKind::ring &&
        (r.cp_reduce_scatters != 1 || r.cp_all_gathers != 1))
      report("on cp: " + std::to_string(r.cp_reduce_scatters) + " reduce-scatters, " + std::to_string(r.cp_all_gathers) +
             " all-gathers; expected 1 and 1 (the pooled features)");
    (void)cp_collectives;
  });
  INFO(what << ": " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

TEST_CASE("ViT parity: the one-rank run learns", "[parity][vit]") {
  const auto& ref = reference();
  REQUIRE(ref.size() == std::size_t(steps));
  CHECK(std::abs(ref[0] - std::log(5.0)) < 0.3);  // starts near chance over 5 classes
  CHECK(ref.back() < ref.front());
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
