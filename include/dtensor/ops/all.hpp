// dtensor/ops/all.hpp — every DTensor op, in one include.
//
//   #include <dtensor/ops/all.hpp>
//   auto y = dtensor::ops::matmul<false, true>(x, w);
//
// namespace dtensor::ops: matmul / bmm (matmul.hpp), add / sub / mul / scale / bias_add
// (pointwise.hpp), gelu / relu / silu / exp (activations.hpp), sum / mean / max (reduce.hpp),
// softmax / log_softmax (softmax.hpp), layer_norm / rms_norm (norm.hpp), embedding
// (embedding.hpp), cross_entropy (cross_entropy.hpp), attention (attention.hpp), rotary (rotary.hpp),
// repeat_interleave (repeat.hpp), transpose /
// reshape / split / concat (shape.hpp); each with its backward. The sharding rules live in
// rules.hpp (ops::rules), documented in docs/ops.md. No op communicates.
#pragma once

#include "dtensor/ops/activations.hpp"
#include "dtensor/ops/attention.hpp"
#include "dtensor/ops/cross_entropy.hpp"
#include "dtensor/ops/embedding.hpp"
#include "dtensor/ops/matmul.hpp"
#include "dtensor/ops/norm.hpp"
#include "dtensor/ops/pointwise.hpp"
#include "dtensor/ops/reduce.hpp"
#include "dtensor/ops/repeat.hpp"
#include "dtensor/ops/rotary.hpp"
#include "dtensor/ops/rules.hpp"
#include "dtensor/ops/shape.hpp"
#include "dtensor/ops/softmax.hpp"
