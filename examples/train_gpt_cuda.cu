// examples/train_gpt_cuda.cu — train_gpt with --device cuda: main and the f32 run of the trainer
// (train_gpt.hpp) with the GPU runner (train_gpt_cuda.cuh); --dtype bf16 in train_gpt_cuda_bf16.cu.
//
//   train_gpt_cuda --device cuda --pp 1 --cp 1 --fsdp 2 --tp 2    # 4 ranks, threads sharing one GPU
//   mpirun -n 8 train_gpt_cuda --device cuda --backend nccl         # one process per GPU
//   train_gpt_cuda ...                                              # without --device cuda: refused (the host run is train_gpt)
//   generate_cuda --resume DIR                                      # the link beside it: generate on the GPU
#include <string_view>

#include "train_gpt_cuda.cuh"

namespace examples::gpt {
int run_cuda_bf16(int argc, char** argv, const Options& o);  // train_gpt_cuda_bf16.cu
int generate_main(int argc, char** argv, RunFn run_f32, bool cuda_build);  // generate.cpp
}  // namespace examples::gpt

int main(int argc, char** argv) {
  using namespace examples::gpt;
  const std::string_view name = argc > 0 ? std::string_view(argv[0]) : std::string_view();
  auto f32 = [](int c, char** v, const Options& o) { return run<float>(c, v, o, CudaGpu{}); };
  // Started as generate_cuda (a link beside it, examples/CMakeLists.txt): the generate program on the GPU.
  if (name == "generate_cuda" || name.ends_with("/generate_cuda"))
    return generate_main(argc, argv, f32, /*cuda_build=*/true);
  return examples::gpt::main(argc, argv, /*cuda_build=*/true, f32, run_cuda_bf16);
}
