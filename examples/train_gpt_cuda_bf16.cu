// examples/train_gpt_cuda_bf16.cu — train_gpt_cuda's --dtype bf16 (and fp8) run: the trainer (train_gpt.hpp)
// with the model in bfloat16 and the GPU runner (train_gpt_cuda.cuh), apart from main's f32 one.
#include "train_gpt_cuda.cuh"
// bf16 attention on cuDNN's fused kernels where the build has cuDNN: this one unit registers it
// for the program (the header's cost stays out of the f32 unit; attention_cudnn.cuh says why).
#include "dtensor/kernels/cuda/attention_cudnn.cuh"
// --dtype fp8 is this bf16 run under nn::Fp8Autocast: the GPU's FP8 Linear kernels, registered
// here for the program (nn/fp8_cuda.cuh).
#include "dtensor/nn/fp8_cuda.cuh"

namespace examples::gpt {
int run_cuda_bf16(int argc, char** argv, const Options& o) { return run<dtensor::bfloat16>(argc, argv, o, CudaGpu{}); }
}  // namespace examples::gpt
