// examples/train_gpt_cuda_bf16.cu — train_gpt_cuda's --dtype bf16 half (see train_gpt_bf16.cpp):
// train_gpt_cuda.cu with the model in bfloat16, on the host or, with --device cuda, on the GPU.
#define DTENSOR_TRAIN_GPT_BF16_PART 1
#include "train_gpt_cuda.cu"
