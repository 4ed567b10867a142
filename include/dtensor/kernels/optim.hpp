// dtensor/kernels/optim.hpp — AdamW and SGD updates and the sum of squares, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/host/optim.hpp"
#include "dtensor/kernels/meta/optim.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/optim.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNELS_USE(adamw_update)
DTENSOR_KERNELS_USE(sgd_update)
DTENSOR_KERNELS_USE(sum_squares)
}  // namespace dtensor::kernels
