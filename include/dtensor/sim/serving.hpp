// dtensor/sim/serving.hpp — what a rank holds to serve a model (models::generate with its KV
// cache) under tensor, pipeline and context parallelism: weights and KV cache for batch x context.
//
//   sim::ModelShape m{.layers = 80, .dim = 8192, .heads = 64, .kv_heads = 8, .ffn = 28672, .vocab = 128256,
//                     .seq = 8192, .llama = true};
//   auto s = sim::serving_memory(m, {.batch = 8, .context = 8192, .tp = 8, .pp = 2, .bytes = 2});
//   s.weights; s.kv_cache; s.kv_per_token; s.total;   // bytes on the busiest rank
//   plan_at_scale --arch llama ... --tp 8 --pp 2 --serve 8,8192 --dtype bf16   // prints it
//
// Per rank of the busiest pipeline stage (the first ceil(layers / pp) blocks, the embedding on
// the first stage and the final norm and head on the last: with pp = 1 one rank has all):
//   weights   = the blocks' matrices / tp (Megatron's column/row split: qkv, proj, fc1/w13, fc2/w2)
//               + the column-wise biases / tp (qkv, fc1) + the row-wise biases and norms whole
//               + the embedding's and head's vocab x dim / tp (vocab-parallel) + the position
//               table and final norm whole (tp dividing vocab, heads and ffn: exact);
//   KV cache  = 2 (keys, values) x blocks on the stage x kv_heads / tp x head_dim x bytes per
//               token (nn::SelfAttention::KvCache: rotated keys and values of the KV heads, not
//               repeated; kv_heads % tp == 0 as the model requires), times batch x ceil(context / cp):
//               under context parallelism the cache stays split over the cp ranks, within one row
//               of each other (parallel::ContextAttention::prefill / decode); the weights do not split.
//               MLA (ModelShape::kv_lora_rank): every head's rotated key (nope + rope) and value
//               (v_head_dim) per position, as nn::MultiHeadLatentAttention::KvCache keeps them (not
//               the latent c_KV); its down-projections and latent norms whole on every tp rank; no
//               context parallelism (an Error: its cache is not split).
// Activations of a decode step (one position) are O(batch x dim) and not counted; the prefill's
// are a forward's (the training dry run's forward peak). test_llama checks weights and KV cache
// against a real models::GPT / models::Llama under TP 2: its local parameters and its caches after a
// generation.
//
//   auto t = sim::serving_latency(m, {.batch = 8, .context = 8192, .tp = 8, .pp = 2, .bytes = 2}, hardware);
//   t.prefill; t.decode;   // seconds: the prompts; one generated token of every sequence
//
// Latency, from the dry run's cost model (sim/cost_model.hpp: the roofline of op_seconds, the
// link model of collective_seconds, its Calibration). One batch in flight, so the pipeline's
// stages run in turn (a server overlapping batches across stages raises throughput, not one
// token's latency); per stage (its blocks; the embedding on the first, the head on the last):
//   decode step: max(FLOPs / (peak x gemm_efficiency), bytes / (HBM x hbm_fraction)) with bytes =
//                the stage's weights per rank + its KV cache of batch x context (every weight and
//                cached key and value is read once per token: memory-bound at small batch), FLOPs =
//                2 x batch x the stage's matrix parameters / tp + 4 x batch x context x the query
//                width / tp per block (scores and values against the cache);
//   prefill:     FLOPs = 2 x batch x context x matrices / tp + causal attention (2 x batch x context^2
//                x query width / tp per block) at attention_fraction of peak, against the weights
//                and the cache written;
//   TP (tp > 1): per block 2 all-reduces of the positions' activations (after the attention and
//                the MLP; with SP a reduce-scatter + all-gather, the same bytes), 1 for the
//                vocab-parallel embedding, and an all-gather of the logits (batch x vocab) for the
//                sampler, on NVLink when every tp group lies inside a node (the mesh (pp, cp, tp)
//                row-major over the ranks: sim::Topology), else the network;
//   PP (pp > 1): pp - 1 sends of the positions' activations (batch x positions x dim);
//   CP (cp > 1): each rank reads and attends to ceil(context / cp) cached positions and computes
//                the prefill's GEMMs on ceil(context / cp) positions; per block a decode step adds
//                ContextAttention::decode's 3 all-gathers on "cp" (the new q, k, v: batch x (query +
//                2 KV widths) / tp; the partial outputs: cp x batch x query width / tp; their
//                log-sum-exps: cp x batch x heads / tp floats), and the prefill ring attention's
//                cp - 1 exchanges of a rank's K and V shard (on NVLink when every cp group lies
//                inside a node).
// Not modelled: kernel launch overheads (real decode at batch 1 is often launch-bound on small
// models: CUDA graphs hide them), speculative decoding, paged-cache fragmentation. No published
// serving latency was checked against (none was at hand with its exact setup); test_llama checks
// the parts against hand-computed roofline and link figures.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>

#include "dtensor/core/error.hpp"
#include "dtensor/sim/analytic.hpp"
#include "dtensor/sim/cost_model.hpp"
#include "dtensor/sim/device.hpp"

namespace dtensor::sim {

struct ServingShape {
  std::int64_t batch = 1;    // sequences decoded together
  std::int64_t context = 1;  // positions cached per sequence (prompt + generated, at most the model's seq)
  int tp = 1, pp = 1, cp = 1;
  double bytes = 2;          // per element of weights and cache (bf16: 2, f32: 4)
};

namespace detail {
/// The cached positions of the busiest context rank: ceil(context / cp).
inline std::int64_t context_share(const ServingShape& s) { return (s.context + s.cp - 1) / s.cp; }
/// A block's weight matrices split over tp (MLA: its up-projections and o_proj; its
/// down-projections are whole on every rank, with the vectors).
inline double serving_matrices(const ModelShape& m) {
  const double h = double(m.dim), kvd = double(m.kv() * m.head_dim()), f = double(m.width());
  if (m.mla()) return m.mla_split_params() + 3 * h * f;
  return m.llama ? h * (h + 2 * kvd) + h * h + 3 * h * f : h * (h + 2 * kvd) + h * h + 2 * h * f;
}
/// A block's cached features per position, all heads: 2 kv_heads x head_dim (MLA: every head's
/// key of nope + rope and value of v_head_dim features, as its forward_cached keeps them).
inline double kv_width(const ModelShape& m) {
  return m.mla() ? double(m.heads) * double(m.qk_head_dim() + m.v_dim()) : 2.0 * double(m.kv() * m.head_dim());
}
}  // namespace detail

struct ServingMemory {
  double weights = 0;       // on the busiest rank
  double kv_per_token = 0;  // one position of one sequence, this rank's layers and heads
  double kv_cache = 0;      // kv_per_token x batch x ceil(context / cp)
  double total = 0;         // weights + kv_cache
  std::int64_t layers = 0;  // blocks on the busiest stage
};

inline ServingMemory serving_memory(const ModelShape& m, const ServingShape& s) {
  constexpr const char* op = "sim::serving_memory";
  if (s.tp < 1 || s.pp < 1 || s.cp < 1 || s.batch < 1 || s.context < 1 || s.bytes <= 0)
    throw Error(op, dtensor::detail::cat("tp ", s.tp, ", pp ", s.pp, ", cp ", s.cp, ", batch ", s.batch, ", context ",
                                         s.context, ", bytes ", s.bytes, ": all must be positive"));
  if (m.kv() % s.tp != 0 || m.layers < s.pp)
    throw Error(op, dtensor::detail::cat(m.kv(), " KV heads over tp ", s.tp, " (must divide), ", m.layers,
                                         " layers over pp ", s.pp, " (at least one each)"));
  if (s.context > m.seq)
    throw Error(op, dtensor::detail::cat("context ", s.context, " is beyond the model's ", m.seq, " positions"));
  check_mla_shape(m, op);
  // MLA's cache is every head's whole keys and values (nn/latent_attention.hpp), not a split one.
  if (m.mla() && s.cp > 1)
    throw Error(op, dtensor::detail::cat("cp ", s.cp,
                                         ": multi-head latent attention has no KV cache split over "
                                         "context ranks"));
  const double h = double(m.dim), kvd = double(m.kv() * m.head_dim()), f = double(m.width()), v = double(m.vocab);
  const double matrices = detail::serving_matrices(m);
  // Column-wise biases split with their rows (qkv, fc1); row-wise biases and norms whole (MLA:
  // its down-projections and latent norms too).
  const double vectors = m.llama ? 2 * h + (m.mla() ? m.mla_whole_params() : 0) : (h + 2 * kvd + f) / s.tp + 6 * h;
  ServingMemory r;
  r.layers = (m.layers + s.pp - 1) / s.pp;
  const double embed = v * h / s.tp + (m.llama ? 0 : double(m.seq) * h);
  const double head = v * h / s.tp + (m.llama ? h : 2 * h);
  const double ends = s.pp == 1 ? embed + head : std::max(embed, head);
  r.weights = (double(r.layers) * (matrices / s.tp + vectors) + ends) * s.bytes;
  r.kv_per_token = double(r.layers) * (detail::kv_width(m) / s.tp) * s.bytes;
  r.kv_cache = r.kv_per_token * double(s.batch) * double(detail::context_share(s));
  r.total = r.weights + r.kv_cache;
  return r;
}

struct ServingLatency {
  double prefill = 0;        // seconds: the batch's prompts of `context` positions, every stage in turn
  double decode = 0;         // seconds per decode step: one new token for each of the batch's sequences
  double decode_memory = 0;  // of decode: the stages' weights and KV cache at HBM bandwidth
  double decode_compute = 0; // of decode: the stages' FLOPs (the larger of the two per stage is paid)
  double decode_tp = 0;      // of decode: the TP all-reduces and the logits' all-gather
  double decode_pp = 0;      // of decode: the sends between stages
  double decode_cp = 0;      // of decode: the context ranks' all-gathers (query, partial outputs and statistics)
};

inline ServingLatency serving_latency(const ModelShape& m, const ServingShape& s, const Hardware& hw,
                                      const Calibration& cal = calibration) {
  serving_memory(m, s);  // the same checks
  const double h = double(m.dim), kvd = double(m.kv() * m.head_dim()), f = double(m.width()), v = double(m.vocab);
  // q: the query-key and value products' width per position (MLA: H (qk + v) / 2, the mean).
  const double q = m.mla() ? double(m.heads) * double(m.qk_head_dim() + m.v_dim()) / 2 : double(m.heads * m.head_dim());
  const double b = s.bytes, batch = double(s.batch);
  const double ctx = double(detail::context_share(s));  // this rank's cached positions (all but under CP)
  const double matrices = detail::serving_matrices(m);
  // MLA's whole down-projections run on every tp rank, their FLOPs not divided.
  const double whole = m.mla() ? m.mla_whole_params() : 0;
  const double vectors = m.llama ? 2 * h + whole : (h + 2 * kvd + f) / s.tp + 6 * h;
  const double hbm = hw.hbm_bytes_per_second * cal.hbm_fraction;
  // The serving mesh (pp, cp, tp), row-major over the ranks: each group's link from where its
  // ranks sit (sim::Topology; NVLink when every group of the dimension lies inside a node).
  const Topology topology(std::array<std::string_view, 3>{"pp", "cp", "tp"}, std::array{s.pp, s.cp, s.tp}, hw);
  const Link &tp_link = topology.link("tp"), &cp_link = topology.link("cp"), &pp_link = topology.link("pp");
  auto collective = [&](CollectiveKind kind, int n, double bytes, const Link& link) {
    return collective_seconds(CommRecord{kind, "", n, std::size_t(bytes)}, link, cal);
  };
  ServingLatency r;
  for (int stage = 0; stage < s.pp; ++stage) {
    // Blocks split as evenly as they go, the first stages taking one more.
    const double blocks = double(m.layers / s.pp + (stage < m.layers % s.pp ? 1 : 0));
    const bool first = stage == 0, last = stage == s.pp - 1;
    const double ends = (first ? v * h / s.tp + (m.llama ? 0 : double(m.seq) * h) : 0) +
                        (last ? v * h / s.tp + (m.llama ? h : 2 * h) : 0);
    const double weights = (blocks * (matrices / s.tp + vectors) + ends) * b;
    const double kv_per_position = blocks * detail::kv_width(m) / s.tp * b;
    const double head_flops = last ? 2 * v * h / s.tp : 0;  // the logits; the embedding is a gather
    // Decode: one position per sequence against `context` cached ones.
    const double d_flops =
        batch * (2 * blocks * matrices / s.tp + 2 * blocks * whole + head_flops + 4 * blocks * ctx * q / s.tp);
    const double d_bytes = weights + kv_per_position * batch * ctx;
    const double d_compute = d_flops / (hw.sustained_flops() * gemm_efficiency(d_bytes > 0 ? d_flops / d_bytes : 0, cal));
    r.decode_memory += d_bytes / hbm;
    r.decode_compute += d_compute;
    r.decode += std::max(d_compute, d_bytes / hbm);
    // Prefill: the prompts' positions at once, causal attention among them.
    const double tokens = batch * ctx;
    const double p_gemm = tokens * (2 * blocks * matrices / s.tp + 2 * blocks * whole + head_flops);
    const double p_bytes = weights + kv_per_position * tokens;
    const double p_attn = blocks * 2 * batch * ctx * double(s.context) * q / s.tp;  // this rank's queries, all keys (causal: half)
    r.prefill += std::max(p_gemm / (hw.sustained_flops() * gemm_efficiency(p_gemm / p_bytes, cal)) +
                              p_attn / (hw.sustained_flops() * cal.attention_fraction),
                          p_bytes / hbm);
    if (s.tp > 1) {
      const double all_reduces = 2 * blocks + (first ? 1 : 0);
      const double d_tp = all_reduces * collective(CollectiveKind::all_reduce, s.tp, batch * h * b, tp_link) +
                          (last ? collective(CollectiveKind::all_gather, s.tp, batch * v * b, tp_link) : 0);
      r.decode_tp += d_tp;
      r.decode += d_tp;
      r.prefill += all_reduces * collective(CollectiveKind::all_reduce, s.tp, tokens * h * b, tp_link) +
                   (last ? collective(CollectiveKind::all_gather, s.tp, batch * v * b, tp_link) : 0);
    }
    if (s.cp > 1) {
      const double d_cp = blocks * (collective(CollectiveKind::all_gather, s.cp, batch * (q + 2 * kvd) / s.tp * b, cp_link) +
                                    collective(CollectiveKind::all_gather, s.cp, s.cp * batch * q / s.tp * b, cp_link) +
                                    collective(CollectiveKind::all_gather, s.cp, s.cp * batch * double(m.heads) / s.tp * 4, cp_link));
      r.decode_cp += d_cp;
      r.decode += d_cp;
      r.prefill += blocks * (s.cp - 1) * collective(CollectiveKind::send_recv, 2, 2 * batch * ctx * kvd / s.tp * b, cp_link);
    }
    if (!last) {
      const double d_pp = collective(CollectiveKind::send, 2, batch * h * b, pp_link);
      r.decode_pp += d_pp;
      r.decode += d_pp;
      r.prefill += collective(CollectiveKind::send, 2, tokens * h * b, pp_link);
    }
  }
  return r;
}

}  // namespace dtensor::sim
