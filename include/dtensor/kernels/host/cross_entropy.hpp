// dtensor/kernels/host/cross_entropy.hpp — mean cross-entropy of logits against integer targets,
// whole or split over the vocabulary.
//
//   auto f = cross_entropy(logits, targets);        // logits[N, V], targets[N] in [0, V)
//   f.loss                                           // mean over the N rows (double)
//   auto dlogits = cross_entropy_backward(logits, targets, f.lse, /*dloss=*/1.0);  // (softmax - onehot) * dloss / N
//
// Vocabulary parallel: this rank holds the columns [v0, v0 + V_local) of the logits.
//   auto m = vocab_parallel_ce_max(logits);                    // [N] local row max    -> all-reduce max
//   auto s = vocab_parallel_ce_sum_exp(logits, m_global);      // [N] sum exp(x - max) -> all-reduce sum
//   auto t = vocab_parallel_ce_target_logit(logits, targets, v0);  // [N], 0 off-shard  -> all-reduce sum
//   double loss = vocab_parallel_ce_loss(m_global, s_global, t_global);   // same on every rank
//   auto dl = vocab_parallel_ce_backward(logits, targets, v0, m_global, s_global, dloss);
//
// cross_entropy is exactly these pieces on one rank (v0 = 0), so a split run differs from a whole
// one only by the order in which the double sums of exps are added. Statistics are Stat (double).
// The per-row pieces and the backward run in blocks of rows on a rank's intra-op threads
// (parallel.hpp); the loss, a sum over rows, stays serial: the same bits for any thread count.
//
// Rows split across ranks (data parallel): pass mean_over = the global row count to
// cross_entropy / cross_entropy_backward / vocab_parallel_ce_loss / vocab_parallel_ce_backward;
// each rank's loss is then its share of the global mean (the shares add up to it).
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "dtensor/kernels/generic/cross_entropy.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/kernels/host/simd.hpp"
#include "dtensor/kernels/host/softmax.hpp"

namespace dtensor::kernels::host {

struct CrossEntropyForward {
  double loss = 0;          // mean over rows
  HostTensor<Stat, 1> lse;  // [N]: log-sum-exp of each row, saved for the backward
};

namespace detail {

using generic::mean_divisor;  // kernels/generic/cross_entropy.hpp

/// dlogits[i, j] = (exp(x - lse_i) - [v0 + j == target_i]) * scale. float and bfloat16 rows: the
/// softmax row vectorized in float (bfloat16 widened first; simd.hpp), then the target's -1 and
/// the scale, rounded once; double keeps the plain loop (the tests' oracle).
template <class T, class Id, class Lse>
HostTensor<T, 2> ce_backward(const HostTensor<T, 2>& logits, const HostTensor<Id, 1>& targets, Extent v0, Lse lse,
                             Stat scale) {
  const Extent n = logits.extent(0), v = logits.extent(1);
  auto d = HostTensor<T, 2>::uninitialized(logits.shape());
  parallel_for(n, grain_for(4 * v), [&](Extent i0, Extent i1) {
    // for bfloat16: the widened row and its float softmax
    std::vector<float> scratch(std::is_same_v<T, bfloat16> ? static_cast<std::size_t>(2 * v) : 0);
    for (Extent i = i0; i < i1; ++i) {
      const T* x = logits.data() + i * v;
      T* dr = d.data() + i * v;
      const Stat l = lse(i);
      const Extent t = Extent(targets[i]) - v0;
      if constexpr (float_rows<T>) {
        const float* xr = nullptr;
        with_isa([&](auto) DTENSOR_SIMD_BODY { xr = float_row(x, scratch.data(), v); });
        float* p = float_out(dr, scratch.data() + v);
        row_softmax(xr, p, v, l);
        with_isa([&](auto) DTENSOR_SIMD_BODY {
          for (Extent j = 0; j < v; ++j) dr[j] = T(float((Stat(p[j]) - (j == t ? 1.0 : 0.0)) * scale));
        });
      } else {
        for (Extent j = 0; j < v; ++j) dr[j] = T((std::exp(Stat(x[j]) - l) - (j == t ? 1.0 : 0.0)) * scale);
      }
    }
  });
  return d;
}

}  // namespace detail

/// Per-row max of the local logits (-inf for an empty shard).
template <FloatElement T>
HostTensor<Stat, 1> vocab_parallel_ce_max(const HostTensor<T, 2>& logits) {
  const Extent n = logits.extent(0), v = logits.extent(1);
  auto m = HostTensor<Stat, 1>::uninitialized(Shape<1>{n});
  detail::parallel_for(n, detail::grain_for(v), [&](Extent i0, Extent i1) {
    for (Extent i = i0; i < i1; ++i) m[i] = detail::row_max(logits.data() + i * v, v);
  });
  return m;
}

/// Per-row sum of exp(x - global_max) over the local columns.
template <FloatElement T>
HostTensor<Stat, 1> vocab_parallel_ce_sum_exp(const HostTensor<T, 2>& logits, const HostTensor<Stat, 1>& global_max) {
  const Extent n = logits.extent(0), v = logits.extent(1);
  auto s = HostTensor<Stat, 1>::uninitialized(Shape<1>{n});
  detail::parallel_for(n, detail::grain_for(3 * v), [&](Extent i0, Extent i1) {
    for (Extent i = i0; i < i1; ++i) s[i] = detail::row_sum_exp(logits.data() + i * v, v, global_max[i]);
  });
  return s;
}

/// Per-row logit of the target when it lies in this shard's columns [v0, v0 + V_local), else 0.
template <FloatElement T, IndexElement Id>
HostTensor<Stat, 1> vocab_parallel_ce_target_logit(const HostTensor<T, 2>& logits, const HostTensor<Id, 1>& targets,
                                                   Extent v0) {
  const Extent n = logits.extent(0), v = logits.extent(1);
  auto t = HostTensor<Stat, 1>::uninitialized(Shape<1>{n});
  for (Extent i = 0; i < n; ++i) {
    const Extent j = Extent(targets[i]) - v0;
    detail::check(Extent(targets[i]) >= 0, "vocab_parallel_ce_target_logit", "negative target ", Extent(targets[i]),
                  " in row ", i);
    t[i] = (j >= 0 && j < v) ? Stat(logits(i, j)) : 0.0;
  }
  return t;
}

/// Mean over rows of log(sum) + max - target_logit, from the all-reduced pieces.
inline double vocab_parallel_ce_loss(const HostTensor<Stat, 1>& global_max, const HostTensor<Stat, 1>& global_sum,
                                     const HostTensor<Stat, 1>& target_logit, Extent mean_over = -1) {
  const Extent n = global_max.extent(0);
  double loss = 0;
  for (Extent i = 0; i < n; ++i) loss += detail::lse_of(global_max[i], global_sum[i]) - target_logit[i];
  const Extent d = detail::mean_divisor(n, mean_over);
  return d > 0 ? loss / double(d) : 0.0;
}

/// This shard's columns of d(mean loss)/d(logits) = (softmax - onehot) * dloss / N.
template <FloatElement T, IndexElement Id>
HostTensor<T, 2> vocab_parallel_ce_backward(const HostTensor<T, 2>& logits, const HostTensor<Id, 1>& targets, Extent v0,
                                            const HostTensor<Stat, 1>& global_max, const HostTensor<Stat, 1>& global_sum,
                                            double dloss = 1.0, Extent mean_over = -1) {
  const Extent d = detail::mean_divisor(logits.extent(0), mean_over);
  return detail::ce_backward(logits, targets, v0, [&](Extent i) { return detail::lse_of(global_max[i], global_sum[i]); },
                             d > 0 ? dloss / double(d) : 0.0);
}

template <FloatElement T, IndexElement Id>
CrossEntropyForward cross_entropy(const HostTensor<T, 2>& logits, const HostTensor<Id, 1>& targets,
                                  Extent mean_over = -1) {
  for (Extent i = 0; i < targets.extent(0); ++i)
    detail::check(targets[i] >= 0 && Extent(targets[i]) < logits.extent(1), "cross_entropy", "target ",
                  Extent(targets[i]), " in row ", i, " out of range [0, ", logits.extent(1), ")");
  const auto m = vocab_parallel_ce_max(logits);
  const auto s = vocab_parallel_ce_sum_exp(logits, m);
  CrossEntropyForward f{vocab_parallel_ce_loss(m, s, vocab_parallel_ce_target_logit(logits, targets, 0), mean_over),
                        HostTensor<Stat, 1>::uninitialized(m.shape())};
  for (Extent i = 0; i < m.extent(0); ++i) f.lse[i] = detail::lse_of(m[i], s[i]);
  return f;
}

template <FloatElement T, IndexElement Id>
HostTensor<T, 2> cross_entropy_backward(const HostTensor<T, 2>& logits, const HostTensor<Id, 1>& targets,
                                        const HostTensor<Stat, 1>& lse, double dloss = 1.0, Extent mean_over = -1) {
  const Extent d = detail::mean_divisor(logits.extent(0), mean_over);
  return detail::ce_backward(logits, targets, 0, [&](Extent i) { return lse[i]; }, d > 0 ? dloss / double(d) : 0.0);
}

}  // namespace dtensor::kernels::host
