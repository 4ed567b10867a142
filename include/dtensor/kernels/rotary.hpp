// dtensor/kernels/rotary.hpp — rotary (RoPE) and its backward, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/rotary.hpp"
#include "dtensor/kernels/host/rotary.hpp"
#include "dtensor/kernels/meta/rotary.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/rotary.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(rotary)
DTENSOR_KERNEL_CHECKED(rotary_backward)
}  // namespace dtensor::kernels
