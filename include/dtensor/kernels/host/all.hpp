// dtensor/kernels/host/all.hpp — every host kernel (the per-rank local compute) in one include.
//
// namespace dtensor::kernels::host: gemm / matmul / linear, elementwise, activations, reduce,
// softmax, norm, embedding, cross_entropy, attention, transpose, optim. Each header stands alone too.
#pragma once

#include "dtensor/kernels/host/activations.hpp"
#include "dtensor/kernels/host/attention.hpp"
#include "dtensor/kernels/host/cross_entropy.hpp"
#include "dtensor/kernels/host/elementwise.hpp"
#include "dtensor/kernels/host/embedding.hpp"
#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/kernels/host/matmul.hpp"
#include "dtensor/kernels/host/optim.hpp"
#include "dtensor/kernels/host/norm.hpp"
#include "dtensor/kernels/host/reduce.hpp"
#include "dtensor/kernels/host/repeat.hpp"
#include "dtensor/kernels/host/rotary.hpp"
#include "dtensor/kernels/host/softmax.hpp"
#include "dtensor/kernels/host/transpose.hpp"
