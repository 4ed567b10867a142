// dtensor/kernels/attention.hpp — fused causal attention with log-sum-exp output, its backward and block merging, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/attention.hpp"
#include "dtensor/kernels/host/attention.hpp"
#include "dtensor/kernels/meta/attention.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/attention.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(attention)
DTENSOR_KERNEL_CHECKED(attention_backward)
DTENSOR_KERNEL_CHECKED(merge_attention_blocks)
}  // namespace dtensor::kernels
