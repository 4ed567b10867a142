// tests/parity/moe_parity.hpp — the MoE GPT (models/moe_gpt.hpp) trained on a dense mesh and its
// expert mesh, for the parity tests (threads and MPI): per-step losses and the expert
// collectives of step 1.
//
// The oracle is the same model on one rank (ep = 1): with a capacity that drops nothing every
// expert size routes the same tokens to the same experts, so the losses (cross-entropy + the
// aux and z losses) must agree within 1e-5 relative over 20 AdamW steps in double.
#pragma once

#include "dtensor/models/moe_gpt.hpp"
#include "dtensor/optim/param_set.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "gpt_parity.hpp"

namespace dtensor::testing {

using ExpertMesh = DeviceMesh<"edp", "ep", "tp">;

/// E experts, top-k, a capacity factor of E / k (capacity = seq: no expert can overflow).
inline models::MoELayersConfig moe_parity_config(Extent experts, Extent topk, Extent every) {
  return {.router = {.experts = experts, .topk = topk, .capacity_factor = double(experts) / double(topk),
                     .aux_loss_coeff = 0.01, .z_loss_coeff = 1e-3},
          .hidden = 48, .every = every};
}

struct MoEParityRun {
  std::vector<double> losses;
  Counts model;           // forward + backward of step 1 (without the gradient syncs)
  std::int64_t dropped = 0;  // choices dropped in step 1, summed over the MoE blocks (this rank)
};

/// Trains 20 steps (AdamW, one clipping norm over both meshes, DDP attached to the model: its
/// gradients on "dp", the experts' on "edp") on a (dp, tp) mesh with `ep` expert ranks; MeshT and EMeshT's memory space is where
/// the model lives (host, or cuda on CudaMeshes). Dense: the blocks the experts live in
/// (models::DenseLayers: the MoE GPT; models::LlamaLayers: the Llama MoE, SwiGLU experts).
template <class Plan, class MeshT = GptMesh, class EMeshT = ExpertMesh, class Dense = models::DenseLayers>
MoEParityRun run_moe_parity(CommPtr world, std::array<int, 2> shape, int ep, const models::MoELayersConfig& mc) {
  using Space = mesh_space_t<MeshT>;
  MeshT mesh(world, shape);
  auto emesh = parallel::make_expert_mesh<EMeshT>(mesh, ep);
  const auto cfg = parity_config();
  using Layers = models::MoELayers<double, EMeshT, Dense>;
  models::GPT<double, MeshT, Plan, std::int32_t, Layers> model(mesh, cfg, Layers(emesh, mc));
  nn::ParamList<double, 2, Space> ps;
  model.collect(ps);
  // Every parameter, dense and expert, as one set (the model's parameter groups: the experts on
  // the mesh their policy declares): one optimizer and one clip over both meshes.
  auto all = nn::parameter_set(model);
  REQUIRE(all.template list<0>().size() == ps.size());
  const optim::AdamWOptions ao{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  auto opt = optim::make_adamw(all, ao);
  parallel::DataParallel<MeshT> ddp(mesh, {.bucket_bytes = 4096});
  ddp.attach(model);  // every parameter group: the experts are all-reduced on "edp" too
  MoEParityRun out;
  for (int s = 0; s < parity_steps; ++s) {
    auto [ids, tgt] = parity_batch_of<typename decltype(model)::Ids, MeshT>(mesh, s, cfg);
    opt.zero_grad();
    Counts step_model;
    {
      CommLog log;
      auto [loss, saved] = model.forward(ids, tgt);
      model.backward(std::move(saved));
      step_model = counts_of(log);
      out.losses.push_back(0);
      ddp.finish_gradient_sync();
      parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = 4096});
      optim::clip_grad_norm(all, 1.0);
      opt.step();
      out.losses.back() = to_space<host_space>(full_tensor(loss))[0];
    }
    if (s == 0) {
      out.model = step_model;
      for (auto& b : model.blocks()) out.dropped += b.inner().mlp().stats().dropped;
    }
  }
  return out;
}

using MoEFsdpMesh = DeviceMesh<"dp", "fsdp", "tp">;

/// A run under a parallel wrapper that takes every parameter group of the model.
struct MoEGroupsRun {
  std::vector<double> losses;
  Counts expert_sync;                  // the step-1 collectives on "edp" (the experts' group)
  Counts dense_sync;                   // and on the dense data dimensions ("dp", "fsdp")
  std::size_t expected_edp_buckets = 0;  // DDP: the buckets of the expert units (their all-reduces on "edp")
  std::size_t expert_units = 0;        // FSDP: the expert group's units
  // FSDP: the elements of the expert units' flat buffers that belong to no piece of this rank
  // (zero gaps): none, since every expert parameter is Shard on "ep" (nn::FlatEntry::slot).
  std::size_t expert_gap = 0;
};

/// The elements of the units' flat buffers outside every entry's piece on this rank.
template <class Units>
std::size_t flat_gap(const Units& units) {
  std::size_t gap = 0;
  for (const auto& u : units) {
    std::size_t pieces = 0;
    for (const auto& e : u.group->entries()) pieces += e.numel;
    gap += u.group->size() - pieces;
  }
  return gap;
}

/// 20 steps of `model` with one AdamW and one clip over `all`, `sync` the wrapper's gradient sync
/// after the backward, `after` its parameter sync after the update; records step 1's collectives
/// on "edp" (the experts' group) and on the dense data dimensions ("dp", "fsdp").
template <class Model, class MeshT, class Set, class Sync, class After>
void train_moe_groups(Model& model, const MeshT& mesh, Set& all, Sync sync, After after, MoEGroupsRun& out) {
  const auto cfg = parity_config();
  auto opt = optim::make_adamw(all, {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  for (int s = 0; s < parity_steps; ++s) {
    auto [ids, tgt] = parity_batch_of<typename Model::Ids, MeshT>(mesh, s, cfg);
    opt.zero_grad();
    CommLog log;
    auto [loss, saved] = model.forward(ids, tgt);
    model.backward(std::move(saved));
    sync();
    optim::clip_grad_norm(all, 1.0);
    opt.step();
    after();
    for (const auto& [k, n] : counts_of(log)) {
      if (s == 0 && k.ends_with("/edp")) out.expert_sync[k] = n;
      if (s == 0 && (k.ends_with("/dp") || k.ends_with("/fsdp"))) out.dense_sync[k] = n;
    }
    out.losses.push_back(to_space<host_space>(full_tensor(loss))[0]);
  }
}

/// The MoE GPT under DataParallel attached to it (both groups: the dense units over "dp", the
/// experts over "edp") on a (dp, tp) mesh.
template <class Plan>
MoEGroupsRun run_moe_ddp_groups(CommPtr world, std::array<int, 2> shape, int ep, const models::MoELayersConfig& mc) {
  GptMesh mesh(world, shape);
  auto emesh = parallel::make_expert_mesh<ExpertMesh>(mesh, ep);
  models::MoEGPT<double, GptMesh, ExpertMesh, Plan> model(mesh, parity_config(),
                                                          models::MoELayers<double, ExpertMesh>(emesh, mc));
  auto all = nn::parameter_set(model);
  parallel::DataParallel<GptMesh> ddp(mesh, {.bucket_bytes = 4096});
  ddp.attach(model);
  MoEGroupsRun out;
  parallel::DataParallel<ExpertMesh> count(emesh, {.bucket_bytes = 4096});
  auto sync = [&] {
    // The expert units' buckets, planned while their gradients are still pending (Partial on "edp").
    if (out.expected_edp_buckets == 0)
      for (auto& u : *std::get<1>(nn::parameter_groups(model)).units) out.expected_edp_buckets += count.num_buckets(u.params);
    ddp.finish_gradient_sync();
  };
  train_moe_groups(model, mesh, all, sync, [] {}, out);
  return out;
}

// Not for nvcc (tests/cuda/test_gpt_cuda.cu includes this header and does not use it): CUDA 13's
// front end emits this template's host copy with unresolved placeholders (__T16...: "not declared"),
// which the host compiler then rejects; g++ and clang compile it.
#ifndef __CUDACC__
/// The MoE GPT under parallel::fully_shard (ZeRO `zero`) on a (dp, fsdp, tp) mesh: the dense
/// units sharded over "fsdp", the experts over their mesh's "edp", one AdamW and one clip over
/// fsdp.params() (both groups' shards).
template <class Plan>
MoEGroupsRun run_moe_fsdp(CommPtr world, std::array<int, 3> shape, int ep, const models::MoELayersConfig& mc,
                          int zero) {
  MoEFsdpMesh mesh(world, shape);
  auto emesh = parallel::make_expert_mesh<ExpertMesh>(mesh, ep);
  models::MoEGPT<double, MoEFsdpMesh, ExpertMesh, Plan> model(mesh, parity_config(),
                                                              models::MoELayers<double, ExpertMesh>(emesh, mc));
  auto fsdp = parallel::fully_shard(model, mesh, {.stage = zero});
  MoEGroupsRun out;
  out.expert_units = fsdp.template group<1>().num_units();
  out.expert_gap = flat_gap(*std::get<1>(nn::parameter_groups(model)).units);
  train_moe_groups(model, mesh, fsdp.params(), [&] { fsdp.finish_gradient_sync(); }, [&] { fsdp.sync_parameters(); }, out);
  return out;
}
#endif  // __CUDACC__

}  // namespace dtensor::testing
