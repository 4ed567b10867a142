// dtensor/kernels/reduce.hpp — sum, mean, max over one dimension and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/reduce.hpp"
#include "dtensor/kernels/host/reduce.hpp"
#include "dtensor/kernels/meta/reduce.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/reduce.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(sum)
DTENSOR_KERNEL_CHECKED(mean)
DTENSOR_KERNEL_CHECKED(max)
DTENSOR_KERNEL_CHECKED(sum_backward)
DTENSOR_KERNEL_CHECKED(mean_backward)
DTENSOR_KERNEL_CHECKED(max_backward)
DTENSOR_KERNEL_CHECKED(max_backward_split)
}  // namespace dtensor::kernels
