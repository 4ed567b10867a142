// dtensor/kernels/transpose.hpp — permute, transpose, split, concat, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/host/transpose.hpp"
#include "dtensor/kernels/meta/transpose.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/transpose.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNELS_USE(permute)
DTENSOR_KERNELS_USE(transpose)
DTENSOR_KERNELS_USE(split)
DTENSOR_KERNELS_USE(concat)
}  // namespace dtensor::kernels
