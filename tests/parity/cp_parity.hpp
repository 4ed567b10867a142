// tests/parity/cp_parity.hpp — one GPT training run on a (dp, cp, tp) mesh with context
// parallelism, for the parity tests: the per-step losses and the collectives of step 1.
//
// The same run as gpt_parity.hpp's run_parity (parity_config, parity_tokens, AdamW, clipping,
// DDP attached to the backward, the SP gradient sync) with the sequence split on "cp" for the
// whole model: the batch is stored in parallel::load_balanced_order when the attention options
// ask for it, and after the backward parallel::context_parallel_grads all-reduces the
// gradients' Partial<sum> on "cp". The loss is the mean over every position, so the per-step
// losses must equal the one-rank run's.
#pragma once

#include "dtensor/parallel/context_grads.hpp"
#include "gpt_parity.hpp"

namespace dtensor::testing {

using CpMesh = DeviceMesh<"dp", "cp", "tp">;

struct CpParityRun {
  std::vector<double> losses;
  Counts model;    // forward + backward of step 1 (DDP's all-reduces during the backward removed)
  Counts cp_sync;  // context_parallel_grads of step 1
  std::size_t cp_buckets = 0;
};

/// Trains `steps` steps of `cfg` (parity_config() by default) on a (dp, cp, tp) mesh over
/// `world`; Layers: the model's Layers policy (models::LlamaLayers: tests/parity/test_llama_parity.cpp).
template <class Plan, class Layers = models::DenseLayers>
CpParityRun run_cp_parity(CommPtr world, std::array<int, 3> shape, parallel::ContextAttentionOptions attention,
                          std::size_t bucket_bytes = 4096, models::GPTConfig cfg = parity_config(),
                          int steps = parity_steps) {
  CpMesh mesh(world, shape);
  cfg.context = attention;
  using Model = models::GPT<double, CpMesh, Plan, std::int32_t, Layers>;
  Model model(mesh, cfg);
  nn::ParamList<double, 3> ps;
  model.collect(ps);
  optim::AdamW<double, 3> opt(ps, {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  parallel::DataParallel<CpMesh> ddp(mesh, {.bucket_bytes = bucket_bytes});
  ddp.attach(model);
  const int cp = shape[1];
  auto stored = [&](Tensor<std::int32_t, 2> t) {  // the order the sequence is kept in on "cp"
    auto s = attention.load_balanced ? parallel::load_balance(t, 1, cp) : std::move(t);
    return distribute_replicated<typename Model::Ids::layout>(mesh, s);
  };
  CpParityRun out;
  for (int s = 0; s < steps; ++s) {
    auto [ids, tgt] = parity_tokens(s, cfg);
    opt.zero_grad();
    CommLog model_log;
    auto [loss, saved] = model.forward(stored(ids), stored(tgt));
    model.backward(std::move(saved));
    const std::size_t dp_during_backward = model_log.count(CollectiveKind::all_reduce, "dp");
    ddp.finish_gradient_sync();
    CommLog cp_log;
    out.cp_buckets = parallel::context_parallel_grads(ps, mesh, {.bucket_bytes = bucket_bytes});
    if (s == 0) {
      out.model = counts_of(model_log);
      out.cp_sync = counts_of(cp_log);
      // The model log also holds the later ones: subtract what cp_log recorded.
      for (const auto& [k, n] : out.cp_sync) out.model[k] -= n;
      out.model["all_reduce/dp"] -= dp_during_backward;
      std::erase_if(out.model, [](const auto& kv) { return kv.second == 0; });
    }
    parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = bucket_bytes});
    optim::clip_grad_norm(ps, mesh, 1.0);
    opt.step();
    out.losses.push_back(full_tensor(loss)[0]);
  }
  return out;
}

/// The collectives context attention issues on "cp" in forward + backward of `layers` blocks
/// (docs/context-parallel.md's table); the model issues no others there.
inline Counts expected_cp_counts(parallel::ContextKind kind, int cp, std::size_t layers) {
  Counts c;
  if (cp == 1) return c;
  const auto per_layer = [&]() -> Counts {
    switch (kind) {
      case parallel::ContextKind::ring: return {{"send_recv/cp", std::size_t(2 * (cp - 1) + 2 * (cp - 1) + 2 * cp)}};
      case parallel::ContextKind::allgather: return {{"all_gather/cp", 4}, {"reduce_scatter/cp", 2}};
      case parallel::ContextKind::ulysses: return {{"all_to_all/cp", 8}};
    }
    return {};
  }();
  for (const auto& [k, n] : per_layer) c[k] = n * layers;
  return c;
}

}  // namespace dtensor::testing
