// dtensor/kernels/cross_entropy.hpp — cross-entropy and its vocabulary-parallel pieces, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/cross_entropy.hpp"
#include "dtensor/kernels/host/cross_entropy.hpp"
#include "dtensor/kernels/meta/cross_entropy.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/cross_entropy.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL_CHECKED(cross_entropy)
DTENSOR_KERNEL_CHECKED(cross_entropy_backward)
DTENSOR_KERNEL(vocab_parallel_ce_max)
DTENSOR_KERNEL_CHECKED(vocab_parallel_ce_sum_exp)
DTENSOR_KERNEL_CHECKED(vocab_parallel_ce_target_logit)
DTENSOR_KERNEL_CHECKED(vocab_parallel_ce_loss)
DTENSOR_KERNEL_CHECKED(vocab_parallel_ce_backward)
}  // namespace dtensor::kernels
