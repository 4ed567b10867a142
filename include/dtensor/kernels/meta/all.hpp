// dtensor/kernels/meta/all.hpp — every meta kernel (namespace dtensor::kernels::meta): the twins of
// kernels/host on Tensor<T, R, meta_space>, which return results of the right extents (checked by
// kernels::name, kernels/generic/) and record FLOPs and bytes in a CostLog (cost_log.hpp).
#pragma once

#include "dtensor/kernels/meta/activations.hpp"
#include "dtensor/kernels/meta/attention.hpp"
#include "dtensor/kernels/meta/cost_log.hpp"
#include "dtensor/kernels/meta/cross_entropy.hpp"
#include "dtensor/kernels/meta/elementwise.hpp"
#include "dtensor/kernels/meta/embedding.hpp"
#include "dtensor/kernels/meta/fp8.hpp"
#include "dtensor/kernels/meta/gemm.hpp"
#include "dtensor/kernels/meta/norm.hpp"
#include "dtensor/kernels/meta/optim.hpp"
#include "dtensor/kernels/meta/reduce.hpp"
#include "dtensor/kernels/meta/repeat.hpp"
#include "dtensor/kernels/meta/rotary.hpp"
#include "dtensor/kernels/meta/softmax.hpp"
#include "dtensor/kernels/meta/transpose.hpp"
