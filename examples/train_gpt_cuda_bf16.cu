// examples/train_gpt_cuda_bf16.cu — train_gpt_cuda's --dtype bf16 run: the trainer (train_gpt.hpp)
// with the model in bfloat16 and the GPU runner (train_gpt_cuda.cuh), apart from main's f32 one.
#include "train_gpt_cuda.cuh"
// bf16 attention on cuDNN's fused kernels where the build has cuDNN: this one unit registers it
// for the program (the header's cost stays out of the f32 unit; attention_cudnn.cuh says why).
#include "dtensor/kernels/cuda/attention_cudnn.cuh"

namespace examples::gpt {
int run_cuda_bf16(int argc, char** argv, const Options& o) { return run<dtensor::bfloat16>(argc, argv, o, CudaGpu{}); }
}  // namespace examples::gpt
