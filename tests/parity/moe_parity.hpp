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
#include "gpt_parity.hpp"

namespace dtensor::testing {

using ExpertMesh = DeviceMesh<"edp", "ep", "tp">;

/// E experts, top-k, a capacity factor of E / k (capacity = seq: no expert can overflow).
inline nn::MoELayersConfig moe_parity_config(Extent experts, Extent topk, Extent every) {
  return {.router = {.experts = experts, .topk = topk, .capacity_factor = double(experts) / double(topk),
                     .aux_loss_coeff = 0.01, .z_loss_coeff = 1e-3},
          .hidden = 48, .every = every};
}

struct MoEParityRun {
  std::vector<double> losses;
  Counts model;           // forward + backward of step 1 (without the gradient syncs)
  std::int64_t dropped = 0;  // choices dropped in step 1, summed over the MoE blocks (this rank)
};

/// Trains 20 steps (AdamW, one clipping norm over both meshes, DDP on "dp", the experts' sync
/// on "edp") on a (dp, tp) mesh with `ep` expert ranks; MeshT and EMeshT's memory space is where
/// the model lives (host, or cuda on CudaMeshes).
template <class Plan, class MeshT = GptMesh, class EMeshT = ExpertMesh>
MoEParityRun run_moe_parity(CommPtr world, std::array<int, 2> shape, int ep, const nn::MoELayersConfig& mc) {
  using Space = mesh_space_t<MeshT>;
  MeshT mesh(world, shape);
  auto emesh = parallel::make_expert_mesh<EMeshT>(mesh, ep);
  const auto cfg = parity_config();
  nn::MoEGPT<double, MeshT, EMeshT, Plan> model(mesh, cfg, nn::MoELayers<double, EMeshT>(emesh, mc));
  nn::ParamList<double, 2, Space> ps;
  model.collect(ps);
  // Every parameter, dense and expert, as one set (the model's parameter groups: the experts on
  // the mesh their policy declares): one optimizer and one clip over both meshes.
  auto all = nn::parameter_set(model);
  REQUIRE(all.template list<0>().size() == ps.size());
  const optim::AdamWOptions ao{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  auto opt = optim::make_adamw(all, ao);
  parallel::DataParallel<MeshT> ddp(mesh, {.bucket_bytes = 4096});
  parallel::DataParallel<EMeshT> expert_ddp(emesh, {.bucket_bytes = 4096});
  ddp.attach(model);
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
      expert_ddp.all_reduce_gradients(all.template list<1>());
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

}  // namespace dtensor::testing
