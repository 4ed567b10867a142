// dtensor/kernels/reduce.hpp — sum, mean, max over one dimension and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/host/reduce.hpp"
#include "dtensor/kernels/meta/reduce.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/reduce.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNELS_USE(sum)
DTENSOR_KERNELS_USE(mean)
DTENSOR_KERNELS_USE(max)
DTENSOR_KERNELS_USE(sum_backward)
DTENSOR_KERNELS_USE(mean_backward)
DTENSOR_KERNELS_USE(max_backward)
DTENSOR_KERNELS_USE(max_backward_split)
}  // namespace dtensor::kernels
