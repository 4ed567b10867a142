// dtensor/kernels/embedding.hpp — embedding lookups and their backwards, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/embedding.hpp"
#include "dtensor/kernels/host/embedding.hpp"
#include "dtensor/kernels/meta/embedding.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/embedding.cuh"
#endif

namespace dtensor::kernels {
DTENSOR_KERNEL(embedding)
DTENSOR_KERNEL(embedding_shard)
DTENSOR_KERNEL_CHECKED(embedding_backward)
DTENSOR_KERNEL_CHECKED(embedding_shard_backward)
}  // namespace dtensor::kernels
