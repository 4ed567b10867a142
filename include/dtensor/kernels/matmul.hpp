// dtensor/kernels/matmul.hpp — the matrix products of kernels/products.hpp (matmul, matmul_into,
// matmul_rows_into, bmm, linear and its backwards) with the GEMM of every memory space: host
// (CBLAS or the portable loop), meta (FLOP counts) and, under nvcc, cuda (cuBLAS).
#pragma once

#include "dtensor/kernels/host/matmul.hpp"
#include "dtensor/kernels/meta/gemm.hpp"
#include "dtensor/kernels/products.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/gemm.cuh"
#endif
