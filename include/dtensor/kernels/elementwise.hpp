// dtensor/kernels/elementwise.hpp — add, sub, mul, scale, in-place updates, bias, broadcasting and sum_to, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/host/elementwise.hpp"
#include "dtensor/kernels/meta/elementwise.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/elementwise.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNELS_USE(add)
DTENSOR_KERNELS_USE(sub)
DTENSOR_KERNELS_USE(mul)
DTENSOR_KERNELS_USE(scale)
DTENSOR_KERNELS_USE(add_)
DTENSOR_KERNELS_USE(mul_)
DTENSOR_KERNELS_USE(scale_)
DTENSOR_KERNELS_USE(fill_)
DTENSOR_KERNELS_USE(add_bias_)
DTENSOR_KERNELS_USE(add_bias)
DTENSOR_KERNELS_USE(bias_grad_into)
DTENSOR_KERNELS_USE(bias_grad)
DTENSOR_KERNELS_USE(add_broadcast)
DTENSOR_KERNELS_USE(sub_broadcast)
DTENSOR_KERNELS_USE(mul_broadcast)
DTENSOR_KERNELS_USE(sum_to)
}  // namespace dtensor::kernels
