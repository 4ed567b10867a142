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

#include "dtensor/comm/cuda_threads.cuh"
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
    kernels::cuda::allow_tf32(o.tf32);
    kernels::cuda::set_attention_algorithm(o.attention == "fused" ? kernels::cuda::AttentionAlgorithm::fused
                                           : o.attention == "gemm" ? kernels::cuda::AttentionAlgorithm::gemm
                                                                   : kernels::cuda::AttentionAlgorithm::automatic);
    if (std::is_same_v<Compute, dtensor::bfloat16> && o.attention == "auto")
      std::printf("attention (bf16): %s\n", kernels::cuda::cudnn_attention_registered()
                                                ? "cuDNN's fused kernels where cuDNN takes the case, else cuBLAS chunks"
                                                : "cuBLAS chunks from 128 keys (this build has no cuDNN)");
    if (o.backend == "nccl") {
#ifdef DTENSOR_HAS_NCCL
      // nccl::world(): this process's GPU is its local rank % the visible GPUs.
      // The settings' agreement runs over MPI (host buffers), before NCCL is set up.
      return mpi::run(argc, argv, [&](CommPtr host_world) {
        require_same_settings(*host_world, "train_gpt", settings_of(o, corpus));
        run_rank<cuda_space, Compute>(nccl::world(), o, corpus);
      });
#else
      (void)argc, (void)argv;
      std::fprintf(stderr, "train_gpt_cuda: --backend nccl needs a build with -DDTENSOR_WITH_NCCL=ON\n");
      return 2;
#endif
    }
    cuda_threads::run(o.ranks(), [&](CommPtr world) { run_rank<cuda_space, Compute>(std::move(world), o, corpus); });
    return 0;
  }
};

}  // namespace examples::gpt
