// examples/train_gpt_cuda.cuh — train_gpt's GPU runner: the trainer (train_gpt.hpp) whose loop is
// also instantiated on a CudaMesh, so every parameter, activation, gradient and optimizer state
// lives in GPU memory and the kernels are cuBLAS and kernels/cuda. train_gpt_cuda.cu (main, f32)
// and train_gpt_cuda_bf16.cu (bf16) instantiate it.
//
// The ranks: with --backend threads (the default) they are threads sharing GPU 0
// (cuda_threads::run: one stream per rank, collectives are device copies); with --backend nccl
// under mpirun, one process per rank, each on GPU (local rank % visible GPUs) (nccl::world).
// The batches are drawn on the host and copied to the GPU per micro-batch
// (pipeline::split_microbatches); the losses come back as one number each.
//
// Without a usable GPU the run stops before any rank starts, with the CUDA error that said so
// (e.g. "cudaGetDeviceCount(&devices): cudaErrorNoDevice ...") and exit code 1.
#pragma once

#include <optional>

#include "dtensor/comm/cuda_threads.cuh"
#include "dtensor/kernels/cuda/profile.cuh"
#include "dtensor/mesh/cuda_mesh.cuh"
#ifdef DTENSOR_HAS_NCCL
#include "dtensor/comm/nccl.cuh"
#endif
#include "train_gpt.hpp"

namespace examples::gpt {

/// The number of visible GPUs; a CUDA error (no driver, no device) is thrown as a dtensor::Error
/// naming it, and zero devices without an error is one too.
inline int visible_gpus() {
  int devices = 0;
  DTENSOR_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices == 0) throw Error("train_gpt_cuda", "--device cuda: cudaGetDeviceCount reports no CUDA device");
  return devices;
}

/// --profile-kernels: rank 0's kernels timed by class (kernels/cuda/profile.cuh) while it lives.
class ProfileOnRank0 {
 public:
  ProfileOnRank0(const Options& o, int rank) {
    if (o.profile_kernels && rank == 0) on_.emplace(profile_);
  }

 private:
  kernels::cuda::KernelProfile profile_;
  std::optional<kernels::cuda::KernelProfile::Scope> on_;
};

/// Options::kernel_report of --profile-kernels, on rank 0's thread after the loop: each class's
/// milliseconds per step (every kernel of the run, the evaluations' too, over the steps run) and
/// its share of the step after the first (FitReport); "other and idle" is what the classes leave.
inline void print_kernel_profile(const train::FitReport& r) {
  auto* profile = kernels::cuda::KernelProfile::active();
  if (profile == nullptr || r.steps_run == 0) return;
  const double step_ms = r.steps_run > 1 && r.tokens_per_second_after_first > 0
                             ? 1e3 * r.tokens_per_second * r.elapsed / r.steps_run / r.tokens_per_second_after_first
                             : 1e3 * r.elapsed / r.steps_run;
  std::printf("kernels on rank 0 (CUDA events, per step of %d; the step after the first %.2f ms):", r.steps_run,
              step_ms);
  double classed = 0;
  for (const auto& [name, ms] : profile->milliseconds()) {
    const double per_step = ms / r.steps_run;
    classed += per_step;
    std::printf(" %s %.2f ms (%.1f %%),", name, per_step, 100 * per_step / step_ms);
  }
  std::printf(" other and idle %.2f ms (%.1f %%)\n", step_ms - classed, 100 * (step_ms - classed) / step_ms);
}

/// --device cuda: run's Gpu (train_gpt.hpp).
struct CudaGpu {
  static constexpr bool available = true;

  template <class Compute>
  int run(int argc, char** argv, const Options& given, const Corpus& corpus) const {
    try {
      visible_gpus();
    } catch (const Error& e) {
      std::fprintf(stderr, "train_gpt_cuda: --device cuda needs a usable GPU: %s\n", e.what());
      return 1;
    }
    Options o = given;
    cudaDeviceProp gpu{};
    DTENSOR_CUDA_CHECK(cudaGetDeviceProperties(&gpu, 0));
    o.gpu = gpu.name;  // the MFU line's peak (print_mfu)
    if (o.dtype == "fp8" && gpu.major * 10 + gpu.minor < 89) {
      std::fprintf(stderr, "train_gpt_cuda: --dtype fp8 needs FP8 tensor cores (sm_89 or later); %s is sm_%d%d\n",
                   gpu.name, gpu.major, gpu.minor);
      return 2;
    }
    kernels::cuda::allow_tf32(o.tf32);
    kernels::cuda::set_attention_algorithm(o.attention == "fused" ? kernels::cuda::AttentionAlgorithm::fused
                                           : o.attention == "gemm" ? kernels::cuda::AttentionAlgorithm::gemm
                                                                   : kernels::cuda::AttentionAlgorithm::automatic);
    if (std::is_same_v<Compute, dtensor::bfloat16> && o.attention == "auto")
      std::printf("attention (bf16): %s\n", kernels::cuda::cudnn_attention_registered()
                                                ? "cuDNN's fused kernels where cuDNN takes the case, else cuBLAS chunks"
                                                : "cuBLAS chunks from 128 keys (this build has no cuDNN)");
    if (o.profile_kernels) o.kernel_report = print_kernel_profile;
    if (o.backend == "nccl") {
#ifdef DTENSOR_HAS_NCCL
      // nccl::world(): this process's GPU is its local rank % the visible GPUs.
      // The settings' agreement runs over MPI (host buffers), before NCCL is set up.
      return mpi::run(argc, argv, [&](CommPtr host_world) {
        require_same_settings(*host_world, "train_gpt", settings_of(o, corpus));
        auto world = nccl::world();
        const ProfileOnRank0 profile(o, world->rank());
        run_rank<cuda_space, Compute>(std::move(world), o, corpus);
      });
#else
      (void)argc, (void)argv;
      std::fprintf(stderr, "train_gpt_cuda: --backend nccl needs a build with -DDTENSOR_WITH_NCCL=ON\n");
      return 2;
#endif
    }
    cuda_threads::run(o.ranks(), [&](CommPtr world) {
      const ProfileOnRank0 profile(o, world->rank());
      run_rank<cuda_space, Compute>(std::move(world), o, corpus);
    });
    return 0;
  }
};

}  // namespace examples::gpt
