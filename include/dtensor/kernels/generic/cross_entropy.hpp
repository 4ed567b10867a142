// dtensor/kernels/generic/cross_entropy.hpp — the argument checks of cross-entropy over rows of
// logits and of its vocabulary-parallel pieces, for every memory space. (Targets in range are
// checked by the kernels that read them: they are values, not extents.)
#pragma once

#include <cstddef>
#include <tuple>

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

template <class L, class I>
void check_ce(const char* op, const L& logits, const I& targets) {
  check(targets.extent(0) == logits.extent(0), op, "logits ", to_string(logits.shape()), " and targets ",
        to_string(targets.shape()), ": one target per row");
}

template <class L, class S>
void check_row_stats(const char* op, const L& logits, const S& s, const char* name) {
  check(s.extent(0) == logits.extent(0), op, name, " ", to_string(s.shape()), " does not match logits ",
        to_string(logits.shape()));
}

/// The N of the mean: the local row count unless the caller gives the global one.
inline Extent mean_divisor(Extent rows, Extent mean_over) {
  check(mean_over < 0 || mean_over >= rows, "cross_entropy", "mean over ", mean_over, " rows, fewer than the ", rows,
        " rows of this shard");
  return mean_over < 0 ? rows : mean_over;
}

namespace detail {
/// The trailing argument at index I of a call that may leave it to its default (-1: the default).
template <std::size_t I, class... Rest>
Extent trailing_extent(const Rest&... rest) {
  if constexpr (I < sizeof...(Rest)) return Extent(std::get<I>(std::tie(rest...)));
  else return -1;
}
}  // namespace detail

template <class L, class I, class... MeanOver>
void check_cross_entropy(const L& logits, const I& targets, const MeanOver&... mean_over) {
  check_ce("cross_entropy", logits, targets);
  (void)mean_divisor(logits.extent(0), detail::trailing_extent<0>(mean_over...));
}
template <class L, class I, class S, class... Rest>  // Rest: dloss, mean_over
void check_cross_entropy_backward(const L& logits, const I& targets, const S& lse, const Rest&... rest) {
  check_ce("cross_entropy_backward", logits, targets);
  check_row_stats("cross_entropy_backward", logits, lse, "lse");
  (void)mean_divisor(logits.extent(0), detail::trailing_extent<1>(rest...));
}
template <class L, class S>
void check_vocab_parallel_ce_sum_exp(const L& logits, const S& global_max) {
  check_row_stats("vocab_parallel_ce_sum_exp", logits, global_max, "global max");
}
template <class L, class I>
void check_vocab_parallel_ce_target_logit(const L& logits, const I& targets, Extent /*v0*/) {
  check_ce("vocab_parallel_ce_target_logit", logits, targets);
}
template <class S, class... MeanOver>
void check_vocab_parallel_ce_loss(const S& global_max, const S& global_sum, const S& target_logit,
                                  const MeanOver&... mean_over) {
  const Extent n = global_max.extent(0);
  check(global_sum.extent(0) == n && target_logit.extent(0) == n, "vocab_parallel_ce_loss", "max ",
        to_string(global_max.shape()), ", sum ", to_string(global_sum.shape()), " and target logit ",
        to_string(target_logit.shape()), " must have one entry per row");
  (void)mean_divisor(n, detail::trailing_extent<0>(mean_over...));
}
template <class L, class I, class S, class... Rest>  // Rest: dloss, mean_over
void check_vocab_parallel_ce_backward(const L& logits, const I& targets, Extent /*v0*/, const S& global_max,
                                      const S& global_sum, const Rest&... rest) {
  check_ce("vocab_parallel_ce_backward", logits, targets);
  check_row_stats("vocab_parallel_ce_backward", logits, global_max, "global max");
  check_row_stats("vocab_parallel_ce_backward", logits, global_sum, "global sum");
  (void)mean_divisor(logits.extent(0), detail::trailing_extent<1>(rest...));
}

}  // namespace dtensor::kernels::generic
