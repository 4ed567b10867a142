// tests/parity/gpt_parity.hpp — one GPT training run on any mesh, for the parity tests (threads
// and MPI): the per-step losses and the collectives of each part of a step.
//
// The oracle is the same model trained on one rank with nn::ReplicatedPlan (no tensor
// parallelism, ops::cross_entropy): every distributed run must give its per-step losses within
// 1e-5 relative. Double precision: in float the differently split sums (row-parallel GEMMs,
// all-reduced partial sums) round differently, and through AdamW the runs drift apart (the
// float trainer's losses on different meshes differ by ~4e-5 relative after 50 steps); in
// double the seven meshes stay within ~6e-16 of the one-rank run over the 20 steps.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/parallel/gpt_plan.hpp"

namespace dtensor::testing {

using GptMesh = DeviceMesh<"dp", "tp">;

inline models::GPTConfig parity_config() {
  // vocab 29 splits unevenly over tp = 4 (8, 8, 8, 5); 4 heads split over tp = 2 and 4.
  return {.vocab = 29, .seq = 8, .dim = 32, .heads = 4, .layers = 2, .mlp_ratio = 4, .checkpoint = false, .seed = 7};
}
inline constexpr Extent parity_batch = 4;  // sequences per step (split over dp)
inline constexpr int parity_steps = 20;

/// Collectives counted per (kind, group), e.g. "all_reduce/tp".
using Counts = std::map<std::string, std::size_t>;
inline Counts counts_of(const CommLog& log) {
  Counts c;
  for (const auto& r : log.records()) ++c[std::string(name_of(r.kind)) + "/" + r.group];
  return c;
}
inline std::string to_string(const Counts& c) {
  std::string s;
  for (const auto& [k, n] : c) s += k + " x" + std::to_string(n) + "  ";
  return s;
}

struct ParityRun {
  std::vector<double> losses;  // the global mean loss of each step (before its update)
  Counts model;                // forward + backward of step 1 (without DDP's all-reduces)
  Counts sp_sync, dp_sync, clip;
  std::size_t dp_buckets = 0;
  std::size_t dp_copied_bytes = 0;       // gradient bytes DDP copied (0: every bucket in place)
  bool dp_overlapped = false;            // a DDP all-reduce was issued before the backward ended
};

/// How a parity run drives the model.
struct ParityOptions {
  std::size_t bucket_bytes = 4096;
  bool checkpoint = false;
  bool ddp_overlap = true;  // DDP attached to the backward (else one all_reduce_gradients after it)
  Extent batch = parity_batch;  // sequences per step
  Extent layers = 0;            // 0: parity_config's
  std::optional<models::GPTConfig> config{};  // parity_config() unless given
};

/// The tokens of step s: `batch` sequences of a fixed rule x' = (5 x + 3) mod V from random
/// starts, so there is something to learn; ids and targets [batch, T], whole on every rank.
inline std::pair<Tensor<std::int32_t, 2>, Tensor<std::int32_t, 2>> parity_tokens(int step, const models::GPTConfig& c,
                                                                                 Extent batch = parity_batch) {
  auto starts = randint<std::int32_t>(Shape<1>{batch}, 1000 + std::uint64_t(step), 0, c.vocab);
  Tensor<std::int32_t, 2> ids(Shape<2>{batch, c.seq}), tgt(Shape<2>{batch, c.seq});
  for (Extent b = 0; b < batch; ++b) {
    std::int32_t x = starts[b];
    for (Extent t = 0; t < c.seq; ++t) {
      ids(b, t) = x;
      x = std::int32_t((5 * Extent(x) + 3) % c.vocab);
      tgt(b, t) = x;
    }
  }
  return {std::move(ids), std::move(tgt)};
}

/// The batch of step s (parity_tokens), each rank keeping its piece; `rows` sequences from
/// `first` of it (a micro-batch) when given.
template <class Ids, class MeshT = GptMesh>
std::pair<Ids, Ids> parity_batch_of(const MeshT& mesh, int step, const models::GPTConfig& c,
                                    Extent batch = parity_batch, Extent first = 0, Extent rows = 0) {
  auto [ids, tgt] = parity_tokens(step, c, batch);
  if (rows == 0) rows = batch - first;
  if (first != 0 || rows != batch) {
    ids = ids.slice(0, first, rows);
    tgt = tgt.slice(0, first, rows);
  }
  using L = typename Ids::layout;
  using Space = mesh_space_t<MeshT>;
  return {distribute_replicated<L>(mesh, into_space<Space>(std::move(ids))),
          distribute_replicated<L>(mesh, into_space<Space>(std::move(tgt)))};
}

/// The optimizer every parity run uses (with clipping at norm 1).
inline optim::AdamWOptions parity_adamw() { return {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}; }

/// Trains 20 steps with AdamW (and global-norm clipping, bucketed DDP — overlapped with the
/// backward or after it —, SP gradient sync) on a (dp, tp) mesh over `world` with the given plan;
/// MeshT's memory space is where the model lives (host, or cuda on a CudaMesh).
template <class Plan, class MeshT = GptMesh>
ParityRun run_parity(CommPtr world, std::array<int, 2> shape, ParityOptions o = {}) {
  using Space = mesh_space_t<MeshT>;
  MeshT mesh(world, shape);
  auto cfg = o.config.value_or(parity_config());
  cfg.checkpoint = o.checkpoint;
  if (o.layers > 0) cfg.layers = o.layers;
  models::GPT<double, MeshT, Plan> model(mesh, cfg);
  nn::ParamList<double, 2, Space> ps;
  model.collect(ps);
  optim::AdamW<double, 2, Space> opt(ps, parity_adamw());
  parallel::DataParallel<MeshT> ddp(mesh, {.bucket_bytes = o.bucket_bytes});
  if (o.ddp_overlap) ddp.attach(model);
  ParityRun out;
  for (int s = 0; s < parity_steps; ++s) {
    auto [ids, tgt] = parity_batch_of<typename decltype(model)::Ids, MeshT>(mesh, s, cfg, o.batch);
    opt.zero_grad();
    CommLog model_log;
    auto [loss, saved] = model.forward(ids, tgt);
    model.backward(std::move(saved));
    const std::size_t dp_during_backward = model_log.count(CollectiveKind::all_reduce, "dp");
    CommLog dp_log;
    out.dp_buckets = o.ddp_overlap ? ddp.finish_gradient_sync() : ddp.all_reduce_gradients(ps);
    CommLog sp_log;
    parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = o.bucket_bytes});
    CommLog clip_log;
    optim::clip_grad_norm(ps, mesh, 1.0);
    opt.step();
    if (s == 0) {
      out.model = counts_of(model_log);
      // Each inner log also holds the later ones: subtract what the next recorded.
      out.dp_sync = counts_of(dp_log);
      out.sp_sync = counts_of(sp_log);
      out.clip = counts_of(clip_log);
      for (auto& [k, n] : out.sp_sync) n -= out.clip[k];
      for (auto& [k, n] : out.dp_sync) n -= out.sp_sync[k] + out.clip[k];
      for (auto& [k, n] : out.model) n -= out.dp_sync[k] + out.sp_sync[k] + out.clip[k];
      // DDP's all-reduces issued during the backward belong to the DDP sync.
      out.dp_overlapped = dp_during_backward > 0;
      out.model["all_reduce/dp"] -= dp_during_backward;
      out.dp_sync["all_reduce/dp"] += dp_during_backward;
      for (auto* c : {&out.model, &out.sp_sync, &out.dp_sync, &out.clip})
        std::erase_if(*c, [](const auto& kv) { return kv.second == 0; });
    }
    out.losses.push_back(to_space<host_space>(full_tensor(loss))[0]);
  }
  out.dp_copied_bytes = ddp.copied_bytes();
  return out;
}

/// The one-rank ReplicatedPlan run's losses (the oracle of every parity run), on the threads
/// backend, computed once.
inline const std::vector<double>& parity_reference() {
  static const std::vector<double> ref = [] {
    std::vector<double> l;
    threads::run(1, [&](CommPtr w) { l = run_parity<nn::ReplicatedPlan>(w, {1, 1}).losses; });
    return l;
  }();
  return ref;
}

/// "" or what differs: per-step losses within rtol of the reference.
inline std::string compare_losses(const std::vector<double>& got, const std::vector<double>& ref, double rtol) {
  if (got.size() != ref.size()) return "different number of steps";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i]) || std::abs(got[i] - ref[i]) > rtol * std::abs(ref[i]))
      return "step " + std::to_string(i) + ": loss " + std::to_string(got[i]) + " vs " + std::to_string(ref[i]) +
             " (rel " + std::to_string(std::abs(got[i] - ref[i]) / std::abs(ref[i])) + ")";
  return {};
}

/// The collectives the plan promises for forward + backward (parallel/gpt_plan.hpp).
inline Counts expected_model_counts(bool tp_plan, bool sp, std::size_t layers) {
  Counts c;
  if (!tp_plan) return c;
  const auto e = parallel::megatron_tp_collectives(sp, layers);
  if (e.all_reduce) c["all_reduce/tp"] = e.all_reduce;
  if (e.all_gather) c["all_gather/tp"] = e.all_gather;
  if (e.reduce_scatter) c["reduce_scatter/tp"] = e.reduce_scatter;
  return c;
}

}  // namespace dtensor::testing
