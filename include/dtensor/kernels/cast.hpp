// dtensor/kernels/cast.hpp — element type conversion, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/cast.hpp"
#include "dtensor/kernels/host/cast.hpp"
#include "dtensor/kernels/meta/cast.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/cast.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(cast_into)
}  // namespace dtensor::kernels
