// The GPT parity suite with the model on the GPU: models::GPT on a CudaMesh (every parameter,
// activation, gradient and optimizer state in cuda_space, the kernels cuBLAS and kernels/cuda),
// the ranks as threads sharing one GPU (cuda_threads), trained 20 steps with AdamW, clipping,
// DDP and the sequence-parallel sync — the same driver as the host parity tests
// (tests/parity/gpt_parity.hpp) — and compared with the one-rank host run. Double precision:
// cuBLAS and the CUDA kernels sum in other orders than OpenBLAS and the host loops, so the runs
// agree to rounding (1e-9 relative), not bit for bit. And the MoE GPT (routing on the host, rows,
// experts and the count exchange on the GPU) under EP 2 x TP 2 against its one-rank host run; and
// ZeRO-3 with the optimizer's states offloaded to the host.
#include <catch2/catch.hpp>

#include "dtensor/comm/cuda_threads.cuh"
#include "dtensor/mesh/cuda_mesh.cuh"
#include "dtensor/parallel/fully_shard.hpp"
#include "parity/gpt_parity.hpp"
#include "parity/moe_parity.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

using CudaGptMesh = CudaMesh<"dp", "tp">;
constexpr double cuda_rtol = 1e-9;

template <class Plan>
ParityRun run_on_gpu(std::array<int, 2> shape) {
  ParityRun out;
  cuda_threads::run(shape[0] * shape[1], [&](CommPtr world) {
    auto r = run_parity<Plan, CudaGptMesh>(world, shape);
    if (world->rank() == 0) out = std::move(r);
  });
  return out;
}

/// The MoE GPT on CudaMeshes: the dense mesh's and the expert mesh's, chosen here (see docs/gpu.md,
/// "nvcc 13 and mesh types").
template <class Plan>
MoEParityRun run_moe_on_gpu(std::array<int, 2> shape, int ep, const models::MoELayersConfig& mc) {
  MoEParityRun out;
  cuda_threads::run(shape[0] * shape[1], [&](CommPtr world) {
    auto r = run_moe_parity<Plan, CudaGptMesh, CudaMesh<"edp", "ep", "tp">>(world, shape, ep, mc);
    if (world->rank() == 0) out = std::move(r);
  });
  return out;
}

/// ZeRO-3 with CPU offload: the GPT on the GPU (fsdp ranks as cuda_threads), the master values,
/// gradient shards and AdamW state on the host (fully_shard<double, host_space>); per-step losses.
/// The mesh type is named inside the template (docs/gpu.md, "nvcc 13 and mesh types").
template <int ranks>
std::vector<double> run_offloaded() {
  using Mesh = CudaMesh<"fsdp">;
  std::vector<double> losses;
  cuda_threads::run(ranks, [&](CommPtr world) {
    Mesh mesh(world, {ranks});
    const auto cfg = parity_config();
    models::GPT<double, Mesh> model(mesh, cfg);
    auto fsdp = parallel::fully_shard<double, host_space>(model, mesh, {.stage = 3});
    optim::AdamW<double, 1, host_space> opt(fsdp.params(), parity_adamw());
    std::vector<double> mine;
    for (int s = 0; s < parity_steps; ++s) {
      auto [ids, tgt] = parity_batch_of<typename decltype(model)::Ids, Mesh>(mesh, s, cfg);
      opt.zero_grad();
      auto [loss, saved] = model.forward(ids, tgt);
      model.backward(std::move(saved));
      fsdp.finish_gradient_sync();
      optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
      opt.step();
      mine.push_back(to_space<host_space>(full_tensor(loss))[0]);
    }
    if (world->rank() == 0) losses = std::move(mine);
  });
  return losses;
}

}  // namespace

TEST_CASE("cuda: GPT on one GPU rank equals the host run", "[cuda][gpt][parity]") {
  const auto r = run_on_gpu<nn::ReplicatedPlan>({1, 1});
  CHECK(compare_losses(r.losses, parity_reference(), cuda_rtol) == "");
}

TEST_CASE("cuda: GPT under DP 2 x TP 2 on cuda_threads equals the host run", "[cuda][gpt][parity]") {
  const auto r = run_on_gpu<parallel::MegatronPlan<false>>({2, 2});
  CHECK(compare_losses(r.losses, parity_reference(), cuda_rtol) == "");
  CHECK(r.model == expected_model_counts(true, false, parity_config().layers));
  CHECK(r.dp_copied_bytes == 0);
}

TEST_CASE("cuda: GPT under TP 4 + SP on cuda_threads equals the host run", "[cuda][gpt][parity]") {
  const auto r = run_on_gpu<parallel::MegatronPlan<true>>({1, 4});
  CHECK(compare_losses(r.losses, parity_reference(), cuda_rtol) == "");
  CHECK(r.model == expected_model_counts(true, true, parity_config().layers));
}

TEST_CASE("cuda: the MoE GPT under EP 2 x TP 2 on cuda_threads equals the host's one-rank run", "[cuda][gpt][moe][parity]") {
  const auto mc = moe_parity_config(4, 2, 1);
  std::vector<double> reference;
  threads::run(1, [&](CommPtr w) { reference = run_moe_parity<nn::ReplicatedPlan>(w, {1, 1}, 1, mc).losses; });
  const auto r = run_moe_on_gpu<parallel::MegatronPlan<false>>({2, 2}, 2, mc);
  CHECK(compare_losses(r.losses, reference, cuda_rtol) == "");
  CHECK(r.dropped == 0);
}

TEST_CASE("cuda: ZeRO-3 with CPU offload (states on the host) on cuda_threads equals the host run", "[cuda][fsdp][offload]") {
  CHECK(compare_losses(run_offloaded<2>(), parity_reference(), cuda_rtol) == "");
}
