// dtensor/kernels/repeat.hpp — repeat_interleave and its backward, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/repeat.hpp"
#include "dtensor/kernels/host/repeat.hpp"
#include "dtensor/kernels/meta/repeat.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/repeat.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(repeat_interleave)
DTENSOR_KERNEL_CHECKED(repeat_interleave_backward)
}  // namespace dtensor::kernels
