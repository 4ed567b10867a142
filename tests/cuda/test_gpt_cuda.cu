// The GPT parity suite with the model on the GPU: nn::GPT on a CudaMesh (every parameter,
// activation, gradient and optimizer state in cuda_space, the kernels cuBLAS and kernels/cuda),
// the ranks as threads sharing one GPU (cuda_threads), trained 20 steps with AdamW, clipping,
// DDP and the sequence-parallel sync — the same driver as the host parity tests
// (tests/parity/gpt_parity.hpp) — and compared with the one-rank host run. Double precision:
// cuBLAS and the CUDA kernels sum in other orders than OpenBLAS and the host loops, so the runs
// agree to rounding (1e-9 relative), not bit for bit.
#include <catch2/catch.hpp>

#include "dtensor/comm/cuda_threads.cuh"
#include "dtensor/mesh/cuda_mesh.cuh"
#include "parity/gpt_parity.hpp"

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
