// dtensor/kernels/cuda/all.cuh — every CUDA kernel (namespace dtensor::kernels::cuda), the twins
// of kernels/host on Tensor<T, R, cuda_space>: gemm / matmul / bmm / linear (cuBLAS),
// elementwise, activations, softmax, norm. Not yet twinned on the device: reduce (sum, mean,
// max), embedding, cross_entropy, attention, transpose/permute, the broadcasting ops
// (docs/gpu.md lists them).
#pragma once

#include "dtensor/kernels/cuda/activations.cuh"
#include "dtensor/kernels/cuda/elementwise.cuh"
#include "dtensor/kernels/cuda/gemm.cuh"
#include "dtensor/kernels/cuda/norm.cuh"
#include "dtensor/kernels/cuda/softmax.cuh"
