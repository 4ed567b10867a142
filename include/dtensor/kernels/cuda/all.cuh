// dtensor/kernels/cuda/all.cuh — every CUDA kernel (namespace dtensor::kernels::cuda), the twins
// of kernels/host on Tensor<T, R, cuda_space>: gemm / matmul / bmm / linear (cuBLAS),
// elementwise and broadcasting, activations, reduce, softmax, norm, embedding, cross_entropy
// (and its vocabulary-parallel pieces), attention (fused, with lse), transpose / split / concat,
// optimizer updates and sums of squares (Thrust).
#pragma once

#include "dtensor/kernels/cuda/activations.cuh"
#include "dtensor/kernels/cuda/attention.cuh"
#include "dtensor/kernels/cuda/cross_entropy.cuh"
#include "dtensor/kernels/cuda/elementwise.cuh"
#include "dtensor/kernels/cuda/embedding.cuh"
#include "dtensor/kernels/cuda/gemm.cuh"
#include "dtensor/kernels/cuda/norm.cuh"
#include "dtensor/kernels/cuda/optim.cuh"
#include "dtensor/kernels/cuda/reduce.cuh"
#include "dtensor/kernels/cuda/repeat.cuh"
#include "dtensor/kernels/cuda/rotary.cuh"
#include "dtensor/kernels/cuda/softmax.cuh"
#include "dtensor/kernels/cuda/transpose.cuh"
