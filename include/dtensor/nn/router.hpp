// dtensor/nn/router.hpp — top-k token-choice routing for a mixture of experts: scores, top-k,
// gates, capacity, the load-balancing and z losses, and the gradient of all of them.
//
//   nn::RouterConfig rc{.experts = 8, .topk = 2, .capacity_factor = 1.25};   // no capacity: dropless
//   auto r = nn::route<double>(logits, batch, seq, global_batch, rc);   // logits: [batch * seq, experts], local
//   r.expert[n * topk + j], r.gate[...], r.kept[...]                     // the j-th choice of token n
//   auto dlogits = nn::route_backward(r, dgate, rc);                    // gates, aux and z losses
//
// Everything here is local to a rank (no communication; under context parallelism one sum the
// caller provides, see below): routing depends on a token's logits
// and, through the capacity, on the other tokens of its *sequence* only. Capacity groups are
// sequences (GShard's groups): capacity = ceil(capacity_factor * seq * topk / experts) slots per
// expert per sequence, so the tokens a rank drops do not depend on how the batch is split over
// ranks — a distributed run drops exactly the tokens the one-rank run drops, and drops them
// before they are sent. Precedence inside a sequence: every token's first choice (by position),
// then every token's second choice, ... (GShard: a second choice never displaces a first one).
//
// Scores: softmax over the experts, or an independent sigmoid per expert. The top-k scores (ties
// to the lower expert index) are the gates; with topk > 1 and normalize_gates they are divided by
// their sum. A dropped choice keeps its gate but contributes nothing.
//
// Group-limited routing (DeepSeek-V3's node-limited routing; DeepSeek-V2's device-limited one
// with a group per expert rank): with groups G > 1 and topk_groups M < G, the experts form G
// groups of E / G consecutive experts, a group's score is the sum of its top two expert scores
// (its top one when a group has one expert), and a token's top-k is taken over the experts of
// its M best groups only (ties to the lower group), so each token reaches at most M groups. With
// groups that match the expert ranks (G = ep, E a multiple of ep: parallel/experts.hpp splits
// consecutive experts) a token's rows go to at most M ranks. The selection is all that changes:
// scores, gates, losses and their gradients are as above. The dispatch sends a token's row once
// per expert rank its choices reach (parallel/expert_parallel.hpp), so the bytes it moves shrink
// with M (docs/expert-parallel.md); the balanced routing of a dry run (route_balanced) keeps
// each token's choices within M groups too.
//
// Losses, each as this rank's share of the global mean (a Partial<sum> over the data ranks, like
// the cross-entropy; the trainer sums the shares to print them):
//   aux (Switch / GShard load balancing), per sequence s: E * sum_e f_se * P_se, where f_se is the
//       fraction of s's top-k choices that picked e (before capacity; not differentiable) and
//       P_se the mean score of e over s's tokens; averaged over the global batch's sequences.
//   z (ST-MoE router z-loss): logsumexp(logits)^2, averaged over the global batch's tokens.
// route_backward returns d/dlogits of sum_j dgate_j * gate_j + aux_loss_coeff * aux +
// z_loss_coeff * z, so a caller adds the auxiliary losses to its loss with these coefficients.
//
// Context parallelism (RouteContext): when each sequence is split over `parts` context ranks, a
// rank routes seq = its share of every sequence. Top-k is per token, so dropless routing is
// exact; the aux loss needs f_se over the whole sequence: the ranks' counts are summed by
// `sum_over_parts` (the caller's all-reduce on the context group: nn::MoE's only extra
// collective), and P_se and z, being sums over tokens, split into per-rank shares normalized by
// the whole sequence length. A capacity that can drop (below the whole sequence's length; a
// token picks an expert once, so that much never binds) is refused there: which of a sequence's
// choices are dropped depends on the choices of all its tokens, on every context rank, in order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor::nn {

enum class RouterScore { softmax, sigmoid };

struct RouterConfig {
  Extent experts = 0;
  Extent topk = 1;
  RouterScore score = RouterScore::softmax;
  std::optional<double> capacity_factor;  // none: dropless (every choice is kept)
  bool normalize_gates = true;            // with topk > 1: gates divided by their sum
  double aux_loss_coeff = 0.01;
  double z_loss_coeff = 0.0;
  // Group-limited routing (see the top): G groups of consecutive experts, each token's top-k from
  // its topk_groups best groups; 0 or G: every group (no limit).
  Extent groups = 1;
  Extent topk_groups = 0;
  // Route by route_balanced whatever the logits (Megatron's moe_router_force_load_balancing):
  // every expert gets its share of every rank's choices, the router gets no gradient. For
  // benchmarks, and what a dry run assumes (so a real run can be checked against one).
  bool force_balanced = false;
};

/// Throws an Error for `op` unless the configuration is usable.
inline void check_router_config(const RouterConfig& c, const char* op, int rank = -1) {
  if (c.experts < 1 || c.topk < 1 || c.topk > c.experts)
    throw Error(op, dtensor::detail::cat("topk ", c.topk, " of ", c.experts, " experts: need 1 <= topk <= experts"),
                rank);
  if (c.capacity_factor && !(*c.capacity_factor > 0))
    throw Error(op, dtensor::detail::cat("capacity factor ", *c.capacity_factor,
                                         " must be > 0 (leave it unset for dropless routing)"),
                rank);
  if (!(c.aux_loss_coeff >= 0) || !(c.z_loss_coeff >= 0))
    throw Error(op, dtensor::detail::cat("loss coefficients aux ", c.aux_loss_coeff, ", z ", c.z_loss_coeff,
                                         " must be >= 0"),
                rank);
  if (c.groups < 1 || c.experts % c.groups != 0 || c.topk_groups < 0 || c.topk_groups > c.groups)
    throw Error(op,
                dtensor::detail::cat("routing groups ", c.groups, " (top ", c.topk_groups, " of them) over ", c.experts,
                                     " experts: need groups >= 1 dividing the experts and 0 <= topk_groups <= groups"),
                rank);
  if (c.topk_groups > 0 && c.topk > c.topk_groups * (c.experts / c.groups))
    throw Error(op,
                dtensor::detail::cat("topk ", c.topk, " from ", c.topk_groups, " of ", c.groups, " groups of ",
                                     c.experts / c.groups, " experts: the groups hold fewer experts than topk"),
                rank);
}

/// Whether c limits each token to fewer groups than there are (group-limited routing).
inline bool group_limited(const RouterConfig& c) {
  return c.groups > 1 && c.topk_groups > 0 && c.topk_groups < c.groups;
}

/// How a rank's sequences are split over context ranks (parts 1: whole sequences, no communication).
struct RouteContext {
  Extent parts = 1;
  std::function<void(std::span<double>)> sum_over_parts{};  // sums a vector over the parts' ranks
  // The whole sequence's length; 0: seq x parts. A sequence that the parts do not divide (7
  // patches over 2 context ranks: 4 and 3) must give it, or f_se and the means are off.
  Extent full_seq = 0;
};

/// Slots per expert per sequence of `seq` tokens; 0 means no limit (dropless). At most `seq`:
/// a token picks an expert once, so more slots never bind, and a huge factor (1e300, inf) must
/// mean dropless, not an int64 overflow that drops every choice. Saturating: the product is
/// compared in double before it is converted.
inline Extent expert_capacity(const RouterConfig& c, Extent seq) {
  if (!c.capacity_factor) return 0;
  const double slots = std::ceil(*c.capacity_factor * double(seq) * double(c.topk) / double(c.experts));
  if (!(slots < double(seq))) return seq;  // also inf (and NaN, which check_router_config refuses)
  return slots < 0 ? 0 : Extent(slots);
}

/// What routing decided for this rank's tokens, and its statistics.
template <class T>
struct Routing {
  Extent tokens = 0, seq = 0, topk = 1, experts = 0;
  Extent full_seq = 0;                 // the whole sequence's length (RouteContext::full_seq, else seq x the context parts)
  Extent global_batch = 0;             // sequences in the global batch (the losses' mean)
  Extent capacity = 0;                 // slots per expert per sequence (0: dropless)
  std::vector<std::int32_t> expert;    // [token * topk + j]: the j-th choice
  std::vector<T> gate;                 // its gate
  std::vector<std::uint8_t> kept;      // 1 unless dropped past capacity
  std::vector<double> logits;          // [token * experts + e]
  std::vector<double> scores;          // softmax or sigmoid of the logits
  std::vector<double> lse;             // per token: logsumexp of its logits (z-loss)
  std::vector<double> choice_fraction; // [sequence * experts + e]: f_se of the aux loss
  std::vector<std::int64_t> routed;    // per expert: this rank's choices before capacity
  std::vector<std::int64_t> load;      // per expert: this rank's kept choices
  std::int64_t dropped = 0;            // this rank's choices past capacity
  double aux_loss = 0, z_loss = 0;     // this rank's shares (see the top of this file)
};

namespace detail {
/// A Routing of batch x seq tokens with its checks and sizes, before any choice is made.
template <class T>
Routing<T> start_routing(const char* op, Extent batch, Extent seq, Extent global_batch, const RouterConfig& c,
                         const RouteContext& context) {
  check_router_config(c, op);
  if (batch < 0 || seq < 0 || global_batch < batch)
    throw Error(op, dtensor::detail::cat(batch, " x ", seq, " tokens of ", c.experts, " experts (global batch ",
                                         global_batch, ")"));
  if (context.parts < 1 || (context.parts > 1 && !context.sum_over_parts))
    throw Error(op, dtensor::detail::cat("context parts ", context.parts, ": needs >= 1 and, above 1, a sum over them"));
  const Extent n_tok = batch * seq, K = c.topk;
  Routing<T> r;
  r.tokens = n_tok, r.seq = seq, r.topk = K, r.experts = c.experts, r.global_batch = global_batch;
  r.full_seq = context.full_seq > 0 ? context.full_seq : seq * context.parts;
  r.capacity = expert_capacity(c, r.full_seq);
  // A token picks an expert once, so a capacity of the whole sequence's length never binds.
  if (context.parts > 1 && r.capacity > 0) {
    if (r.capacity < r.full_seq)
      throw Error(op,
                  dtensor::detail::cat("capacity factor ", *c.capacity_factor, " (", r.capacity, " slots per expert for ",
                                       r.full_seq, " tokens) with each sequence split over ", context.parts,
                                       " context ranks: capacity groups are whole sequences, and which choices are dropped "
                                       "depends on every token of the sequence; use dropless routing (no capacity factor)"));
    r.capacity = 0;
  }
  r.expert.resize(std::size_t(n_tok * K));
  r.gate.resize(std::size_t(n_tok * K));
  r.kept.assign(std::size_t(n_tok * K), 1);
  r.choice_fraction.assign(std::size_t(batch * c.experts), 0.0);
  r.routed.assign(std::size_t(c.experts), 0);
  r.load.assign(std::size_t(c.experts), 0);
  return r;
}

/// Group-limited routing's exclusion (see the top): marks taken[e] = 1 for every expert outside
/// the topk_groups best groups of one token's scores p[0, E); `score` is scratch of G entries.
inline void exclude_other_groups(const RouterConfig& c, const double* p, std::vector<char>& taken,
                                 std::vector<double>& score) {
  const Extent G = c.groups, per = c.experts / G;
  score.assign(std::size_t(G), 0.0);
  for (Extent g = 0; g < G; ++g) {
    double first = -std::numeric_limits<double>::infinity(), second = first;
    for (Extent e = g * per; e < (g + 1) * per; ++e)
      if (p[e] > first) second = first, first = p[e];
      else if (p[e] > second) second = p[e];
    score[std::size_t(g)] = per > 1 ? first + second : first;
  }
  std::vector<char> chosen(std::size_t(G), 0);
  for (Extent m = 0; m < c.topk_groups; ++m) {
    Extent best = -1;
    for (Extent g = 0; g < G; ++g)
      if (!chosen[std::size_t(g)] && (best < 0 || score[std::size_t(g)] > score[std::size_t(best)])) best = g;
    // (topk_groups <= groups, check_router_config: a group is always left; the test tells GCC's
    // -O3 -Wstringop-overflow that index -1 is never written)
    if (best < 0) break;
    chosen[std::size_t(best)] = 1;
  }
  for (Extent e = 0; e < c.experts; ++e) taken[std::size_t(e)] = chosen[std::size_t(e / per)] ? 0 : 1;
}

/// Capacity (per sequence: first choices by position, then second choices, ...), the choice
/// fractions f_se (summed over the context parts: the one collective of routing) and, when the
/// scores are known, the losses' shares.
template <class T>
void finish_routing(Routing<T>& r, const RouteContext& context) {
  const Extent batch = r.seq > 0 ? r.tokens / r.seq : 0, E = r.experts, K = r.topk, seq = r.seq;
  std::vector<Extent> used(static_cast<std::size_t>(E));
  for (Extent b = 0; b < batch; ++b) {
    std::fill(used.begin(), used.end(), 0);
    for (Extent j = 0; j < K; ++j)
      for (Extent t = 0; t < seq; ++t) {
        const std::size_t slot = std::size_t((b * seq + t) * K + j);
        const auto e = std::size_t(r.expert[slot]);
        ++r.routed[e];
        r.choice_fraction[std::size_t(b * E) + e] += 1.0 / double(r.full_seq * K);
        if (r.capacity == 0 || used[e] < r.capacity) {
          ++used[e];
          ++r.load[e];
        } else {
          r.kept[slot] = 0;
          ++r.dropped;
        }
      }
  }

  if (context.parts > 1) context.sum_over_parts(std::span<double>(r.choice_fraction));  // f_se of whole sequences
  if (r.scores.empty()) return;  // balanced routing (a dry run): no scores, no losses

  for (Extent b = 0; b < batch; ++b)
    for (Extent e = 0; e < E; ++e) {
      double mean_score = 0;
      for (Extent t = 0; t < seq; ++t) mean_score += r.scores[std::size_t((b * seq + t) * E + e)];
      r.aux_loss += double(E) * r.choice_fraction[std::size_t(b * E + e)] * (mean_score / double(r.full_seq)) /
                    double(r.global_batch);
    }
  for (Extent n = 0; n < r.tokens; ++n) r.z_loss += r.lse[std::size_t(n)] * r.lse[std::size_t(n)];
  if (r.tokens > 0) r.z_loss /= double(r.global_batch * r.full_seq);
}
}  // namespace detail

/// Routes batch * seq tokens (row-major logits [batch * seq, experts]) of a global batch of
/// global_batch sequences; `context`: each sequence split over that many ranks (see the top).
template <class T>
Routing<T> route(std::span<const T> logits, Extent batch, Extent seq, Extent global_batch, const RouterConfig& c,
                 const RouteContext& context = {}) {
  const Extent E = c.experts, K = c.topk;
  if (Extent(logits.size()) != batch * seq * E)
    throw Error("nn::route", dtensor::detail::cat(logits.size(), " logits for ", batch, " x ", seq, " tokens of ", E,
                                                  " experts (global batch ", global_batch, ")"));
  auto r = detail::start_routing<T>("nn::route", batch, seq, global_batch, c, context);
  const Extent n_tok = r.tokens;
  r.logits.assign(logits.begin(), logits.end());
  r.scores.resize(std::size_t(n_tok * E));
  r.lse.resize(std::size_t(n_tok));

  std::vector<char> taken(static_cast<std::size_t>(E));
  std::vector<double> group_score;
  const bool limited = group_limited(c);
  for (Extent n = 0; n < n_tok; ++n) {
    const double* l = r.logits.data() + n * E;
    double* p = r.scores.data() + n * E;
    double top = -std::numeric_limits<double>::infinity();
    for (Extent e = 0; e < E; ++e) top = std::max(top, l[e]);
    double sum = 0;
    for (Extent e = 0; e < E; ++e) sum += std::exp(l[e] - top);
    r.lse[std::size_t(n)] = top + std::log(sum);
    for (Extent e = 0; e < E; ++e)
      p[e] = c.score == RouterScore::softmax ? std::exp(l[e] - r.lse[std::size_t(n)]) : 1.0 / (1.0 + std::exp(-l[e]));
    // Top-k by repeated selection (k is small): the highest score, ties to the lower index,
    // among the experts of the token's best groups when routing is group-limited.
    if (limited) detail::exclude_other_groups(c, p, taken, group_score);
    else std::fill(taken.begin(), taken.end(), 0);
    double chosen_sum = 0;
    for (Extent j = 0; j < K; ++j) {
      Extent best = -1;
      for (Extent e = 0; e < E; ++e)
        if (!taken[std::size_t(e)] && (best < 0 || p[e] > p[best])) best = e;
      taken[std::size_t(best)] = 1;
      r.expert[std::size_t(n * K + j)] = std::int32_t(best);
      chosen_sum += p[best];
    }
    for (Extent j = 0; j < K; ++j) {
      const double g = p[r.expert[std::size_t(n * K + j)]];
      r.gate[std::size_t(n * K + j)] = T(K > 1 && c.normalize_gates ? g / chosen_sum : g);
    }
  }
  detail::finish_routing(r, context);
  return r;
}

/// The j-th choice of token n in the balanced routing a dry run assumes (route_balanced): the
/// token's choices over M groups of the G (G groups of E / G consecutive experts; M =
/// topk_groups when routing is group-limited, else min(topk, G)) spread evenly round the groups
/// (group (n + i x floor(G / M)) mod G for i < M, choice j in the (j mod M)-th), and within a
/// group over its experts likewise (the q-th of the token's c = ceil(topk / M) choices there at
/// (b + q x floor(per / c)) mod per, b = n / G). Every group and every expert then gets the same
/// share of every E consecutive tokens' choices, a token's choices are distinct and within its M
/// groups, and they lie as far apart as the groups allow: without a limit (G = 1: M = 1) the
/// choices of a token are E / topk experts apart, on distinct expert ranks as a real router's
/// mostly are, and with one they stay in M groups, as a group-limited router's do.
inline Extent balanced_expert(const RouterConfig& c, Extent n, Extent j) {
  const Extent G = c.groups, per = c.experts / G;
  const Extent M = group_limited(c) ? c.topk_groups : std::min(c.topk, G);
  const Extent i = j % M, q = j / M, per_group = (c.topk + M - 1) / M;
  const Extent group = (n + i * (G / M)) % G;
  return group * per + (n / G + q * (per / per_group)) % per;
}

/// The routing a dry run assumes (its logits have no values): balanced, the j-th choice of token
/// n is balanced_expert(c, n, j) (group-limited when c is), every gate 1 / topk. Every expert
/// then gets the same share of a rank's choices (when E divides its tokens), so every rank sends
/// and receives the same rows (what parallel::exchange_counts assumes on a memory space without
/// data), and a token's choices reach the expert ranks a router with c's limit would let them
/// (the merged dispatch's units). Capacity applies as in route(); the auxiliary losses are not
/// computed (no scores).
template <class T>
Routing<T> route_balanced(Extent batch, Extent seq, Extent global_batch, const RouterConfig& c,
                          const RouteContext& context = {}) {
  auto r = detail::start_routing<T>("nn::route_balanced", batch, seq, global_batch, c, context);
  const auto K = std::size_t(c.topk);
  for (std::size_t slot = 0; slot < r.expert.size(); ++slot) {
    r.expert[slot] = std::int32_t(balanced_expert(c, Extent(slot / K), Extent(slot % K)));
    r.gate[slot] = T(1.0 / double(c.topk));
  }
  detail::finish_routing(r, context);
  return r;
}

/// d/dlogits [tokens * experts] of sum dgate * gate + aux_loss_coeff * aux + z_loss_coeff * z.
template <class T>
std::vector<T> route_backward(const Routing<T>& r, std::span<const T> dgate, const RouterConfig& c) {
  const Extent E = r.experts, K = r.topk;
  if (Extent(dgate.size()) != r.tokens * K)
    throw Error("nn::route_backward",
                dtensor::detail::cat(dgate.size(), " gate gradients for ", r.tokens, " tokens x topk ", K));
  std::vector<T> out(std::size_t(r.tokens * E));
  std::vector<double> dscore(static_cast<std::size_t>(E)), dl(static_cast<std::size_t>(E));
  const bool normalized = K > 1 && c.normalize_gates;
  for (Extent n = 0; n < r.tokens; ++n) {
    const double* p = r.scores.data() + n * E;
    std::fill(dscore.begin(), dscore.end(), 0.0);
    // Gates: g_j = p_j (/ Z, Z = sum of the chosen p): dp_m = (dg_m - sum_j dg_j g_j) / Z.
    double z = 0, dot = 0;
    for (Extent j = 0; j < K; ++j) {
      z += p[r.expert[std::size_t(n * K + j)]];
      dot += double(dgate[std::size_t(n * K + j)]) * double(r.gate[std::size_t(n * K + j)]);
    }
    for (Extent j = 0; j < K; ++j) {
      const double dg = double(dgate[std::size_t(n * K + j)]);
      dscore[std::size_t(r.expert[std::size_t(n * K + j)])] += normalized ? (dg - dot) / z : dg;
    }
    // Aux: d/dp_te = coeff * E * f_se / (seq * global_batch).
    const Extent b = n / r.seq;
    for (Extent e = 0; e < E; ++e)
      dscore[std::size_t(e)] += c.aux_loss_coeff * double(E) * r.choice_fraction[std::size_t(b * E + e)] /
                                double(r.full_seq * r.global_batch);
    // Through the scores to the logits.
    if (c.score == RouterScore::softmax) {
      double s = 0;
      for (Extent e = 0; e < E; ++e) s += dscore[std::size_t(e)] * p[e];
      for (Extent e = 0; e < E; ++e) dl[std::size_t(e)] = p[e] * (dscore[std::size_t(e)] - s);
    } else {
      for (Extent e = 0; e < E; ++e) dl[std::size_t(e)] = dscore[std::size_t(e)] * p[e] * (1 - p[e]);
    }
    // z: d/dl_te = coeff * 2 lse_t softmax(l_t)_e / (global_batch * seq).
    const double lse = r.lse[std::size_t(n)], zscale = c.z_loss_coeff * 2 * lse / double(r.global_batch * r.full_seq);
    for (Extent e = 0; e < E; ++e) {
      dl[std::size_t(e)] += zscale * std::exp(r.logits[std::size_t(n * E + e)] - lse);
      out[std::size_t(n * E + e)] = T(dl[std::size_t(e)]);
    }
  }
  return out;
}

}  // namespace dtensor::nn
