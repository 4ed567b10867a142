// dtensor/sim/analytic.hpp — a plan's step time and memory from formulas, in microseconds of
// CPU: what `plan_at_scale --search` ranks thousands of plans with before it dry-runs the best.
//
//   sim::ModelShape m{.layers = 126, .dim = 16384, .heads = 128, .kv_heads = 8, .ffn = 53248,
//                     .vocab = 128256, .seq = 8192, .llama = true};
//   sim::PlanShape p{.batch = 2048, .microbatch = 1, .dp = 128, .tp = 8, .pp = 16, .zero = 1,
//                    .schedule = "interleaved", .stages_per_rank = 2};
//   auto a = sim::analytic_estimate(m, p, sim::device("h100"));
//   a.step_seconds;  a.memory_bytes;  a.fits;  a.model_flops;
//
// Times come from the same pieces as the dry run's estimate (sim/cost_model.hpp): the meta
// kernels' records a block's GEMMs and attention would make (op_seconds, one calibration) and the
// collectives the plan issues (collective_seconds, the same links and overlap roles). Per layer
// and micro-batch (tokens n = b s / cp on a rank): the four GEMMs of a block (qkv, proj, fc1/up
// and gate, fc2/down) forward, twice each backward, once more forward under full recompute;
// attention over the causal pairs; memory-bound ops as `pointwise_bytes_per_token_dim` bytes per
// token and width (fitted to the dry run's meta records); TP+SP 2 all-gathers and 2
// reduce-scatters per layer and direction, and in backward 2 more all-gathers (the column-wise
// Linears' saved input shards; all-reduces without SP); context ring / all-gather;
// pipeline sends. The pipeline's time is (m + (p - 1) / v) (F + B) (1F1B, interleaved), plus
// once per step the gradient reduction (behind the last backward), the optimizer and ZeRO's
// parameter sync. Memory: model states per ZeRO stage (fully_shard's bytes per parameter, as the
// ledger shows them), saved activations per layer (Korthikanti's terms for our modules, or one
// block input under recompute) times the micro-batches the first pipeline rank holds, plus the
// last stage's logits. test_sim checks these against the dry run for several plans.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "dtensor/core/checked.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/sim/cost_model.hpp"

namespace dtensor::sim {

/// A GPT (LayerNorm, GELU MLP, biases, learned positions) or Llama (RMSNorm, SwiGLU, GQA, no
/// biases) model's shape.
struct ModelShape {
  std::int64_t layers = 1, dim = 1, heads = 1, kv_heads = 0, ffn = 0, vocab = 1, seq = 1;
  bool llama = false;
  std::int64_t kv() const { return kv_heads ? kv_heads : heads; }
  std::int64_t width() const { return ffn ? ffn : 4 * dim; }
  std::int64_t head_dim() const { return dim / heads; }
  /// Parameters of one block.
  double block_params() const {
    const double h = double(dim), kvd = double(kv() * head_dim()), f = double(width());
    if (llama) return h * (h + 2 * kvd) + h * h + 3 * h * f + 2 * h;
    return h * (h + 2 * kvd) + (h + 2 * kvd) + h * h + h + 2 * h * f + f + h + 4 * h;
  }
  /// All parameters: blocks, embedding (and learned positions), final norm, untied head.
  double params() const {
    const double h = double(dim), v = double(vocab);
    return double(layers) * block_params() + v * h + (llama ? 0 : double(seq) * h) + (llama ? h : 2 * h) + v * h;
  }
  /// The model FLOPs of one token (PaLM's count, as MFU is quoted): 6 x the parameters a token
  /// multiplies (no embedding lookup) + 12 L h s for attention.
  double model_flops_per_token() const {
    const double h = double(dim), v = double(vocab);
    return 6 * (double(layers) * block_params() + v * h) + 12 * double(layers) * h * double(seq);
  }
};

/// A plan as the search enumerates it (a subset of models/training_plan.hpp's TrainingPlan).
struct PlanShape {
  std::int64_t batch = 1;       // sequences per step
  std::int64_t microbatch = 1;  // sequences per micro-batch per data rank
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int zero = 0;                 // 0 DDP (AdamW in the model's dtype), 1..3 fully_shard (fp32 master)
  bool sp = true;               // sequence parallelism with tp
  bool recompute = false;       // full activation recomputation of every block
  bool selective = false;       // Korthikanti's selective recomputation: the attention core only
  // The software the plan runs on (dtensor's own: fused attention, overlapped gradient
  // reduction; the Megatron-LM of Narayanan 2021 / Korthikanti 2022: neither).
  bool fused_attention = true;  // false: scores in HBM (QK^T, softmax, dropout, AV as separate kernels)
  bool overlap_gradient_reduction = true;
  std::string schedule = "1f1b";
  int stages_per_rank = 1;      // interleaved: v
  std::string cp_kind = "ring"; // ring or allgather
  bool bf16 = true;

  std::int64_t gpus() const {
    return checked_product<std::int64_t>(std::array<std::int64_t, 4>{dp, tp, pp, cp}, "sim::PlanShape", "GPUs");
  }
  int microbatches() const { return int(batch / (std::int64_t(dp) * microbatch)); }
};

/// The memory reserve a plan must leave free of the device's memory: allocator fragmentation,
/// NCCL and CUDA workspaces, what the ledger does not see (stated in docs/dry-run.md).
inline constexpr double memory_reserve_fraction = 0.10;

/// Whether `bytes` fit the device with the reserve.
inline bool fits(double bytes, const Hardware& hw) { return bytes <= hw.memory_bytes * (1 - memory_reserve_fraction); }

struct AnalyticEstimate {
  double forward = 0, backward = 0;        // one micro-batch on one rank's stages, exposed communication included
  double compute_per_microbatch = 0;       // of which compute
  double tp_seconds = 0, cp_seconds = 0, pp_seconds = 0, gather_seconds = 0;  // exposed, per step
  double pipeline_seconds = 0, bubble_seconds = 0;
  double gradient_reduction = 0, optimizer = 0, parameter_sync = 0;  // once per step, exposed
  double step_seconds = 0;
  double model_states = 0, activations = 0, logits = 0, memory_bytes = 0;
  bool fits = false;
  double model_flops = 0;  // per step, all GPUs (PaLM's count)
  double mfu = 0, tokens_per_second = 0;
};

/// Memory-bound traffic per token and model width of one block's forward (norms, residual
/// adds, bias, activation function, casts), bytes: fitted once to the dry run's meta records of
/// our modules (test_sim "the analytic estimate follows the dry run"); backward moves twice.
inline constexpr double pointwise_bytes_per_token_dim = 40;

/// Throws when a model's element counts (a step's activations, its weights, its embedding)
/// overflow int64: a dry run's tensors count elements in int64.
inline void check_model_sizes(const ModelShape& m, std::int64_t batch, const char* op) {
  (void)checked_product<std::int64_t>(std::array<std::int64_t, 3>{batch, m.seq, m.dim}, op, "batch x seq x dim");
  (void)checked_product<std::int64_t>(std::array<std::int64_t, 4>{m.layers, m.dim, m.width(), 4}, op, "layers x dim x ffn x 4");
  (void)checked_product<std::int64_t>(std::array<std::int64_t, 3>{batch, m.seq, m.vocab}, op, "batch x seq x vocab");
}

/// Throws naming the field when the plan cannot be one for this model.
inline void check_plan_shape(const ModelShape& m, const PlanShape& p) {
  const char* op = "sim::analytic_estimate";
  (void)p.gpus();
  if (m.layers < 1 || m.dim < 1 || m.heads < 1 || m.vocab < 1 || m.seq < 1 || m.dim % m.heads != 0)
    throw Error(op, dtensor::detail::cat("model: layers ", m.layers, ", dim ", m.dim, ", heads ", m.heads, ", vocab ",
                                         m.vocab, ", seq ", m.seq, ": positive, dim a multiple of heads"));
  if (p.microbatch < 1 || p.batch % (std::int64_t(p.dp) * p.microbatch) != 0)
    throw Error(op, dtensor::detail::cat("batch ", p.batch, " is not a multiple of dp ", p.dp, " x micro-batch ", p.microbatch));
  if (m.heads % p.tp != 0) throw Error(op, dtensor::detail::cat("heads ", m.heads, " not a multiple of tp ", p.tp));
  if (p.stages_per_rank < 1 || m.layers < std::int64_t(p.pp) * p.stages_per_rank)
    throw Error(op, dtensor::detail::cat(m.layers, " layers over pp ", p.pp, " x ", p.stages_per_rank, " stages"));
  if (p.zero < 0 || p.zero > 3) throw Error(op, dtensor::detail::cat("zero ", p.zero));
  check_model_sizes(m, p.batch, op);
}

/// The plan's step and memory from formulas (see the synopsis).
inline AnalyticEstimate analytic_estimate(const ModelShape& m, const PlanShape& p, const Hardware& hw_in,
                                          const Calibration& cal = calibration) {
  check_plan_shape(m, p);
  Hardware hw = hw_in;
  hw.fp32 = !p.bf16;
  const Topology topo(std::array<std::string_view, 4>{"pp", "dp", "cp", "tp"}, std::array{p.pp, p.dp, p.cp, p.tp}, hw);
  const double e = p.bf16 ? 2 : 4;
  const double t = p.tp, h = double(m.dim), f = double(m.width()), hd = double(m.head_dim());
  const double kvd = double(m.kv()) * hd, b = double(p.microbatch), s = double(m.seq);
  const double n = b * s / p.cp;  // tokens of a micro-batch on a rank
  const int mb = p.microbatches(), v = p.stages_per_rank;
  const double layers_per_rank = double(m.layers) / p.pp;
  auto gemm = [&](double rows, double k, double cols) {
    kernels::meta::CostRecord r{"gemm", std::int64_t(2 * rows * k * cols), std::int64_t(e * (rows * k + k * cols)),
                                std::int64_t(e * rows * cols)};
    return op_seconds(r, hw, cal);
  };
  // One block's forward GEMMs on a rank (the dW and dX GEMMs of backward have the same sizes).
  const double mlp = m.llama ? gemm(n, h, 2 * f / t) + gemm(n, f / t, h) : gemm(n, h, f / t) + gemm(n, f / t, h);
  const double gemms = gemm(n, h, (h + 2 * kvd) / t) + gemm(n, h / t, h) + mlp;
  // Attention over the causal (query, key) pairs of this rank's queries: a rank holds n / b
  // queries of each sequence, and under load balancing each sees half the keys on average.
  const double bh = b * double(m.heads) / t, pairs = (s / p.cp) * s / 2;
  const double qkv_bytes = e * n * (h + 2 * kvd) / t;
  double attn_fwd = 0, attn_bwd = 0;
  if (p.fused_attention) {
    attn_fwd = op_seconds({"attention", std::int64_t(bh * pairs * 4 * hd), std::int64_t(qkv_bytes), std::int64_t(e * n * h / t)}, hw, cal);
    attn_bwd = op_seconds({"attention_backward", std::int64_t(bh * pairs * 10 * hd), std::int64_t(2 * qkv_bytes), std::int64_t(qkv_bytes)}, hw, cal);
  } else {
    // Scores in HBM (every query against every key, the causal mask applied to them): two
    // batched GEMMs of inner size head_dim and the sequence, and the memory-bound passes over
    // the scores (write; scale-mask-softmax read and write; dropout read, write and a 1-byte
    // mask; read by the second GEMM): 13 bytes per score forward, twice that backward.
    const double sq = s / p.cp, scores = bh * sq * s;
    auto batched = [&](double rows, double k, double cols) {
      return op_seconds({"gemm", std::int64_t(2 * bh * rows * k * cols), std::int64_t(e * bh * (rows * k + k * cols)),
                         std::int64_t(e * bh * rows * cols)}, hw, cal);
    };
    const double core_gemms = batched(sq, hd, s) + batched(sq, s, hd);
    const double core_bytes = op_seconds({"softmax", 0, std::int64_t(13 * scores), 0}, hw, cal);
    attn_fwd = core_gemms + core_bytes;
    attn_bwd = 2 * core_gemms + 2 * core_bytes + (p.selective ? attn_fwd : 0);
  }
  const double pointwise = op_seconds({"add_", 0, std::int64_t(pointwise_bytes_per_token_dim * n * h / (p.sp ? t : 1)), 0}, hw, cal);
  // Tensor and context communication per layer, one direction.
  auto coll = [&](CollectiveKind k, const char* group, int size, double bytes) {
    CommRecord r{};
    r.kind = k;
    r.group = group;
    r.group_size = size;
    r.bytes = std::size_t(bytes);
    return collective_seconds(r, topo.link(group), cal);
  };
  const double act = e * n * h;  // a block input, gathered
  const double tp_layer = p.tp == 1 ? 0
                          : p.sp  ? 2 * coll(CollectiveKind::all_gather, "tp", p.tp, act) + 2 * coll(CollectiveKind::reduce_scatter, "tp", p.tp, act)
                                  : 2 * coll(CollectiveKind::all_reduce, "tp", p.tp, act);
  double cp_layer = 0, cp_hidden = 0;
  if (p.cp > 1) {
    const double kv_chunk = e * n * kvd / std::max(1.0, std::min(t, double(m.kv())));
    if (p.cp_kind == "allgather") cp_layer = 2 * coll(CollectiveKind::all_gather, "cp", p.cp, kv_chunk * p.cp);
    else cp_hidden = 2 * (p.cp - 1) * coll(CollectiveKind::send_recv, "cp", p.cp, kv_chunk);
  }
  const double fwd_compute = gemms + attn_fwd + pointwise;
  const double bwd_compute = 2 * gemms + attn_bwd + 2 * pointwise + (p.recompute ? fwd_compute : 0);
  const double fwd_layer = fwd_compute + tp_layer + cp_layer + std::max(0.0, cp_hidden - attn_fwd);
  // Under SP the column-wise Linears (qkv, fc1) gather their saved input shard again in backward
  // (nn/linear.hpp): two more all-gathers, exposed like every TP collective here.
  const double tp_regather = p.tp > 1 && p.sp ? 2 * coll(CollectiveKind::all_gather, "tp", p.tp, act) : 0;
  const double bwd_layer =
      bwd_compute + (p.recompute ? 2 : 1) * (tp_layer + cp_layer) + tp_regather + std::max(0.0, 2 * cp_hidden - attn_bwd);
  // The head (logits GEMM, vocab-parallel over tp) and the pipeline sends, per micro-batch.
  const double head = gemm(n, h, double(m.vocab) / t);
  const double send = p.pp == 1 ? 0 : coll(CollectiveKind::send, "pp", p.pp, act / (p.sp ? t : 1));
  // ZeRO-3: every unit gathered each micro-batch forward and backward, prefetched behind compute.
  const double rank_params = m.params() / (double(p.pp) * t);
  const double gather = p.zero == 3 && p.dp > 1 ? coll(CollectiveKind::all_gather, "dp", p.dp, 4 * rank_params) / layers_per_rank : 0;
  AnalyticEstimate a;
  const double per_layer_f = fwd_layer + std::max(0.0, gather - fwd_compute);
  const double per_layer_b = bwd_layer + std::max(0.0, gather - bwd_compute);
  // The slowest pipeline rank: the last (its layers and the head; uneven splits round up).
  const double layers_max = std::ceil(layers_per_rank);
  a.forward = layers_max * per_layer_f + head + send * v;
  a.backward = layers_max * per_layer_b + 2 * head + send * v;
  a.compute_per_microbatch = layers_max * (fwd_compute + bwd_compute) + 3 * head;
  a.tp_seconds = mb * layers_max * (tp_layer * (p.recompute ? 3 : 2) + tp_regather);
  a.cp_seconds = mb * layers_max * (2 * cp_layer + std::max(0.0, cp_hidden - attn_fwd) + std::max(0.0, 2 * cp_hidden - attn_bwd));
  a.pp_seconds = mb * 2 * send * v;
  a.gather_seconds = mb * layers_max * (std::max(0.0, gather - fwd_compute) + std::max(0.0, gather - bwd_compute));
  const double per_microbatch = a.forward + a.backward;
  a.pipeline_seconds = (mb + double(p.pp - 1) / v) * per_microbatch;
  a.bubble_seconds = double(p.pp - 1) / v * per_microbatch;
  // Once per step: the gradient reduction (fp32 reduce-scatter under ZeRO, bf16 all-reduce
  // under DDP) behind the last backward, the optimizer (memory-bound), ZeRO's parameter sync.
  const double d = p.dp;
  if (p.dp > 1) {
    const double reduction = p.zero >= 1 ? coll(CollectiveKind::reduce_scatter, "dp", p.dp, 4 * rank_params)
                                         : coll(CollectiveKind::all_reduce, "dp", p.dp, e * rank_params);
    // Behind the last micro-batch's backward *compute*, as the dry run's estimate hides it
    // (sim::comm_role): its exposed TP collectives do not hide the reduction.
    const double backward_compute = (layers_max * bwd_compute + 2 * head) / v;
    a.gradient_reduction = p.overlap_gradient_reduction ? std::max(0.0, reduction - backward_compute) : reduction;
    if (p.zero == 1 || p.zero == 2) a.parameter_sync = coll(CollectiveKind::all_gather, "dp", p.dp, e * rank_params);
  }
  const double shard = p.zero >= 1 ? rank_params / d : rank_params;
  a.optimizer = op_seconds({"adamw_update", std::int64_t(12 * shard), std::int64_t((p.zero >= 1 ? 36 : 5 * e) * shard), 0}, hw, cal);
  a.step_seconds = a.pipeline_seconds + a.gradient_reduction + a.optimizer + a.parameter_sync;
  // Memory of the first pipeline rank (the most micro-batches in flight) and the last's logits.
  if (p.zero == 0) a.model_states = rank_params * (e + e + 2 * e);  // values, gradients, AdamW moments in T
  else {
    // ZeRO-1 keeps its fp32 gradient shard inside the full gradients' storage (issue 27).
    const double values = p.zero == 3 ? 0 : 2, full_grads = p.zero == 1 ? 2 : 0, shard = p.zero == 1 ? 12 : 16;
    a.model_states = rank_params * (values + full_grads + shard / d) + (p.zero >= 2 ? 2 * rank_params / layers_per_rank : 0);
  }
  // GPT's terms (Llama's too; docs/dry-run.md, Korthikanti Table 2): under SP every saved value is
  // this rank's 1/t, the column-wise Linears' inputs included (nn/linear.hpp).
  const double block_saved = (p.sp ? n * h * 34 / t : n * h * (8 + 26 / t)) * (e / 2);
  const double saved_layer = p.recompute ? e * n * h / (p.sp ? t : 1) : block_saved;
  const double in_flight = p.pp == 1 ? 1 : std::min(double(mb) * v, double(p.pp) * v + (v > 1 ? p.pp : 0));
  const double recompute_peak = p.recompute ? block_saved : 0;
  a.activations = saved_layer * layers_per_rank * in_flight / v + recompute_peak;
  a.logits = 4 * n * double(m.vocab) / t;
  a.memory_bytes = a.model_states + a.activations + a.logits;
  a.fits = fits(a.memory_bytes, hw);
  a.model_flops = m.model_flops_per_token() * double(p.batch) * s;
  a.tokens_per_second = double(p.batch) * s / a.step_seconds;
  a.mfu = a.model_flops / a.step_seconds / (double(p.gpus()) * hw.peak_flops());
  return a;
}

}  // namespace dtensor::sim
