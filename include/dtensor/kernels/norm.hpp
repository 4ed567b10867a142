// dtensor/kernels/norm.hpp — layer_norm and rms_norm and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/norm.hpp"
#include "dtensor/kernels/host/norm.hpp"
#include "dtensor/kernels/meta/norm.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/norm.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(layer_norm)
DTENSOR_KERNEL_CHECKED(layer_norm_backward)
DTENSOR_KERNEL_CHECKED(rms_norm)
DTENSOR_KERNEL_CHECKED(rms_norm_backward)
}  // namespace dtensor::kernels
