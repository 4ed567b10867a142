// dtensor/kernels/activations.hpp — gelu, relu, silu, exp and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/activations.hpp"
#include "dtensor/kernels/host/activations.hpp"
#include "dtensor/kernels/meta/activations.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/activations.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL(gelu)
DTENSOR_KERNEL_CHECKED(gelu_backward)
DTENSOR_KERNEL(relu)
DTENSOR_KERNEL_CHECKED(relu_backward)
DTENSOR_KERNEL(silu)
DTENSOR_KERNEL_CHECKED(silu_backward)
DTENSOR_KERNEL(exp)
DTENSOR_KERNEL_CHECKED(exp_backward)
}  // namespace dtensor::kernels
