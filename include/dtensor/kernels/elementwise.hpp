// dtensor/kernels/elementwise.hpp — add, sub, mul, scale, in-place updates, bias, broadcasting and sum_to, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/elementwise.hpp"
#include "dtensor/kernels/host/elementwise.hpp"
#include "dtensor/kernels/meta/elementwise.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/elementwise.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(add)
DTENSOR_KERNEL_CHECKED(sub)
DTENSOR_KERNEL_CHECKED(mul)
DTENSOR_KERNEL(scale)
DTENSOR_KERNEL_CHECKED(add_)
DTENSOR_KERNEL_CHECKED(mul_)
DTENSOR_KERNEL(scale_)
DTENSOR_KERNEL(fill_)
DTENSOR_KERNEL_CHECKED(add_bias_)
DTENSOR_KERNEL_CHECKED(add_bias)
DTENSOR_KERNEL_CHECKED(bias_grad_into)
DTENSOR_KERNEL(bias_grad)
DTENSOR_KERNEL_CHECKED(add_broadcast)
DTENSOR_KERNEL_CHECKED(sub_broadcast)
DTENSOR_KERNEL_CHECKED(mul_broadcast)
DTENSOR_KERNEL_CHECKED(sum_to)
}  // namespace dtensor::kernels
