// dtensor/kernels/meta/attention.hpp — the meta twin of kernels/host/attention.hpp: attention,
// attention_backward, merge_attention_blocks, with the host's options (causal, scale, offsets).
//
// FLOPs count the (query, key) pairs a fused kernel computes: P = the unmasked pairs per batch
// and head (T (T + 1) / 2 for causal square attention, Tq Tk without a mask). Forward:
// 2 P D (scores) + 2 P Dv (P V). Backward: 2 P D (scores again, from the saved lse) + 2 P Dv (dV)
// + 2 P Dv (dP) + 2 P D (dQ) + 2 P D (dK) = P (6 D + 4 Dv). Softmax arithmetic is not counted (as
// FlashAttention's papers count). Bytes: q, k, v (and out, lse, dout backward) read once,
// out and lse (dq, dk, dv) written once: what a memory-efficient kernel moves, no T x T matrix.
//
// Unless a MaterializedScores(true) lives (a published run's software, Megatron-LM of 2021/22:
// sim::PlanShape::fused_attention false, models::TrainingPlan likewise): then attention and its
// backward record the unfused kernels instead, materialized_attention_records (the scores in
// HBM), the records the analytic estimate (sim/analytic.hpp) costs for such a plan too.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "dtensor/kernels/host/attention.hpp"  // AttentionOptions, visible_keys
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

using host::AttentionOptions;

/// Attention with its scores in HBM (the unfused kernels of Megatron-LM 2021/22: QK^T, the
/// scale-mask-softmax, dropout and PV as separate kernels), as cost records for `bh` batch
/// entries x heads of `tq` queries and `tk` keys, `d` query/key and `dv` value features,
/// elements of `element_bytes`: the two batched GEMMs over every (query, key) pair (a causal
/// mask is applied to the scores, not skipped) and one memory-bound record of the passes over
/// the tq x tk scores: written by QK^T, read and written by the softmax, read and written by
/// dropout with its 1-byte mask, read by PV: 13 bytes per score. Backward (`backward`): twice
/// the forward's records (dQ, dK, dP, dV: four GEMMs of the forward's sizes; the dropout and
/// softmax backward passes). One function for the dry run's records and the analytic estimate.
inline std::vector<CostRecord> materialized_attention_records(double bh, double tq, double tk, double d, double dv,
                                                              double element_bytes, bool backward) {
  const auto batched = [&](double rows, double k, double cols) {
    return CostRecord{"gemm",
                      std::int64_t(2 * bh * rows * k * cols),
                      std::int64_t(element_bytes * bh * (rows * k + k * cols)),
                      std::int64_t(element_bytes * bh * rows * cols),
                      std::int64_t(rows),
                      std::int64_t(cols),
                      std::int64_t(k),
                      std::int64_t(bh)};
  };
  const CostRecord scores{"softmax", 0, std::int64_t(13 * bh * tq * tk), 0};
  std::vector<CostRecord> forward{batched(tq, d, tk), batched(tq, tk, dv), scores};
  if (!backward) return forward;
  std::vector<CostRecord> twice = forward;
  twice.insert(twice.end(), forward.begin(), forward.end());
  return twice;
}

namespace detail {
inline std::atomic<bool>& materialized_scores_on() {
  static std::atomic<bool> on{false};
  return on;
}
template <class T>
void record_materialized(Extent bh, Extent tq, Extent tk, Extent d, Extent dv, bool backward) {
  for (const auto& r : materialized_attention_records(double(bh), double(tq), double(tk), double(d), double(dv),
                                                      double(sizeof(T)), backward))
    CostLog::record(r);
}
}  // namespace detail

/// Whether the meta attention kernels record the scores in HBM (see MaterializedScores).
inline bool materialized_scores() noexcept { return detail::materialized_scores_on().load(); }

/// While a MaterializedScores(true) lives, the meta attention kernels record attention as the
/// unfused kernels that keep the scores in HBM (materialized_attention_records) instead of a
/// fused kernel: a published run's software (models::dry_run_plan sets it from
/// TrainingPlan::fused_attention). Process-wide, like nn::Fp8Autocast, so that no option is
/// threaded through the modules: set it before the ranks start and keep it for the run. Restores
/// the previous state when it ends. The values a host or CUDA kernel computes do not change.
class MaterializedScores {
 public:
  explicit MaterializedScores(bool enabled = true) : previous_(detail::materialized_scores_on().exchange(enabled)) {}
  ~MaterializedScores() { detail::materialized_scores_on().store(previous_); }
  MaterializedScores(const MaterializedScores&) = delete;
  MaterializedScores& operator=(const MaterializedScores&) = delete;

 private:
  bool previous_;
};

template <class T>
struct AttentionForward {
  MetaTensor<T, 4> out;     // [B, H, Tq, Dv]
  MetaTensor<Stat, 3> lse;  // [B, H, Tq]
};

template <class T>
struct AttentionBackward {
  MetaTensor<T, 4> dq, dk, dv;
};

/// Unmasked (query, key) pairs of one batch entry and head.
inline std::int64_t attention_pairs(const AttentionOptions& o, Extent tq, Extent tk) {
  std::int64_t pairs = 0;
  for (Extent i = 0; i < tq; ++i) pairs += host::detail::visible_keys(o, i, tk);
  return pairs;
}

template <host::FloatElement T>
AttentionForward<T> attention(const MetaTensor<T, 4>& q, const MetaTensor<T, 4>& k, const MetaTensor<T, 4>& v,
                              const AttentionOptions& opts = {}) {
  const Extent bh = q.extent(0) * q.extent(1), tq = q.extent(2), d = q.extent(3), dv = v.extent(3);
  const Shape<4> os{q.extent(0), q.extent(1), tq, dv};
  if (materialized_scores()) {
    detail::record_materialized<T>(bh, tq, k.extent(2), d, dv, /*backward=*/false);
    return {detail::result<T>(os), detail::result<Stat>(Shape<3>{q.extent(0), q.extent(1), tq})};
  }
  const std::int64_t pairs = attention_pairs(opts, tq, k.extent(2));
  detail::cost("attention", bh * pairs * 2 * (d + dv), detail::bytes<T>(q.numel() + k.numel() + v.numel()),
               detail::bytes<T>(numel(os)) + detail::bytes<Stat>(bh * tq));
  return {detail::result<T>(os), detail::result<Stat>(Shape<3>{q.extent(0), q.extent(1), tq})};
}

template <host::FloatElement T>
AttentionBackward<T> attention_backward(const MetaTensor<T, 4>& q, const MetaTensor<T, 4>& k, const MetaTensor<T, 4>& v,
                                        const MetaTensor<T, 4>& out, const MetaTensor<Stat, 3>& lse,
                                        const MetaTensor<T, 4>& dout, const AttentionOptions& opts = {}) {
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), dv = v.extent(3);
  if (materialized_scores()) {
    detail::record_materialized<T>(B * H, tq, k.extent(2), d, dv, /*backward=*/true);
    return {detail::result<T>(q.shape()), detail::result<T>(k.shape()), detail::result<T>(v.shape())};
  }
  const std::int64_t pairs = attention_pairs(opts, tq, k.extent(2));
  detail::cost("attention_backward", B * H * pairs * (6 * d + 4 * dv),
               detail::bytes<T>(q.numel() + k.numel() + v.numel() + out.numel() + dout.numel()) +
                   detail::bytes<Stat>(lse.numel()),
               detail::bytes<T>(q.numel() + k.numel() + v.numel()));
  return {detail::result<T>(q.shape()), detail::result<T>(k.shape()), detail::result<T>(v.shape())};
}

template <host::FloatElement T>
AttentionForward<T> merge_attention_blocks(const MetaTensor<T, 4>& out_a, const MetaTensor<Stat, 3>& /*lse_a*/,
                                           const MetaTensor<T, 4>& /*out_b*/, const MetaTensor<Stat, 3>& /*lse_b*/) {
  const auto& s = out_a.shape();
  const Shape<3> ls{s[0], s[1], s[2]};
  detail::cost("merge_attention_blocks", 3 * out_a.numel(),
               2 * detail::bytes<T>(out_a.numel()) + 2 * detail::bytes<Stat>(numel(ls)),
               detail::bytes<T>(out_a.numel()) + detail::bytes<Stat>(numel(ls)));
  return {detail::result<T>(s), detail::result<Stat>(ls)};
}

}  // namespace dtensor::kernels::meta
