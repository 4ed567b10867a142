// dtensor/kernels/transpose.hpp — permute, transpose, split, concat, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/host/transpose.hpp"
#include "dtensor/kernels/meta/transpose.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/transpose.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL(permute)
DTENSOR_KERNEL(transpose)
DTENSOR_KERNEL(split)
DTENSOR_KERNEL(concat)
}  // namespace dtensor::kernels
