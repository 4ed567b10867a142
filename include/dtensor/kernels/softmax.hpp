// dtensor/kernels/softmax.hpp — softmax and log_softmax over the last dimension and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/host/softmax.hpp"
#include "dtensor/kernels/meta/softmax.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/softmax.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNELS_USE(softmax)
DTENSOR_KERNELS_USE(softmax_backward)
DTENSOR_KERNELS_USE(log_softmax)
DTENSOR_KERNELS_USE(log_softmax_backward)
}  // namespace dtensor::kernels
