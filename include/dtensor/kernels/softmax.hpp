// dtensor/kernels/softmax.hpp — softmax and log_softmax over the last dimension and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/softmax.hpp"
#include "dtensor/kernels/host/softmax.hpp"
#include "dtensor/kernels/meta/softmax.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/softmax.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL(softmax)
DTENSOR_KERNEL_CHECKED(softmax_backward)
DTENSOR_KERNEL(log_softmax)
DTENSOR_KERNEL_CHECKED(log_softmax_backward)
}  // namespace dtensor::kernels
