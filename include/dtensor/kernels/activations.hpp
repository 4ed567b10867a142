// dtensor/kernels/activations.hpp — gelu, relu, silu, exp and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/host/activations.hpp"
#include "dtensor/kernels/meta/activations.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/activations.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNELS_USE(gelu)
DTENSOR_KERNELS_USE(gelu_backward)
DTENSOR_KERNELS_USE(relu)
DTENSOR_KERNELS_USE(relu_backward)
DTENSOR_KERNELS_USE(silu)
DTENSOR_KERNELS_USE(silu_backward)
DTENSOR_KERNELS_USE(exp)
DTENSOR_KERNELS_USE(exp_backward)
}  // namespace dtensor::kernels
