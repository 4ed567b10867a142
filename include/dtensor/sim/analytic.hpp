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
// attention over the causal pairs; the memory-bound records our modules make (norms, residual
// and bias adds, the heads' permutes and the fused projections' splits, GELU or SwiGLU, rotary
// and GQA's repeats, ring attention's casts and merges, the loss's passes over the logits),
// counted op by op with the bytes each record moves; per micro-batch the parameters' passes
// (gradient accumulation, mixed precision's fp32 casts, ZeRO-3's shard casts); TP+SP 2
// all-gathers and 2 reduce-scatters per layer and direction, and in backward 2 more
// all-gathers (the column-wise Linears' saved input shards; all-reduces without SP), those at
// the ends (embedding, head, the loss's all-reduces); context ring / all-gather; pipeline
// sends. The pipeline's time is (m + (p - 1) / v) (F + B) (1F1B, interleaved), plus once per
// step, on the first or the last pipeline rank, whichever ends later: the gradient reduction
// (one collective per fully_shard unit, behind the last backward's compute), the optimizer
// (AdamW, the clip, the casts, the SP sum of the whole parameters' gradients) and ZeRO's
// parameter sync. The rank modelled holds the head (and the embedding at pp 1 and under the V
// schedules). test_sim checks the step within 5 % of the dry run's on a grid of plans. Memory: model states per ZeRO stage (fully_shard's bytes per parameter, as the
// ledger shows them), saved activations per layer (Korthikanti's terms for our modules, or one
// block input under recompute) times the micro-batches the first pipeline rank holds, plus the
// last stage's logits (test_sim: within 50 % of the dry run's).
// MoE models (ModelShape::experts; GELU MLP experts in GPT blocks, SwiGLU experts in Llama
// blocks): per MoE block the router GEMM, the busiest rank's ceil(E / ep) experts' GEMMs on the rows balanced routing sends it, the count exchange
// and two all_to_all_v of the merged dispatch's units each way on "ep" (exposed;
// moe_all_to_all_bytes is the CommLog's figure), the SP gather of whole tokens; the experts' states sharded over "edp"
// at the plan's ZeRO stage (DDP: ZeRO-1), as ShardedPipeline shards them (one FSDP per parameter
// group, parallel::FullyShardGroups): their reduce-scatter on "edp" once per step, ZeRO-1/2's
// all-gather after the optimizer, ZeRO-3's gathers per micro-batch. Zero-bubble schedules: the pending
// weight-gradient contexts (each Linear's input and output gradient between its I and its W)
// weighed with the forwards in flight at the rank's peak, as the dry run counts them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtensor/core/checked.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/kernels/meta/attention.hpp"
#include "dtensor/nn/moe_blocks.hpp"
#include "dtensor/nn/recompute.hpp"
#include "dtensor/nn/router.hpp"
#include "dtensor/parallel/expert_split.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/simulate.hpp"
#include "dtensor/parallel/pipeline/validate.hpp"
#include "dtensor/placement/chunk.hpp"
#include "dtensor/sim/cost_model.hpp"

namespace dtensor::sim {

/// A GPT (LayerNorm, GELU MLP, biases, learned positions) or Llama (RMSNorm, SwiGLU, GQA, no
/// biases) model's shape. `experts` > 0: the feed-forward of every `moe_every`-th block (none
/// of the first `dense_first`) is a
/// mixture of `experts` feed-forwards of width `expert_ffn` (0: the dense width), top-`topk`
/// routed, with a router [experts, dim] (models/moe_gpt.hpp): GELU MLPs in GPT blocks, SwiGLUs in
/// Llama blocks (models::LlamaMoE); `shared_experts` (DeepSeek's) one more dense feed-forward of
/// shared_experts x the experts' width that every token passes through, Megatron-split over tp.
struct ModelShape {
  std::int64_t layers = 1, dim = 1, heads = 1, kv_heads = 0, ffn = 0, vocab = 1, seq = 1;
  bool llama = false;
  std::int64_t experts = 0, topk = 1, moe_every = 1, expert_ffn = 0, shared_experts = 0;
  // Group-limited routing (nn::RouterConfig::groups, topk_groups; 0: no limit): what the balanced
  // routing of the dry run keeps each token's choices within, so the dispatch's units.
  std::int64_t expert_groups = 1, topk_groups = 0;
  std::int64_t dense_first = 0;  // the first blocks dense whatever moe_every (DeepSeek-V3: 3 of 61)
  // DeepSeek's multi-head latent attention in the Llama blocks (nn::LatentAttentionConfig,
  // nn/latent_attention.hpp; kv_lora_rank > 0: MLA, all 0: none): the latents' ranks (q_lora_rank
  // 0: q_proj straight from the input) and per head the query/key features without and with
  // rotary positions and the value's features.
  std::int64_t kv_lora_rank = 0, q_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  std::int64_t kv() const { return kv_heads ? kv_heads : heads; }
  std::int64_t width() const { return ffn ? ffn : 4 * dim; }
  std::int64_t head_dim() const { return dim / heads; }
  bool moe() const { return experts > 0; }
  bool mla() const { return kv_lora_rank > 0; }
  /// A head's query/key and value features: nope + rope and v_head_dim under MLA, else head_dim.
  std::int64_t qk_head_dim() const { return mla() ? qk_nope_dim + qk_rope_dim : head_dim(); }
  std::int64_t v_dim() const { return mla() ? v_head_dim : head_dim(); }
  /// MLA's parameters split over tp (column-wise q_b_proj or q_proj and kv_b_proj, row-wise
  /// o_proj) and those whole on every tp rank (q_a_proj, kv_a_proj_with_mqa and the two latent
  /// RMSNorms): exactly what nn::MultiHeadLatentAttention holds (no biases in Llama blocks).
  double mla_split_params() const {
    const double h = double(dim), H = double(heads), qk = double(qk_head_dim());
    const double q = q_lora_rank > 0 ? double(q_lora_rank) : h;
    return q * H * qk + double(kv_lora_rank) * H * double(qk_nope_dim + v_head_dim) + H * double(v_head_dim) * h;
  }
  double mla_whole_params() const {
    const double h = double(dim), qr = double(q_lora_rank), kvr = double(kv_lora_rank);
    return (q_lora_rank > 0 ? h * qr + qr : 0) + h * (kvr + double(qk_rope_dim)) + kvr;
  }
  /// One block's attention parameters (its norm not included).
  double attention_params() const {
    if (mla()) return mla_split_params() + mla_whole_params();
    const double h = double(dim), kvd = double(kv() * head_dim());
    return llama ? h * (h + 2 * kvd) + h * h : h * (h + 2 * kvd) + (h + 2 * kvd) + h * h + h;
  }
  /// Blocks whose feed-forward is a MoE: block l when l >= dense_first and (l + 1) % moe_every == 0
  /// (nn::moe_block_count).
  std::int64_t moe_layers() const { return moe() ? nn::moe_block_count(layers, moe_every, dense_first) : 0; }
  std::int64_t expert_width() const { return expert_ffn ? expert_ffn : width(); }
  /// One expert's parameters (parallel/experts.hpp): fc1, fc2 and their biases; SwiGLU's w1, w3, w2.
  double expert_params() const {
    const double h = double(dim), f = double(expert_width());
    return llama ? 3 * h * f : 2 * h * f + f + h;
  }
  /// The shared experts' feed-forward (0 without): a dense one of shared_experts x the experts' width.
  double shared_params() const {
    if (shared_experts == 0) return 0;
    const double h = double(dim), f = double(shared_experts * expert_width());
    return llama ? 3 * h * f : 2 * h * f + f + h;
  }
  /// The dense feed-forward's parameters, which a MoE block replaces by its router and experts.
  double mlp_params() const {
    const double h = double(dim), f = double(width());
    return llama ? 3 * h * f : 2 * h * f + f + h;
  }
  /// Parameters of one block (a dense one).
  double block_params() const {
    const double h = double(dim), f = double(width());
    if (llama) return attention_params() + 3 * h * f + 2 * h;
    return attention_params() + 2 * h * f + f + h + 4 * h;
  }
  /// What a MoE block has beyond a dense one: the router, the experts and the shared experts, less
  /// the dense MLP.
  double moe_extra_params() const {
    return double(dim) * double(experts) + double(experts) * expert_params() + shared_params() - mlp_params();
  }
  /// All parameters: blocks, embedding (and learned positions), final norm, untied head.
  double params() const {
    const double h = double(dim), v = double(vocab);
    return double(layers) * block_params() + double(moe_layers()) * moe_extra_params() + v * h +
           (llama ? 0 : double(seq) * h) + (llama ? h : 2 * h) + v * h;
  }
  /// The model FLOPs of one token (PaLM's count, as MFU is quoted): 6 x the parameters a token
  /// multiplies (no embedding lookup; in a MoE block the router and its top-k experts) + 6 L s H
  /// (qk + v) for attention's score and value products (12 L h s with qk = v = h / H; MLA: its
  /// query/key head nope + rope and its value head).
  double model_flops_per_token() const {
    const double h = double(dim), v = double(vocab);
    const double active_moe =
        double(moe_layers()) * (h * double(experts) + double(topk) * expert_params() + shared_params() - mlp_params());
    const double attention = mla() ? 6 * double(layers) * double(seq) * double(heads) * double(qk_head_dim() + v_dim())
                                   : 12 * double(layers) * h * double(seq);
    return 6 * (double(layers) * block_params() + active_moe + v * h) + attention;
  }
};
/// m with the MLA shape of an nn::LatentAttentionConfig (a template on it: this header need not
/// include the attention modules' header); a default config (kv_lora_rank 0) gives no MLA.
template <class LatentConfig>
  requires requires(const LatentConfig& c) {
    c.kv_lora_rank;
    c.q_lora_rank;
    c.qk_nope_head_dim;
    c.qk_rope_head_dim;
    c.v_head_dim;
  }
ModelShape with_mla(ModelShape m, const LatentConfig& c) {
  m.kv_lora_rank = c.kv_lora_rank, m.q_lora_rank = c.q_lora_rank, m.qk_nope_dim = c.qk_nope_head_dim;
  m.qk_rope_dim = c.qk_rope_head_dim, m.v_head_dim = c.v_head_dim;
  return m;
}

/// A plan as the search enumerates it (a subset of models/training_plan.hpp's TrainingPlan).
struct PlanShape {
  std::int64_t batch = 1;       // sequences per step
  std::int64_t microbatch = 1;  // sequences per micro-batch per data rank
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int ep = 1;                   // expert parallelism: ranks of dp x cp splitting a MoE model's experts
  // The node-level dispatch (parallel/node_dispatch.hpp): "ep" seen as nodes of ep_node_size
  // consecutive expert ranks, a token's row across once per node it reaches (on "ep_across"),
  // then inside the node (on "ep_node"). 0: the one-stage dispatch over "ep".
  int ep_node_size = 0;
  int zero = 0;                 // 0 DDP, 1..3 fully_shard (fp32 master); DDP in bf16: see bf16_moments
  bool sp = true;               // sequence parallelism with tp
  bool recompute = false;       // full activation recomputation of every block
  bool selective = false;       // Korthikanti's selective recomputation: the attention core only
  nn::Recompute recompute_modules{};  // per-module recomputation (nn/recompute.hpp; full = recompute)
  int hsdp = 1;                 // ZeRO over dp / hsdp ranks, replicated hsdp times (HSDP; 1: plain)
  // The software the plan runs on (dtensor's own: fused attention, overlapped gradient
  // reduction; the Megatron-LM of Narayanan 2021 / Korthikanti 2022: neither). The dry run
  // honours both (models::TrainingPlan's fields of the same names), with the same records.
  bool fused_attention = true;  // false: scores in HBM (kernels::meta::materialized_attention_records)
  bool overlap_gradient_reduction = true;
  std::string schedule = "1f1b"; // gpipe, 1f1b, interleaved, zb, zbv, dualpipev (parallel/pipeline/by_name.hpp)
  int stages_per_rank = 1;      // interleaved: v; zbv and dualpipev: 2
  std::string cp_kind = "ring"; // ring, allgather or ulysses
  bool bf16 = true;
  // DDP of a bf16 model keeps fp32 master values and fp32 AdamW moments (mixed precision as
  // practised: 2 + 2 + 12 bytes per parameter; as_run below), unless this asks for AdamW in bf16
  // straight on the bf16 values (2 + 2 + 4: no master, bf16 moments).
  bool bf16_moments = false;
  // FP8 GEMMs (bf16 needed): every nn::Linear's three GEMMs and the routed experts' in FP8
  // (train_gpt --dtype fp8, nn/linear.hpp and parallel/experts.hpp under nn::Fp8Autocast;
  // attention's batched GEMMs stay bf16). The
  // trainer runs it without full or mlp recomputation (a recomputed Linear would record its
  // amaxes twice): the search leaves those out; the estimate times them (published rows).
  bool fp8 = false;

  std::int64_t gpus() const {
    return checked_product<std::int64_t>(std::array<std::int64_t, 4>{dp, tp, pp, cp}, "sim::PlanShape", "GPUs");
  }
  int microbatches() const { return int(batch / (std::int64_t(dp) * microbatch)); }
  /// What the blocks recompute: `recompute` (full) and `selective` (core_attn) folded in.
  nn::Recompute recomputes() const {
    nn::Recompute r = recompute_modules;
    r.full = r.full || recompute;
    r.core_attn = r.core_attn || selective;
    return r;
  }
  /// The pipeline's time beyond m (F + B) is its schedule's: the zero-bubble ones split B.
  bool zero_bubble() const { return schedule == "zb" || schedule == "zbh1" || schedule == "zbv" || schedule == "dualpipev"; }
};

/// The plan as it runs: DDP of a bf16 model with fp32 master values and moments is what
/// train_gpt --dtype bf16 runs (examples/train_gpt.hpp: every stage under fully_shard<float>,
/// ZeRO-1 over a size-1 shard dimension), i.e. ZeRO-1 with one shard per data rank, the data
/// ranks its replicas (HSDP dp x 1): fp32 gradients all-reduced over the data ranks, fp32 master
/// and moments beside the bf16 values and gradients. Every other plan is itself.
inline PlanShape as_run(PlanShape p) {
  if (p.bf16 && p.zero == 0 && !p.bf16_moments) p.zero = 1, p.hsdp = p.dp;
  return p;
}

/// The memory reserve a plan must leave free of the device's memory: allocator fragmentation,
/// NCCL and CUDA workspaces, what the ledger does not see (stated in docs/dry-run.md).
inline constexpr double memory_reserve_fraction = 0.10;

/// Whether `bytes` fit the device with the reserve.
inline bool fits(double bytes, const Hardware& hw) { return bytes <= hw.memory_bytes * (1 - memory_reserve_fraction); }

struct AnalyticEstimate {
  double forward = 0, backward = 0;        // one micro-batch on one rank's stages, exposed communication included
  double compute_per_microbatch = 0;       // of which compute
  double tp_seconds = 0, cp_seconds = 0, pp_seconds = 0, gather_seconds = 0;  // exposed, per step
  double ep_seconds = 0;                   // a MoE plan's expert all-to-alls (counts, dispatch, combine), exposed, per step
  double pipeline_seconds = 0, bubble_seconds = 0;
  double recompute_seconds = 0;            // per step: the recomputed forward work (and its collectives)
  double gradient_reduction = 0, optimizer = 0, parameter_sync = 0;  // once per step, exposed
  double step_seconds = 0;
  double model_states = 0, activations = 0, logits = 0, memory_bytes = 0;
  double expert_states = 0;          // of model_states: a MoE plan's experts (values, gradients, moments in T)
  double activations_in_flight = 0;  // of activations: the micro-batches the schedule holds (W contexts included)
  double weight_contexts = 0;        // of those: zero-bubble schedules' pending weight-gradient contexts
  bool fits = false;
  double model_flops = 0;  // per step, all GPUs (PaLM's count)
  double mfu = 0, tokens_per_second = 0;
};

/// Throws when a model's element counts (a step's activations, its weights, its embedding)
/// overflow int64: a dry run's tensors count elements in int64.
inline void check_model_sizes(const ModelShape& m, std::int64_t batch, const char* op) {
  (void)checked_product<std::int64_t>(std::array<std::int64_t, 3>{batch, m.seq, m.dim}, op, "batch x seq x dim");
  (void)checked_product<std::int64_t>(std::array<std::int64_t, 4>{m.layers, m.dim, m.width(), 4}, op, "layers x dim x ffn x 4");
  (void)checked_product<std::int64_t>(std::array<std::int64_t, 3>{batch, m.seq, m.vocab}, op, "batch x seq x vocab");
}

/// Throws naming the fields when a model's MLA shape is not one nn::MultiHeadLatentAttention
/// builds (its own checks, and the Llama blocks it lives in); all zero: no MLA.
inline void check_mla_shape(const ModelShape& m, const char* op) {
  const bool any =
      m.kv_lora_rank != 0 || m.q_lora_rank != 0 || m.qk_nope_dim != 0 || m.qk_rope_dim != 0 || m.v_head_dim != 0;
  if (!any) return;
  if (m.kv_lora_rank < 1 || m.q_lora_rank < 0 || m.qk_nope_dim < 1 || m.qk_rope_dim < 1 || m.qk_rope_dim % 2 != 0 ||
      m.v_head_dim < 1 || !m.llama || (m.kv_heads != 0 && m.kv_heads != m.heads))
    throw Error(op, dtensor::detail::cat("MLA: kv_lora_rank ", m.kv_lora_rank, ", q_lora_rank ", m.q_lora_rank,
                                         ", qk_nope_dim ", m.qk_nope_dim, ", qk_rope_dim ", m.qk_rope_dim,
                                         ", v_head_dim ", m.v_head_dim, ", kv_heads ", m.kv_heads, ", llama ", m.llama,
                                         ": kv_lora_rank, qk_nope_dim, v_head_dim >= 1, qk_rope_dim >= 2 and even, "
                                         "q_lora_rank >= 0, in Llama blocks with a key and value per head"));
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
  check_mla_shape(m, op);
  if (p.stages_per_rank < 1 || m.layers < std::int64_t(p.pp) * p.stages_per_rank)
    throw Error(op, dtensor::detail::cat(m.layers, " layers over pp ", p.pp, " x ", p.stages_per_rank, " stages"));
  if (p.zero < 0 || p.zero > 3) throw Error(op, dtensor::detail::cat("zero ", p.zero));
  if (p.fp8 && !p.bf16) throw Error(op, "fp8 is the bf16 model with FP8 Linear GEMMs: fp8 with an fp32 model");
  if (p.hsdp < 1 || p.dp % p.hsdp != 0 || (p.hsdp > 1 && p.zero == 0))
    throw Error(op, dtensor::detail::cat("hsdp ", p.hsdp, " with dp ", p.dp, ", zero ", p.zero,
                                         ": replicas dividing dp, under ZeRO 1..3"));
  if (p.cp_kind != "ring" && p.cp_kind != "allgather" && p.cp_kind != "ulysses")
    throw Error(op, "cp_kind '" + p.cp_kind + "': ring, allgather or ulysses");
  if (p.cp_kind == "ulysses" && m.heads % (std::int64_t(p.tp) * p.cp) != 0)
    throw Error(op, dtensor::detail::cat("ulysses splits the heads over tp x cp: heads ", m.heads, " over ", p.tp, " x ", p.cp));
  if (m.moe()) {
    if (m.topk < 1 || m.topk > m.experts || m.moe_every < 1 || m.expert_ffn < 0 || m.shared_experts < 0 ||
        m.dense_first < 0 || m.moe_layers() < 1)
      throw Error(op, dtensor::detail::cat("experts ", m.experts, ", topk ", m.topk, ", moe_every ", m.moe_every,
                                           ", dense_first ", m.dense_first, ", expert_ffn ", m.expert_ffn,
                                           ", shared_experts ", m.shared_experts,
                                           ": 1 <= topk <= experts, moe_every >= 1, shared_experts >= 0, "
                                           "dense_first >= 0 and at least one MoE block of ",
                                           m.layers));
    nn::RouterConfig rc;  // the routing groups, as the dry run's router checks them
    rc.experts = m.experts, rc.topk = m.topk, rc.groups = m.expert_groups, rc.topk_groups = m.topk_groups;
    nn::check_router_config(rc, op);
    const nn::Recompute r = p.recomputes();
    if (!r.full && (r.norm || r.mlp))
      throw Error(op, "MoE blocks: the estimate recomputes none, selective (core_attn), act or full, not " + r.to_string());
  }
  // Any number of experts at least ep over ep ranks of the token ranks (dp x cp): the ranks hold
  // ceil(E / ep) or fewer (parallel/experts.hpp).
  const std::int64_t token_ranks = std::int64_t(p.dp) * p.cp;
  if (p.ep < 1 || token_ranks % p.ep != 0 || (m.moe() ? p.ep > m.experts : p.ep != 1))
    throw Error(op, dtensor::detail::cat("ep ", p.ep, " must divide dp x cp = ", token_ranks, " and be at most the ",
                                         m.experts, " experts (1 without experts)"));
  if (p.ep_node_size < 0 || (p.ep_node_size > 0 && (!m.moe() || p.ep % p.ep_node_size != 0)))
    throw Error(op, dtensor::detail::cat("ep_node_size ", p.ep_node_size, " must divide ep ", p.ep,
                                         " (0: the one-stage dispatch; experts needed)"));
  if (p.ep_node_size > 0) parallel::check_nodes_own_experts(m.experts, p.ep, p.ep_node_size);
  // The schedule as the executor builds it (its own checks: DualPipeV's m >= 2 pp, v fixed).
  namespace pl = parallel::pipeline;
  const auto kind = pl::parse_schedule_kind(p.schedule);
  const int fixed = pl::fixed_stages_per_rank(kind);
  if (fixed != 0 && p.stages_per_rank != fixed)
    throw Error(op, dtensor::detail::cat("schedule ", p.schedule, " puts ", fixed, " stage(s) on each rank, not ", p.stages_per_rank));
  if (kind == pl::ScheduleKind::dual_pipe_v && p.microbatches() < 2 * p.pp)
    throw Error(op, dtensor::detail::cat("dualpipev needs m >= 2 pp: m ", p.microbatches(), ", pp ", p.pp));
  check_model_sizes(m, p.batch, op);
}

namespace detail {
/// make_schedule(kind, ranks, microbatches, v), built once per thread: the search simulates the
/// same few reference schedules for thousands of cost mixes (building them was a third of a MoE
/// `--search`'s time).
inline const parallel::pipeline::Schedule& cached_schedule(parallel::pipeline::ScheduleKind kind, int ranks,
                                                           int microbatches, int v) {
  thread_local std::map<std::array<int, 4>, parallel::pipeline::Schedule> cache;
  const auto key = std::array<int, 4>{int(kind), ranks, microbatches, v};
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  return cache.emplace(key, parallel::pipeline::make_schedule(kind, ranks, microbatches, v)).first->second;
}

/// A zero-bubble schedule's idle time on its busiest rank and the stage-micro-batches a rank
/// holds at most, with F, I (the backward less its weight gradients) and W per micro-batch over a
/// rank's stages: the executor's schedule (parallel/pipeline/generate_zero_bubble.hpp,
/// generate_dualpipe.hpp) run on paper (pipeline::simulate) and counted (pipeline::validate's
/// count_memory). Simulating 16,384-GPU plans one by one costs up to a second each, so where the
/// schedule is in its steady regime (m >= p for ZB-H1, m >= 2p for ZB-V and DualPipeV) a small
/// one stands in: their idle time is (p - 1) g(F, I, W), independent of m and, for ZB-H1 and
/// ZB-V, of p (test_sim "zero-bubble schedules in the analytic estimate" checks both against
/// the full simulation); DualPipeV's g grows slowly with p (1.37 at p 16, 1.38 at 32 for F 1,
/// I 1.6, W 0.4), so it is simulated at min(p, 16) ranks. DualPipeV runs a forward and a full
/// backward as an overlapped pair (Fh, Bh: their expert all-to-alls, Costs::pair_saving):
/// `hidden` is what rank 0's 2m - 3p + 1 pairs hide (pipeline::dual_pipe_v_overlapped), and the
/// makespan m (F + I + W) + idle - hidden.
struct PipelineIdle {
  double idle = 0;
  double hidden = 0;  // communication the overlapped pairs hide, per step
  double held = 1;
};
inline PipelineIdle zero_bubble_pipeline(const std::string& schedule, int pp, int mb, double F, double I, double W,
                                         double Fh = 0, double Bh = 0) {
  namespace pl = parallel::pipeline;
  const auto kind = pl::parse_schedule_kind(schedule);
  const int v = pl::fixed_stages_per_rank(kind);
  const bool h1 = kind == pl::ScheduleKind::zero_bubble_h1;
  const bool steady = mb >= (h1 ? pp : 2 * pp);
  const int ref_p = !steady ? pp : kind == pl::ScheduleKind::dual_pipe_v ? std::min(pp, 16) : std::min(pp, 4);
  const int ref_m = !steady ? mb : 2 * ref_p;
  PipelineIdle out;
  if (!steady) {  // (not DualPipeV, which needs m >= 2p)
    const auto& s = cached_schedule(kind, ref_p, ref_m, v);
    const auto timeline = pl::simulate(s, pl::Costs{.forward = F / v, .backward_input = I / v, .backward_weight = W / v});
    out.idle = std::max(0.0, timeline.makespan - ref_m * (F + I + W));
    const auto held = pl::detail::count_memory(s).peak_saved;
    out.held = *std::max_element(held.begin(), held.end());
    return out;
  }
  // The idle time is homogeneous in (F, I, W): simulated once per schedule, size and cost shares
  // rounded to 1e-3 (the search meets the same shares many times), scaled back by F + I + W.
  const double total = F + I + W;
  if (!(total > 0)) return out;
  const auto share = [&](double x) { return std::lround(1000 * x / total); };
  const auto key = std::array<long, 5>{long(kind) * 1000 + ref_p, share(F), share(I), share(Fh), share(Bh)};
  const auto costs = [&](double f, double i, double w, double fh, double bh) {
    return pl::Costs{.forward = f / v,
                     .backward_input = i / v,
                     .backward_weight = w / v,
                     .forward_hideable = fh / v,
                     .backward_hideable = bh / v};
  };
  // Rank 0's pairs (2m - 3p + 1 of DualPipeV's [F; B]; none elsewhere) and what they hide.
  const auto pairs = [&](int ranks, int microbatches) {
    return kind == pl::ScheduleKind::dual_pipe_v ? double(2 * microbatches - 3 * ranks + 1) : 0.0;
  };
  thread_local std::map<std::array<long, 5>, double> idle_per_unit;
  auto it = idle_per_unit.find(key);
  if (it == idle_per_unit.end()) {
    const double f = double(key[1]) / 1000, i = double(key[2]) / 1000, w = std::max(0.0, 1 - f - i);
    const auto c = costs(f, i, w, double(key[3]) / 1000, double(key[4]) / 1000);
    const auto overlapped =
        kind == pl::ScheduleKind::dual_pipe_v ? pl::dual_pipe_v_overlapped(ref_p, ref_m) : std::vector<pl::Action>{};
    const auto timeline =
        pl::simulate(cached_schedule(kind, ref_p, ref_m, v), c, pl::SendMode::asynchronous, overlapped);
    const double idle = timeline.makespan - ref_m * (f + i + w) + pairs(ref_p, ref_m) * c.pair_saving();
    it = idle_per_unit.emplace(key, std::max(0.0, idle) / (ref_p - 1)).first;
  }
  out.idle = total * it->second * double(pp - 1);
  out.hidden = pairs(pp, mb) * costs(F, I, W, Fh, Bh).pair_saving();
  // As count_memory gives them in the steady regime (tested): 1F1B's p; the V's 2p (+1).
  out.held = h1 ? pp : kind == pl::ScheduleKind::dual_pipe_v ? 2 * pp + 1 : 2 * pp;
  return out;
}

/// The stage-micro-batches a rank holds at its memory peak: `held` forwards whose input gradient
/// has not run and `contexts` weight-gradient contexts whose W has not (pipeline::validate's
/// count_memory, step by step), at the step where held + ratio x contexts is largest, over every
/// rank (ratio: a context's bytes over a stage-micro-batch's saved activations). The dry run
/// (models/training_plan.hpp) and the analytic estimate weigh the same counts with their bytes.
struct HeldAtPeak {
  double held = 0, contexts = 0;
};
inline HeldAtPeak held_at_peak(const parallel::pipeline::MemoryReport& memory, double ratio, int only_rank = -1) {
  HeldAtPeak best;
  double peak = -1;
  for (std::size_t r = 0; r < memory.saved.size(); ++r) {
    if (only_rank >= 0 && int(r) != only_rank) continue;
    for (std::size_t i = 0; i < memory.saved[r].size(); ++i) {
      const double held = memory.saved[r][i], contexts = memory.weight_pending[r][i];
      if (held + ratio * contexts > peak) peak = held + ratio * contexts, best = {held, contexts};
    }
  }
  return best;
}

/// held_at_peak of a zero-bubble schedule of pp ranks and mb micro-batches. Its counts settle
/// within the first few rounds, so long schedules are counted at min(mb, 4 pp) micro-batches
/// (at least what the schedule needs); cached per (schedule, pp, m, ratio to 1e-3): the search
/// meets the same ones many times.
inline HeldAtPeak zero_bubble_held(const std::string& schedule, int pp, int mb, double ratio) {
  namespace pl = parallel::pipeline;
  const auto kind = pl::parse_schedule_kind(schedule);
  const int m = std::min(mb, 4 * pp);
  const auto key = std::array<long, 4>{long(kind), long(pp), long(m), std::lround(1000 * ratio)};
  thread_local std::map<std::array<long, 4>, HeldAtPeak> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    // The counts depend on the schedule only (the ratio weighs them): counted once per schedule.
    thread_local std::map<std::array<long, 3>, pl::MemoryReport> counted;
    auto c = counted.find({key[0], key[1], key[2]});
    if (c == counted.end())
      c = counted
              .emplace(std::array<long, 3>{key[0], key[1], key[2]},
                       pl::detail::count_memory(cached_schedule(kind, pp, m, pl::fixed_stages_per_rank(kind))))
              .first;
    it = cache.emplace(key, held_at_peak(c->second, double(key[3]) / 1000)).first;
  }
  return it->second;
}
}  // namespace detail

/// The bytes of the expert all_to_all and all_to_all_v calls on a rank of a MoE plan, as the
/// CommLog records them (max(sent, received) elements): the dispatch (a row per unit, a token's
/// row once per destination its choices reach, and per pair an int32 unit index and a gate in
/// side arrays padded to whole rows), combine and its adjoint (a row per unit), and the
/// dispatch's adjoint (a row per unit, a gate gradient per pair); the count exchange's int64
/// blocks. Balanced routing (what a dry run assumes, nn::route_balanced, group-limited as the
/// model is): its choices repeat every E tokens, so the units and pairs a rank sends each peer
/// are n / E times those of E tokens (exact when E divides the n tokens of a micro-batch on the
/// rank, whole under SP: the MoE gathers them); every rank routes alike, so a rank receives from
/// each source what it sends itself, and the busiest rank is the one modelled.
/// One-stage (ep_node_size 0): the destinations are the ep expert ranks, on "ep". The node-level
/// dispatch (parallel/node_dispatch.hpp): stage 1 over "ep_across" (N = ep / L ranks, a unit per
/// (token, node)), stage 2 over "ep_node" (L ranks): a node's peer receives from each of the N
/// sources what it sends its own node and forwards the units to the node's expert ranks, a unit
/// per (arrived unit, expert rank); combine and the adjoints move the same units back.
struct MoeAllToAllBytes {
  double counts = 0, dispatch = 0, combine = 0, dispatch_backward = 0;  // on "ep", or stage 1's on "ep_across"
  double node_counts = 0, node_dispatch = 0, node_combine = 0, node_dispatch_backward = 0;  // stage 2's, on "ep_node"
  double units_sent = 0, units_received = 0;  // rows per micro-batch, the busiest rank's received (stage 1's)
  double forwarded = 0;  // stage 2's units a node's peer sends inside its node per micro-batch (0: one stage)
};
namespace detail {
/// Per E tokens of balanced routing: the units and pairs each expert rank receives, and the units
/// and pairs per node of L ranks (a token once per node). Depends on the routing and the ranks
/// only, not on the plan's other sizes, so it is cached per (E, topk, groups, topk_groups, ep, L):
/// the MoE search meets the same few hundred thousand times (it was 64 % of `--search`'s time).
struct RoutedPerPeriod {
  std::vector<double> units, pairs, node_units, node_pairs;
};
inline const RoutedPerPeriod& routed_per_period(const ModelShape& m, std::size_t ep, std::size_t L) {
  const auto key =
      std::array<long, 6>{long(m.experts), long(m.topk), long(m.expert_groups), long(m.topk_groups), long(ep), long(L)};
  thread_local std::map<std::array<long, 6>, RoutedPerPeriod> cache;
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  nn::RouterConfig rc;
  rc.experts = m.experts, rc.topk = m.topk, rc.groups = m.expert_groups, rc.topk_groups = m.topk_groups;
  const std::size_t nodes = ep / L;
  const Extent chunk = chunk_size(m.experts, Extent(ep));
  RoutedPerPeriod out{std::vector<double>(ep, 0), std::vector<double>(ep, 0), std::vector<double>(nodes, 0),
                      std::vector<double>(nodes, 0)};
  // The ranks and nodes one token's choices reached (cleared by its own list, not by a fill of
  // every rank: ep can be in the hundreds, topk is a few).
  std::vector<char> reached(ep), node_reached(nodes);
  std::vector<std::size_t> touched;
  for (Extent token = 0; token < m.experts; ++token) {
    touched.clear();
    for (Extent j = 0; j < m.topk; ++j) {
      const auto r = std::size_t(nn::balanced_expert(rc, token, j) / chunk);
      out.pairs[r] += 1, out.node_pairs[r / L] += 1;
      if (!reached[r]) reached[r] = 1, out.units[r] += 1, touched.push_back(r);
      if (!node_reached[r / L]) node_reached[r / L] = 1, out.node_units[r / L] += 1;
    }
    for (const auto r : touched) reached[r] = 0, node_reached[r / L] = 0;
  }
  return cache.emplace(key, std::move(out)).first->second;
}
}  // namespace detail

inline MoeAllToAllBytes moe_all_to_all_bytes(const ModelShape& m, const PlanShape& p) {
  MoeAllToAllBytes out;
  if (!m.moe()) return out;
  const auto ep = std::size_t(p.ep);
  const auto L = std::size_t(p.ep_node_size > 0 ? p.ep_node_size : 1), nodes = ep / L;
  const bool two_stage = p.ep_node_size > 0;
  const Extent chunk = chunk_size(m.experts, p.ep);
  // Per E tokens: units and pairs per expert rank, and units per node (a token once per node).
  const auto& routed = detail::routed_per_period(m, ep, L);
  const auto &units = routed.units, &pairs = routed.pairs, &node_units = routed.node_units,
             &node_pairs = routed.node_pairs;
  const double e = p.bf16 ? 2 : 4, h = double(m.dim);
  const double per = double(p.microbatch) * double(m.seq) / p.cp / double(m.experts);  // E-token periods on a rank
  auto side = [&](double pair_bytes) { return std::ceil(pair_bytes / (h * e)); };      // a side array's rows
  // One merged exchange: `sources` ranks each send every destination d `u[d]` units and `q[d]`
  // pairs (d in [first, first + count)); a destination receives from every source alike.
  struct Exchange {
    double dispatch = 0, combine = 0, backward = 0, sent = 0, received = 0;
  };
  auto exchange = [&](const std::vector<double>& u, const std::vector<double>& q, std::size_t first, std::size_t count,
                      double sources) {
    double d_sent = 0, g_sent = 0, d_recv = 0, g_recv = 0, u_sent = 0, u_recv = 0;
    for (std::size_t d = first; d < first + count; ++d) {
      u_sent += u[d];
      d_sent += u[d] + side(q[d] * (4 + e));
      g_sent += u[d] + side(q[d] * e);
      u_recv = std::max(u_recv, sources * u[d]);
      d_recv = std::max(d_recv, sources * (u[d] + side(q[d] * (4 + e))));
      g_recv = std::max(g_recv, sources * (u[d] + side(q[d] * e)));
    }
    return Exchange{std::max(d_sent, d_recv) * h * e, std::max(u_sent, u_recv) * h * e,
                    std::max(g_sent, g_recv) * h * e, u_sent, u_recv};
  };
  auto scaled = [](std::vector<double> v, double by) {
    for (auto& x : v) x *= by;
    return v;
  };
  // The count exchange's blocks: per destination its units and its experts' pairs (the most any
  // destination owns).
  auto counts = [&](std::size_t destinations, double most_experts) {
    return 8 * double(destinations) * (1 + most_experts);
  };
  const double most_per_node = double(std::min<Extent>(m.experts, chunk * Extent(L)));
  const auto one = two_stage ? exchange(scaled(node_units, per), scaled(node_pairs, per), 0, nodes, double(nodes))
                             : exchange(scaled(units, per), scaled(pairs, per), 0, ep, double(ep));
  out.counts = two_stage ? counts(nodes, most_per_node) : counts(ep, double(chunk));
  out.dispatch = one.dispatch, out.combine = one.combine, out.dispatch_backward = one.backward;
  out.units_sent = one.sent, out.units_received = one.received;
  if (two_stage) {
    // Stage 2 on the busiest node: its peer forwards N sources' units to each of its L ranks.
    const auto fu = scaled(units, per * double(nodes)), fq = scaled(pairs, per * double(nodes));
    for (std::size_t n = 0; n < nodes; ++n) {
      const auto two = exchange(fu, fq, n * L, L, double(L));
      out.node_dispatch = std::max(out.node_dispatch, two.dispatch);
      out.node_combine = std::max(out.node_combine, two.combine);
      out.node_dispatch_backward = std::max(out.node_dispatch_backward, two.backward);
      out.forwarded = std::max(out.forwarded, two.sent);
    }
    out.node_counts = counts(L, double(chunk));
  }
  return out;
}

/// The plan's step and memory from formulas (see the synopsis).
/// `time_when_unfit` false: a plan that does not fit is returned with its memory only (times 0):
/// the search drops such plans, and a zero-bubble schedule's time costs a simulation.
inline AnalyticEstimate analytic_estimate(const ModelShape& m, const PlanShape& given, const Hardware& hw_in,
                                          const Calibration& cal = calibration, bool time_when_unfit = true) {
  check_plan_shape(m, given);
  const PlanShape p = as_run(given);  // DDP in bf16: with its fp32 master and moments
  namespace pl = parallel::pipeline;
  Hardware hw = hw_in;
  hw.fp32 = !p.bf16;
  const nn::Recompute rc = p.recomputes();
  const bool full = rc.full;
  // The data ranks as (replicas, shards), shards inner (models/training_plan.hpp's HSDP mesh):
  // ZeRO shards, gathers and reduce-scatters over "dp" = dp / hsdp; the replicas all-reduce the
  // shard over "rep". Without HSDP "rep" has size 1 and "dp" is every data rank.
  const int shards = p.dp / p.hsdp;
  // ZeRO's states shard over the flattened (fsdp, cp) group (parallel/fsdp/group.hpp
  // FsdpShardDims, torchtitan's dp_shard_cp): N' = shards x cp ranks, its collectives on "dp*cp".
  const int zero_shards = p.zero >= 1 ? shards * p.cp : shards;
  const char* zero_group = p.zero >= 1 && p.cp > 1 ? "dp*cp" : "dp";
  Topology topo(std::array<std::string_view, 5>{"pp", "rep", "dp", "cp", "tp"},
                std::array{p.pp, p.hsdp, shards, p.cp, p.tp}, hw);
  // A MoE plan's experts live on a second factorization of the same ranks, (pp, edp, ep, tp)
  // (models/training_plan.hpp's plan_topology): where its "ep" groups sit prices their all-to-alls.
  const int edp = p.dp * p.cp / p.ep;
  topo.add_dims(std::array<std::string_view, 4>{"pp", "edp", "ep", "tp"}, std::array{p.pp, edp, p.ep, p.tp});
  if (p.ep_node_size > 0)  // the node-level dispatch's groups: "ep" as (ep_across, ep_node), as plan_topology
    topo.add_dims(std::array<std::string_view, 5>{"pp", "edp", "ep_across", "ep_node", "tp"},
                  std::array{p.pp, edp, p.ep / p.ep_node_size, p.ep_node_size, p.tp});
  const double e = p.bf16 ? 2 : 4;
  const double t = p.tp, h = double(m.dim), f = double(m.width()), hd = double(m.head_dim());
  const double kvd = double(m.kv()) * hd, b = double(p.microbatch), s = double(m.seq);
  const double n = b * s / p.cp;  // tokens of a micro-batch on a rank
  const double split = p.sp ? t : 1;  // what divides a block input's tokens on a rank (SP)
  const int mb = p.microbatches(), v = p.stages_per_rank;
  const double layers_per_rank = double(m.layers) / p.pp;
  // A GEMM's shape as the dry run's records carry it (the wave quantisation reads it); an extent
  // of the estimate may be a mean (an expert's rows), rounded up to whole rows.
  const auto gemm_extent = [](double x) { return std::int64_t(std::ceil(x)); };
  auto gemm = [&](double rows, double k, double cols) {
    const kernels::meta::CostRecord r{"gemm",
                                      std::int64_t(2 * rows * k * cols),
                                      std::int64_t(e * (rows * k + k * cols)),
                                      std::int64_t(e * rows * cols),
                                      gemm_extent(rows),
                                      gemm_extent(cols),
                                      gemm_extent(k),
                                      1};
    return op_seconds(r, hw, cal);
  };
  auto memory_bound = [&](double bytes) { return op_seconds({"add_", 0, std::int64_t(bytes), 0}, hw, cal); };
  // An nn::Linear's GEMM. Under FP8 (kernels/meta/fp8.hpp's records): the GEMM on one-byte
  // operands at the FP8 peak, both operands quantized first (read e, write one byte each), and
  // the amax passes (x and W before the forward, dy before the backward: three operand reads
  // over the three GEMMs, counted as half of each GEMM's two).
  auto linear = [&](double rows, double k, double cols) {
    if (!p.fp8) return gemm(rows, k, cols);
    const double operands = rows * k + k * cols;
    const kernels::meta::CostRecord r{"gemm_fp8",
                                      std::int64_t(2 * rows * k * cols),
                                      std::int64_t(operands),
                                      std::int64_t(e * rows * cols),
                                      gemm_extent(rows),
                                      gemm_extent(cols),
                                      gemm_extent(k),
                                      1};
    return op_seconds(r, hw, cal) + memory_bound((e + 1) * operands) + memory_bound(0.5 * e * operands);
  };
  // MLA (nn/latent_attention.hpp): H heads of qk = nope + rope query/key features and vd value
  // features; q_a_proj and kv_a_proj_with_mqa replicated over tp, on this rank's positions under
  // SP (all of them without), the up-projections column-wise by heads on the gathered latents
  // (q_proj on the block input when q_lora_rank is 0), o_proj row-wise.
  const bool mla = m.mla();
  const double H = double(m.heads), qk = double(m.qk_head_dim()), vd = double(m.v_dim());
  const double qr = double(m.q_lora_rank), kvr = double(m.kv_lora_rank), rope = double(m.qk_rope_dim);
  const double nope = double(m.qk_nope_dim), q_in = qr > 0 ? qr : h;  // the query side's column-wise input
  const double own = n / split;  // the positions a replicated down-projection runs on
  // One block's forward GEMMs on a rank (the dW and dX GEMMs of backward have the same sizes).
  const double mlp =
      m.llama ? linear(n, h, 2 * f / t) + linear(n, f / t, h) : linear(n, h, f / t) + linear(n, f / t, h);
  const double attn_gemms = !mla ? linear(n, h, (h + 2 * kvd) / t) + linear(n, h / t, h)
                                 : (qr > 0 ? linear(own, h, qr) : 0.0) + linear(n, q_in, H * qk / t) +
                                       linear(own, h, kvr + rope) + linear(n, kvr, H * (nope + vd) / t) +
                                       linear(n, H * vd / t, h);
  const double gemms = attn_gemms + mlp;
  // Attention over the causal (query, key) pairs of this rank's queries: a rank holds n / b
  // queries of each sequence, and under load balancing each sees half the keys on average
  // (Ulysses: the whole sequence for heads / cp, the same pairs).
  // MLA: q and k of qk features per head (k_R in every head), v and the output of vd
  // (kernels/meta/attention.hpp: 2 (qk + vd) FLOPs per pair forward, 6 qk + 4 vd backward).
  const double bh = b * double(m.heads) / t, pairs = (s / p.cp) * s / 2;
  const double qkv_bytes = mla ? e * n * H * (2 * qk + vd) / t : e * n * (h + 2 * kvd) / t;
  const double out_bytes = mla ? e * n * H * vd / t : e * n * h / t;
  const double fwd_flops = mla ? 2 * (qk + vd) : 4 * hd, bwd_flops = mla ? 6 * qk + 4 * vd : 10 * hd;
  double attn_fwd = 0, attn_bwd = 0;
  if (p.fused_attention) {
    attn_fwd = op_seconds(
        {"attention", std::int64_t(bh * pairs * fwd_flops), std::int64_t(qkv_bytes), std::int64_t(out_bytes)}, hw, cal);
    attn_bwd = op_seconds({"attention_backward", std::int64_t(bh * pairs * bwd_flops), std::int64_t(2 * qkv_bytes),
                           std::int64_t(qkv_bytes)},
                          hw, cal);
  } else {
    // Scores in HBM: the records the dry run's meta attention makes under
    // kernels::meta::MaterializedScores (one function for both; kernels/meta/attention.hpp).
    const auto seconds = [&](bool backward) {
      double total = 0;
      for (const auto& r :
           kernels::meta::materialized_attention_records(bh, s / p.cp, s, mla ? qk : hd, mla ? vd : hd, e, backward))
        total += op_seconds(r, hw, cal);
      return total;
    };
    attn_fwd = seconds(false);
    attn_bwd = seconds(true);
  }
  // Memory-bound passes of one block, forward and backward: the meta kernels' records of our
  // modules (nn/), in elements of the rank's widths: xs a block input's tokens on the rank (n h /
  // split), qw the fused q, k, v (n (h + 2 kvd) / t), hw and kw the query and key heads (n h / t,
  // n kvd / t), fw the feed-forward (n f / t). Each record reads and writes its elements once
  // (2 e); a residual add or a bias add to a row-wise Linear's output reads two (3 e); a
  // backward that reads a saved input and an output gradient and writes one (3 e).
  const double xs = n * h / split, qw = n * (h + 2 * kvd) / t, hw_n = n * h / t, kw = n * kvd / t, fw = n * f / t;
  // Attention's half: the norm, the residual add, the heads' permutes (q, k, v, out), the fused
  // projection's split (concat in backward); GPT: the qkv and proj biases (their gradients:
  // one read); Llama: rotary on q and k, GQA's repeat of k and v (and its backward).
  const double heads_perm = 2 * (2 * hw_n + 2 * kw);
  double attn_pw_f = m.llama ? 2 * xs + 3 * xs + heads_perm + 2 * qw + 2 * (hw_n + kw) + 2 * (kw + hw_n)
                             : 2 * xs + 3 * xs + heads_perm + 2 * qw + 2 * qw + 2 * xs;
  double attn_pw_b = m.llama ? 3 * xs + 3 * xs + heads_perm + 2 * qw + 2 * (hw_n + kw) + 4 * (kw + hw_n)
                             : 3 * xs + 3 * xs + heads_perm + 2 * qw + qw + xs;
  if (mla) {
    // MLA's records (nn/latent_attention.hpp), in elements of qh the query or key heads (n H qk /
    // t), vh the value or output heads, kvh kv_b_proj's output, rh the rotary features of this
    // rank's heads, lat the latents on this rank's positions: forward the block's norm and
    // residual add, the query latent's norm, the queries' split, rotary, concat and permute,
    // kv_a's split, the KV latent's norm, kv_b's split, the shared key's rotary and its copy per
    // head, the keys' concat and permute, the values' and the output's permutes; backward their
    // adjoints (the norms' backward reads two), and the two sides' input gradients added.
    const double qh = n * H * qk / t, vh = n * H * vd / t, kvh = n * H * (nope + vd) / t, rh = n * H * rope / t;
    const double q_lat = qr > 0 ? own * qr : 0, kv_lat = own * kvr, kr = n * rope;
    attn_pw_f = 2 * xs + 3 * xs + 2 * q_lat + 2 * qh + 2 * rh + 2 * qh + 2 * qh + 2 * (kv_lat + own * rope) +
                2 * kv_lat + 2 * kvh + 2 * kr + (kr + rh) + 2 * qh + 2 * qh + 2 * vh + 2 * vh;
    attn_pw_b = 3 * xs + 3 * xs + 2 * vh + 2 * qh + 2 * qh + 2 * vh + 2 * kvh + 3 * kv_lat + (rh + kr) + 2 * kr +
                2 * (kv_lat + own * rope) + 2 * qh + 2 * qh + 2 * rh + 2 * qh + 3 * q_lat + 3 * xs;
  }
  // The feed-forward's half: the norm, the residual add; GPT: fc1's and fc2's biases, GELU (its
  // backward reads the input and the gradient); Llama: w13's split (concat), SiLU, the gate's
  // multiply (backward: SiLU again, its backward, two multiplies).
  const double mlp_norm_f = 2 * xs + 3 * xs, mlp_norm_b = 3 * xs + 3 * xs;
  const double mlp_pw_f = mlp_norm_f + (m.llama ? 4 * fw + 2 * fw + 3 * fw : 2 * fw + 2 * xs + 2 * fw);
  const double mlp_pw_b = mlp_norm_b + (m.llama ? 4 * fw + 2 * fw + 3 * fw + 6 * fw : fw + xs + 3 * fw);
  const double pointwise = memory_bound(e * (attn_pw_f + mlp_pw_f));
  const double pointwise_b = memory_bound(e * (attn_pw_b + mlp_pw_b));
  // A MoE block's attention half and its feed-forward's norm and residual (the experts' own
  // passes are counted with them below).
  const double moe_pointwise = memory_bound(e * (attn_pw_f + mlp_norm_f));
  const double moe_pointwise_b = memory_bound(e * (attn_pw_b + mlp_norm_b));
  // Tensor and context communication per layer, one direction (each group's placement is
  // computed once, by the Topology).
  auto coll = [&](CollectiveKind k, const char* group, int size, double bytes) {
    CommRecord r{};
    r.kind = k;
    r.group = group;
    r.group_size = size;
    r.bytes = std::size_t(bytes);
    return collective_seconds(r, topo, group, cal);
  };
  const double act = e * n * h;  // a block input, gathered
  // Per block and direction: attention's and the MLP's halves (SP: an all-gather and a
  // reduce-scatter each; without SP an all-reduce each).
  const double tp_half = p.tp == 1 ? 0
                         : p.sp  ? coll(CollectiveKind::all_gather, "tp", p.tp, act) + coll(CollectiveKind::reduce_scatter, "tp", p.tp, act)
                                 : coll(CollectiveKind::all_reduce, "tp", p.tp, act);
  const double tp_layer = 2 * tp_half;
  // A block's forward and backward on "tp" (without the backward's re-gathers): the two halves'.
  // MLA's attention half (nn/latent_attention.hpp's counts), SP: forward the all-gathers of the
  // query side's input (c_Q, or the block input for q_proj), c_KV and the shared rotary key and
  // o_proj's reduce-scatter; backward o_proj's all-gather of the output gradient, the
  // up-projections' input-gradient reduce-scatters and the rotary key's all-reduce (the
  // up-projections' re-gathers of their saved inputs: mla_regather). Without SP: o_proj's
  // all-reduce forward; the up-projections' input gradients' and the rotary key's all-reduces.
  double attn_tp_f = tp_half, attn_tp_b = tp_half, mla_regather = 0;
  if (mla && p.tp > 1) {
    const auto tp_coll = [&](CollectiveKind k, double width) { return coll(k, "tp", p.tp, e * n * width); };
    using K = CollectiveKind;
    if (p.sp) {
      attn_tp_f = tp_coll(K::all_gather, q_in) + tp_coll(K::all_gather, kvr) + tp_coll(K::all_gather, rope) +
                  tp_coll(K::reduce_scatter, h);
      attn_tp_b = tp_coll(K::all_gather, h) + tp_coll(K::reduce_scatter, q_in) + tp_coll(K::reduce_scatter, kvr) +
                  tp_coll(K::all_reduce, rope);
      mla_regather = tp_coll(K::all_gather, q_in) + tp_coll(K::all_gather, kvr);
    } else {
      attn_tp_f = tp_coll(K::all_reduce, h);
      attn_tp_b = tp_coll(K::all_reduce, q_in) + tp_coll(K::all_reduce, kvr) + tp_coll(K::all_reduce, rope);
    }
  }
  const double tp_layer_f = mla ? attn_tp_f + tp_half : tp_layer, tp_layer_b = mla ? attn_tp_b + tp_half : tp_layer;
  double cp_layer = 0, cp_hidden = 0;
  if (p.cp > 1) {
    // A rank's keys and values (MLA: keys of qk and values of vd features per head; as one chunk
    // of their mean width, twice).
    const double kv_chunk =
        mla ? e * n * H * (qk + vd) / 2 / t : e * n * kvd / std::max(1.0, std::min(t, double(m.kv())));
    if (p.cp_kind == "allgather") cp_layer = 2 * coll(CollectiveKind::all_gather, "cp", p.cp, kv_chunk * p.cp);
    else if (p.cp_kind == "ulysses")  // q, k, v to head shards and the output back (nn/attention.hpp), exposed
      cp_layer = (mla ? coll(CollectiveKind::all_to_all, "cp", p.cp, e * n * H * qk / t) +
                            coll(CollectiveKind::all_to_all, "cp", p.cp, e * n * H * vd / t)
                      : 2 * coll(CollectiveKind::all_to_all, "cp", p.cp, e * n * h / t)) +
                 2 * coll(CollectiveKind::all_to_all, "cp", p.cp, kv_chunk);
    else {
      cp_hidden = 2 * (p.cp - 1) * coll(CollectiveKind::send_recv, "cp", p.cp, kv_chunk);
      // Ring attention's memory-bound passes (nn/attention.hpp's ring, load-balanced: a rank's
      // two query chunks of n / 2 tokens meet 2 cp + 1 key blocks): each block's output cast
      // to fp32 (read e, write 4) and merged into the fp32 accumulator (read two, write one),
      // the two chunks' results cast back; backward: each block's gradient cast, and the
      // queries' fp32 gradient cast back.
      const double chunk = n / 2 * (mla ? H * vd : h) / t, blocks = 2.0 * p.cp + 1;
      attn_fwd += memory_bound(blocks * (e + 4 + 12) * chunk + 2 * (4 + e) * chunk);
      attn_bwd += memory_bound(blocks * (e + 4) * chunk + 2 * (4 + e) * chunk);
    }
  }
  const double fwd_compute = gemms + attn_fwd + pointwise;
  // Recomputation in backward (nn/recompute.hpp): full runs the block's forward again with its
  // collectives; per module, what each recomputes: core_attn the attention core (and its context
  // collectives), norm both norms (read and write of a block input each), act the MLP's
  // activation, mlp ln2 and the whole feed-forward with its tensor-parallel all-gather and
  // reduce-scatter (one of the block's two; all-reduce without SP).
  const double norms = memory_bound(2 * 2 * e * n * h / split);
  const double activation = memory_bound((m.llama ? 3 : 2) * e * n * f / t);
  double recompute_compute = 0, recompute_comm = 0;
  if (full) recompute_compute = fwd_compute, recompute_comm = tp_layer_f + cp_layer;
  else {
    if (rc.core_attn) recompute_compute += attn_fwd, recompute_comm += cp_layer + std::max(0.0, cp_hidden - attn_fwd);
    if (rc.norm) recompute_compute += norms;
    if (rc.mlp) recompute_compute += mlp + activation + (rc.norm ? 0 : norms / 2), recompute_comm += tp_layer / 2;
    else if (rc.act) recompute_compute += activation;
  }
  const double bwd_compute = 2 * gemms + attn_bwd + pointwise_b + recompute_compute;
  // FP8: each Linear's amaxes max-all-reduced over every mesh dimension that splits the tensor
  // (nn/linear.hpp; one float: latency only, exposed): x's and dy's over the token dimensions (the
  // data ranks' and cp), W's over tp, and over tp the row-wise Linears' x and the column-wise
  // ones' dy. A dense block (qkv and fc1 column-wise, proj and fc2 row-wise): forward 4 over each
  // token dimension and 6 over tp, backward 4 and 2.
  const auto amax_all_reduce = [&](const char* group, int size) {
    return p.fp8 && size > 1 ? coll(CollectiveKind::all_reduce, group, size, 4) : 0.0;
  };
  const double amax_tok = amax_all_reduce("rep", p.hsdp) + amax_all_reduce("dp", shards) + amax_all_reduce("cp", p.cp);
  const double amax_tp = amax_all_reduce("tp", p.tp);
  // Attention's share of them: GQA's qkv and proj (forward 2 over the token dimensions and 3
  // over tp, backward 2 and 1); MLA's five Linears (four without the query latent), its
  // replicated down-projections' x and dy also over tp under SP (their rows split there).
  const double mla_rep = p.sp ? (qr > 0 ? 2 : 1) : 0;
  const double attn_amax_tok = mla ? (qr > 0 ? 5 : 4) : 2, attn_amax_tp_f = mla ? 4 + mla_rep : 3,
               attn_amax_tp_b = mla ? 2 + mla_rep : 1;
  const double fwd_layer =
      fwd_compute + tp_layer_f + cp_layer + std::max(0.0, cp_hidden - attn_fwd) +
      (mla ? (attn_amax_tok + 2) * amax_tok + (attn_amax_tp_f + 3) * amax_tp : 4 * amax_tok + 6 * amax_tp);
  // Under SP the column-wise Linears (qkv, fc1) gather their saved input shard again in backward
  // (nn/linear.hpp): two more all-gathers, exposed like every TP collective here (the backward
  // issues the gather before the GEMMs that need it, on the same stream: no overlap).
  const double regather_one = p.tp > 1 && p.sp ? coll(CollectiveKind::all_gather, "tp", p.tp, act) : 0;
  const double attn_regather = mla ? mla_regather : regather_one;
  const double tp_regather = mla ? attn_regather + regather_one : 2 * regather_one;
  const double bwd_layer =
      bwd_compute + tp_layer_b + cp_layer + recompute_comm + tp_regather + std::max(0.0, 2 * cp_hidden - attn_bwd) +
      (mla ? (attn_amax_tok + 2) * amax_tok + (attn_amax_tp_b + 1) * amax_tp : 4 * amax_tok + 2 * amax_tp);
  // A MoE block (parallel/moe.hpp, models/moe_gpt.hpp): attention as above; its feed-forward
  // gathers the whole tokens under SP (one all-gather forward, one of the output gradient
  // backward; no collective without SP), runs the router GEMM [n, E], exchanges counts (one
  // all_to_all), dispatches and combines the routed tokens (two all_to_all_v each way, exposed:
  // sim::comm_role), and runs ceil(E / ep) experts' GEMM pairs on the rows the busiest rank
  // receives; backward twice the GEMMs, GELU again from fc1's output (the experts keep no GELU
  // output), and the two all_to_all_v adjoints. Routing is balanced (a dry run's assumption).
  struct MoeLayer {
    double fwd_compute = 0, bwd_compute = 0, fwd = 0, bwd = 0, w_gemms = 0, recompute = 0;
    double a2a_f = 0, a2a_b = 0, tp = 0, recompute_tp = 0, recompute_cp = 0;
    double local = 0, received = 0, sent = 0, units = 0, shared = 0;  // received: pairs (expert rows); units: sent
  } moe;
  const bool is_moe = m.moe();
  if (is_moe) {
    const double E = double(m.experts), fe = double(m.expert_width());
    moe.local = std::ceil(E / p.ep);
    moe.sent = n * double(m.topk);
    moe.received = moe.sent / E * p.ep * moe.local;
    const double per_expert = moe.received / std::max(1.0, moe.local);
    const double router = linear(n, h, E);
    // SwiGLU experts (Llama blocks): the gate's and the up projection's GEMMs, then w2's; under
    // FP8 each a Linear's (parallel/experts.hpp: per-expert scales, the same quantizing GEMMs).
    const double experts = moe.local * ((m.llama ? 2 : 1) * linear(per_expert, h, fe) + linear(per_expert, fe, h));
    // Memory-bound passes (the meta kernels' records of parallel/moe.hpp and experts.hpp): the
    // activation — GELU (read h, write a), or SwiGLU's silu (2) and product (3) — the biases
    // added to fc1's and fc2's rows (GELU MLPs only), the rows' gather, gate and weighted
    // scatter-add; backward: the activation again and its gradient (GELU's 3; SwiGLU's product
    // and silu gradient and the up projection's, 11), the bias gradients, and each local
    // expert's weight gradients accumulated (read the gradient, the new dW, write: 3 e per
    // parameter; large next to the tokens, unlike a dense block's).
    const double act = memory_bound((m.llama ? 5 : 2) * e * moe.received * fe);
    const double act_b = memory_bound((m.llama ? 16 : 5) * e * moe.received * fe);
    const double biases = m.llama ? 0 : memory_bound(2 * e * moe.received * (fe + h));
    const double rows = memory_bound(4 * e * moe.sent * h) + biases;
    const double grads =
        memory_bound((m.llama ? 0 : e * moe.received * (fe + h)) + 3 * e * moe.local * m.expert_params());
    const auto a2a = moe_all_to_all_bytes(m, p);
    moe.units = a2a.units_sent;
    // One stage on "ep"; the node-level dispatch's stage 1 on "ep_across" (a row per (token,
    // node), nodes ranks) and stage 2 on "ep_node" (the node's ranks), each placed by the topology.
    const int L = p.ep_node_size, nodes = L > 0 ? p.ep / L : p.ep;
    const char* first = L > 0 ? "ep_across" : "ep";
    auto node = [&](CollectiveKind k, double bytes) { return L > 0 ? coll(k, "ep_node", L, bytes) : 0.0; };
    const double dispatch = coll(CollectiveKind::all_to_all_v, first, nodes, a2a.dispatch) +
                            node(CollectiveKind::all_to_all_v, a2a.node_dispatch);
    const double combine = coll(CollectiveKind::all_to_all_v, first, nodes, a2a.combine) +
                           node(CollectiveKind::all_to_all_v, a2a.node_combine);
    const double dispatch_b = coll(CollectiveKind::all_to_all_v, first, nodes, a2a.dispatch_backward) +
                              node(CollectiveKind::all_to_all_v, a2a.node_dispatch_backward);
    const double counts =
        coll(CollectiveKind::all_to_all, first, nodes, a2a.counts) + node(CollectiveKind::all_to_all, a2a.node_counts);
    // The node's peer forwards: a row gather of the arrived units, and combine's scatter-add of
    // the node's rows (and their adjoints backward).
    const double forwarding = memory_bound(4 * e * a2a.forwarded * h);
    const double gather = p.tp > 1 && p.sp ? coll(CollectiveKind::all_gather, "tp", p.tp, act) : 0;
    // Shared experts: a dense feed-forward of fs = shared x fe on the block's tokens, split over tp
    // as the dense MLP (its GEMMs, its passes as the MLP's at width fs, its add into the
    // output, forward and backward; its TP collectives below).
    const double fs = double(m.shared_experts) * fe, fsw = n * fs / t;
    moe.shared = m.shared_experts == 0 ? 0
                 : m.llama             ? linear(n, h, 2 * fs / t) + linear(n, fs / t, h)
                                       : linear(n, h, fs / t) + linear(n, fs / t, h);
    const double shared_pw_f =
        m.shared_experts == 0 ? 0 : memory_bound(e * (3 * xs + (m.llama ? 9 * fsw : 4 * fsw + 2 * xs)));
    const double shared_pw_b =
        m.shared_experts == 0 ? 0 : memory_bound(e * (3 * xs + (m.llama ? 15 * fsw : 4 * fsw + xs)));
    const double shared_tp = m.shared_experts == 0 ? 0 : tp_half;
    const double moe_f = router + experts + act + rows + forwarding + moe.shared + shared_pw_f;
    moe.fwd_compute = attn_gemms + attn_fwd + moe_pointwise + moe_f;
    moe.a2a_f = counts + dispatch + combine;
    moe.a2a_b = combine + dispatch_b;
    // Full recomputation runs the block's forward again, its collectives included; selective the
    // attention core (the MoE blocks recompute nothing else in the search: nn/recompute.hpp).
    if (full)
      moe.recompute = moe.fwd_compute, moe.recompute_tp = attn_tp_f + shared_tp + gather, moe.recompute_cp = cp_layer;
    else if (rc.core_attn) moe.recompute = attn_fwd, moe.recompute_cp = cp_layer + std::max(0.0, cp_hidden - attn_fwd);
    const double recompute_a2a = full ? moe.a2a_f : 0;
    moe.bwd_compute = 2 * attn_gemms + attn_bwd + moe_pointwise_b + 2 * (router + experts + moe.shared) + act_b + rows +
                      forwarding + grads + shared_pw_b + moe.recompute;
    // The shared experts' Megatron pair (and, under SP, fc1's re-gather in backward).
    const double shared_regather = m.shared_experts == 0 ? 0 : regather_one;
    moe.tp =
        mla ? attn_tp_f + attn_tp_b + 2 * shared_tp + 2 * gather + attn_regather + shared_regather + moe.recompute_tp
            : 2 * (tp_half + shared_tp) + 2 * gather + regather_one + shared_regather + moe.recompute_tp;
    // FP8's amax all-reduces (above): attention's two Linears, the router's x and dy (replicated
    // weight), the shared experts' two Linears; the routed experts' rows over "edp", a float per
    // local expert and use (parallel/experts.hpp: x and w2's input forward, dy and the hidden
    // gradients backward).
    const double shared_linears = m.shared_experts == 0 ? 0 : 1;
    const auto amax_experts = [&](double uses) {
      return p.fp8 && edp > 1 ? coll(CollectiveKind::all_reduce, "edp", edp, 4 * uses * moe.local) : 0.0;
    };
    const double amax_f = (attn_amax_tok + 1 + 2 * shared_linears) * amax_tok +
                          (attn_amax_tp_f + 3 * shared_linears) * amax_tp + 2 * amax_experts(1);
    const double amax_b = (attn_amax_tok + 1 + 2 * shared_linears) * amax_tok +
                          (attn_amax_tp_b + shared_linears) * amax_tp + amax_experts(1) + amax_experts(m.llama ? 2 : 1);
    moe.fwd = moe.fwd_compute + attn_tp_f + shared_tp + gather + cp_layer + std::max(0.0, cp_hidden - attn_fwd) +
              moe.a2a_f + amax_f;
    moe.bwd = moe.bwd_compute + attn_tp_b + shared_tp + gather + attn_regather + shared_regather + cp_layer +
              moe.recompute_tp + moe.recompute_cp + recompute_a2a + std::max(0.0, 2 * cp_hidden - attn_bwd) +
              moe.a2a_b + amax_b;
    moe.w_gemms = attn_gemms + router + experts + moe.shared;
  }
  // The head (logits GEMM, vocab-parallel over tp) and the pipeline sends, per micro-batch.
  const double head = linear(n, h, double(m.vocab) / t);
  const double send = p.pp == 1 ? 0 : coll(CollectiveKind::send, "pp", p.pp, act / split);
  // Parameters a rank holds: the dense ones (routers included) split over pp and tp; a MoE
  // model's experts on top (ceil(E / ep) per MoE block, replicated over tp, sharded over "edp").
  const double moe_share = m.layers > 0 ? double(m.moe_layers()) / double(m.layers) : 0;
  const double dense_params = m.params() - double(m.moe_layers()) * double(m.experts) * m.expert_params();
  // (MLA's down-projections and latent norms are whole on every tp rank.)
  const double mla_whole = mla ? double(m.layers) * m.mla_whole_params() : 0;
  const double rank_params =
      mla ? ((dense_params - mla_whole) / t + mla_whole) / double(p.pp) : dense_params / (double(p.pp) * t);
  const double expert_params = is_moe ? moe_share * layers_per_rank * moe.local * m.expert_params() : 0;
  // The slowest pipeline rank: the last (its layers and the head; uneven splits round up); of
  // its layers, a MoE model's share are MoE blocks (rounded up).
  const double layers_max = std::ceil(layers_per_rank);
  const double moe_max = is_moe ? std::min(layers_max, std::ceil(layers_max * moe_share)) : 0, dense_max = layers_max - moe_max;
  // The parameters of the first and the last pipeline rank as fully_shard's units hold them (one
  // per block, the embedding's, the head's with the final norm; at pp 1 one rank has all):
  // the Linears' weights and column-wise biases split over tp, the norms, row-wise biases and
  // GPT's learned positions whole on every tp rank (their gradients also summed over "tp"
  // under SP). A MoE model's units: the dense parameters split evenly (rank_params).
  const double block_sharded = (mla       ? m.mla_split_params() + 3 * h * f
                                : m.llama ? h * (h + 2 * kvd) + h * h + 3 * h * f
                                          : h * (h + 2 * kvd) + h * h + 2 * h * f + (h + 2 * kvd) + f) /
                               t;
  const double block_whole = mla ? 2 * h + m.mla_whole_params() : m.llama ? 2 * h : 6 * h;
  const double block_unit = is_moe ? rank_params / std::max(1.0, layers_per_rank) : block_sharded + block_whole;
  const double embedding_unit = is_moe ? 0 : double(m.vocab) * h / t + (m.llama ? 0 : s * h);
  const double head_unit = is_moe ? 0 : double(m.vocab) * h / t + (m.llama ? h : 2 * h);
  struct RankUnits {
    double blocks = 0, first = 0, last = 0, whole = 0;  // units' parameters; `whole`: those not split over tp
    double params() const { return blocks + first + last; }
  };
  const double whole_blocks = is_moe ? 0 : layers_max * block_whole;
  // One rank holds both ends at pp 1 and under the V schedules (ZB-V, DualPipeV: pipeline rank
  // 0 runs the first stage and the last).
  const bool both_ends = p.pp == 1 || p.schedule == "zbv" || p.schedule == "dualpipev";
  const RankUnits first_rank{layers_max * block_unit, embedding_unit, both_ends ? head_unit : 0,
                             whole_blocks + (m.llama ? 0 : s * h) + (both_ends ? (m.llama ? h : 2 * h) : 0)};
  const RankUnits last_rank{layers_max * block_unit, both_ends ? embedding_unit : 0, head_unit,
                            whole_blocks + (both_ends && !m.llama ? s * h : 0) + (m.llama ? h : 2 * h)};
  // A collective per unit, `per_param` bytes per parameter: a collective's time is its
  // latency term plus its bytes over the bandwidth, so the units' sum is one collective of all
  // their bytes plus the latency term of each other unit (that of an empty buffer).
  auto per_unit = [&](const RankUnits& r, CollectiveKind k, const char* group, int size, double per_param) {
    const double units = layers_max + (r.first > 0 ? 1 : 0) + (r.last > 0 ? 1 : 0);
    return coll(k, group, size, per_param * r.params()) + (units - 1) * coll(k, group, size, 0);
  };
  const RankUnits& slow_rank = last_rank;  // the one whose micro-batch work is modelled
  const double slow_params = is_moe ? rank_params : slow_rank.params();
  const double slow_shard = p.zero >= 1 ? slow_params / zero_shards : slow_params;
  // The head's and the embedding's memory-bound passes: the final norm, the vocab-parallel
  // cross-entropy's passes over the logits (max, sum of exponentials; backward reads and writes
  // them), the embedding's lookup (GPT: the positions and their add); the tensor-parallel
  // collectives at the ends of the blocks under SP: the final norm's output gathered to the head
  // (its gradient reduce-scattered back, and the head's saved input gathered again), the loss's
  // three small all-reduces, the embedding's output reduce-scattered (its gradient gathered).
  const double logits = n * double(m.vocab) / t;
  double head_pw_f = 2 * xs + 2 * logits, head_pw_b = 3 * xs + 4 * logits;
  const double tp_on = p.tp > 1 && p.sp ? 1 : 0;
  const double tp_ag = tp_on ? coll(CollectiveKind::all_gather, "tp", p.tp, act) : 0;
  const double tp_rs = tp_on ? coll(CollectiveKind::reduce_scatter, "tp", p.tp, act) : 0;
  const double loss_ar = p.tp > 1 ? 3 * coll(CollectiveKind::all_reduce, "tp", p.tp, 4 * n) : 0;
  double edge_tp_f = tp_ag + loss_ar, edge_tp_b = tp_ag + tp_rs;
  const double head_amax = amax_tok + amax_tp;  // FP8: the head's amaxes, forward and backward
  if (both_ends) {
    head_pw_f += 2 * n * h + (m.llama ? 0 : 2 * xs + 3 * xs);
    head_pw_b += 3 * n * h + (m.llama ? 0 : 3 * xs);
    edge_tp_f += tp_rs, edge_tp_b += tp_ag;
  }
  const double head_f = head + memory_bound(e * head_pw_f), head_b = 2 * head + memory_bound(e * head_pw_b);
  // Per micro-batch, the parameters' passes a backward makes (the meta records of fully_shard's
  // units): each gradient accumulated in T (read two, write one); under mixed precision (ZeRO,
  // and DDP's fp32 master) cast to fp32 for the reduction (read e, write 4), under HSDP the shard
  // cast back; ZeRO-3: the fp32 shard cast to T before each gather (forward and backward) and the
  // reduced shard added to the fp32 gradient shard.
  const bool mixed = p.zero >= 1 && e == 2;
  double param_pass_f = 0, param_pass_b = 3 * e * slow_params + (mixed ? 6 * slow_params : 0) +
                                          (mixed && p.hsdp > 1 ? 6 * slow_shard : 0);
  // ZeRO-3 with several stages keeps each stage gathered from its first forward to its last
  // backward (parallel::pipeline::ShardedPipeline: reshard_after_forward false by default): no
  // gather, and so no cast of the shard, before a backward; with one stage each unit is gathered
  // again for each micro-batch's backward.
  const bool stages_kept_gathered = p.zero == 3 && p.pp * p.stages_per_rank > 1;
  if (p.zero == 3)
    param_pass_f += 6 * slow_shard, param_pass_b += (stages_kept_gathered ? 0 : 6 * slow_shard) + 12 * slow_shard;
  // A MoE model's experts are units of their own FSDP over "edp" (ShardedPipeline's
  // FullyShardGroups): under mixed precision their gradients cast to fp32 for the reduction, and
  // ZeRO-3's casts of their shard (their accumulation in T is the MoE block's own term below).
  const double expert_shard = expert_params / edp;  // every stage shards them, DDP too (ZeRO-1)
  const double expert_pass_f = p.zero == 3 ? 6 * expert_shard : 0,
               expert_pass_b = (mixed ? 6 * expert_params : 0) +
                               (p.zero == 3 ? (stages_kept_gathered ? 12 : 18) * expert_shard : 0);
  const double params_f = memory_bound(is_moe ? expert_pass_f : param_pass_f),
               params_b = memory_bound(is_moe ? expert_pass_b : param_pass_b);
  // ZeRO-3: every unit gathered in T each micro-batch, forward and backward (stages kept
  // gathered: forward only, as the dry run's report has it), prefetched behind that phase's
  // compute (exposed past it, as sim::comm_role has it).
  const double gather =
      (p.zero == 3 && zero_shards > 1 ? per_unit(slow_rank, CollectiveKind::all_gather, zero_group, zero_shards, e)
                                      : 0) +
      (p.zero == 3 && edp > 1 ? coll(CollectiveKind::all_gather, "edp", edp, e * expert_params) : 0);
  AnalyticEstimate a;
  const double fwd_phase_compute = dense_max * fwd_compute + moe_max * moe.fwd_compute + head_f + params_f;
  const double bwd_phase_compute = dense_max * bwd_compute + moe_max * moe.bwd_compute + head_b + params_b;
  const double gather_f = std::max(0.0, gather - fwd_phase_compute),
               gather_b = stages_kept_gathered ? 0.0 : std::max(0.0, gather - bwd_phase_compute);
  a.forward =
      dense_max * fwd_layer + moe_max * moe.fwd + head_f + params_f + edge_tp_f + head_amax + gather_f + send * v;
  a.backward =
      dense_max * bwd_layer + moe_max * moe.bwd + head_b + params_b + edge_tp_b + head_amax + gather_b + send * v;
  a.compute_per_microbatch = fwd_phase_compute + bwd_phase_compute;
  a.recompute_seconds = mb * (dense_max * recompute_compute + moe_max * moe.recompute);
  const double tp_recompute = full ? tp_layer_f : rc.mlp ? tp_layer / 2 : 0;
  a.tp_seconds = mb * (dense_max * (tp_layer_f + tp_layer_b + tp_regather + tp_recompute) + moe_max * moe.tp +
                       edge_tp_f + edge_tp_b);
  a.ep_seconds = mb * moe_max * (moe.a2a_f + moe.a2a_b + (full ? moe.a2a_f : 0));
  a.cp_seconds = mb * layers_max * (2 * cp_layer + std::max(0.0, cp_hidden - attn_fwd) + std::max(0.0, 2 * cp_hidden - attn_bwd)) +
                 mb * (dense_max * (recompute_comm - tp_recompute) + moe_max * moe.recompute_cp);
  a.pp_seconds = mb * 2 * send * v;
  a.gather_seconds = mb * (gather_f + gather_b);
  const double per_microbatch = a.forward + a.backward;
  // Saved bytes per layer, in units of n h bytes at bf16 (docs/dry-run.md's tables: GPT's terms,
  // Llama's too; under SP every saved value is this rank's 1/t, the column-wise Linears' inputs
  // included, nn/linear.hpp), less what the recomputed modules drop.
  double units = 2 / split;  // full: the block input
  double moe_units = 2 / split;
  if (!full) {
    double ln_in = 4 / split, qkv_in = 2 / split, attention = 10 / t, fc1_in = 2 / split, hidden = 8 / t, gelu = 8 / t;
    if (rc.core_attn) attention -= 2 / t;           // the core's output heads
    if (rc.norm) qkv_in = fc1_in = 0;               // the norms' outputs
    if (rc.mlp) fc1_in = hidden = gelu = 0;         // ln2's input stays
    else if (rc.act) gelu = 0;
    if (mla) {
      // MLA keeps (nn/latent_attention.hpp's Saved): the latents' norm inputs and the
      // up-projections' inputs (this rank's positions under SP), q, k (k_R in every head), v, the
      // core's output and o_proj's input; selective recomputation drops the core's output.
      const double latents = (qr > 0 ? 2 * qr : 0) + 2 * kvr;
      attention = 2 * latents / h / split + 2 * (2 * H * qk + (rc.core_attn ? 2 : 3) * H * vd) / h / t;
    }
    units = ln_in + qkv_in + attention + fc1_in + hidden + gelu;
    // A MoE feed-forward keeps (parallel/moe.hpp, parallel/experts.hpp): the router's whole
    // input, the experts' input rows and fc1 outputs (SwiGLU: the gate's and the up
    // projection's) and output rows, each sent unit's token index (int64), each received pair's
    // unit index (int64) and gate, and the routing (expert index, gate, kept flag per choice).
    if (is_moe) {
      const double fe = double(m.expert_width()) * (m.llama ? 2 : 1), k = double(m.topk);
      // Shared experts: their dense feed-forward's hidden and activation (SwiGLU: gate, up and product).
      const double fs = double(m.shared_experts * m.expert_width()), shared_bytes = e * n * (m.llama ? 3 : 2) * fs / t;
      const double moe_bytes = e * (n * h + moe.received * (2 * h + fe)) + 8 * moe.units + moe.received * (8 + e) +
                               n * k * (8 + e + 1) + shared_bytes;
      moe_units = ln_in + qkv_in + attention + moe_bytes / (n * h) * 2 / e;
    }
  }
  const double block_saved = n * h * (p.sp ? 34 / t : 8 + 26 / t) * (e / 2);
  const double saved_layer = n * h * units * (e / 2);
  const double saved_moe = n * h * moe_units * (e / 2);
  // What a rank's stages of one micro-batch keep saved, on average per stage.
  const double saved_stage = (layers_per_rank * ((1 - moe_share) * saved_layer + moe_share * saved_moe)) / v;
  // The weight-gradient contexts of one micro-batch's stage between its I and its W (zero-bubble
  // schedules): each Linear's matmul input (gathered under SP) and output gradient
  // (nn/linear.hpp WeightCtx): qkv x h + dy (h + 2 kvd) / t, proj x h / t + dy h, fc1 (SwiGLU's
  // fused w13) x h + dy f / t (2 f / t), fc2 x f / t + dy h; a MoE block's router x h + dy E and
  // experts x, dy (h each) and a, dh (their width each; SwiGLU also d up) per received row.
  // MLA's Linears instead of qkv and proj: q_a_proj x h and dy q_lora_rank on this rank's positions,
  // q_b_proj (or q_proj) x its input and dy H qk / t, kv_a_proj_with_mqa x h and dy kv_lora_rank +
  // rope on this rank's positions, kv_b_proj x kv_lora_rank and dy H (nope + vd) / t, o_proj x
  // H vd / t and dy h.
  const double attn_ctx = mla ? (qr > 0 ? (h + qr) / split : 0) + q_in + H * qk / t + (h + kvr + rope) / split + kvr +
                                    H * (nope + vd) / t + H * vd / t + h
                              : 0;
  const double wctx_dense = mla ? e * n * (attn_ctx + 2 * h + (m.llama ? 3 : 2) * f / t)
                                : e * n * (4 * h + (h + 2 * kvd) / t + h / t + (m.llama ? 3 : 2) * f / t);
  const double wctx_moe =
      is_moe ? e * n *
                       (mla ? attn_ctx + h + double(m.experts)
                            : 2 * h + (h + 2 * kvd) / t + h / t + h + double(m.experts)) +
                   e * moe.received * (2 * h + (m.llama ? 3 : 2) * double(m.expert_width())) +
                   (m.shared_experts > 0
                        ? e * n * (2 * h + (m.llama ? 3 : 2) * double(m.shared_experts * m.expert_width()) / t)
                        : 0)
             : 0;
  const double wctx_stage = layers_per_rank * ((1 - moe_share) * wctx_dense + moe_share * wctx_moe) / v;
  const bool zero_bubble = p.zero_bubble() && p.pp > 1;
  if (zero_bubble) {
    const auto ctx = detail::zero_bubble_held(p.schedule, p.pp, mb, saved_stage > 0 ? wctx_stage / saved_stage : 0);
    a.weight_contexts = ctx.contexts * wctx_stage;
    a.activations_in_flight = ctx.held * saved_stage + a.weight_contexts;
  } else {
    // Stage-micro-batches the first pipeline rank holds at most (pipeline::validate's count).
    const double held = p.pp == 1 ? v : std::min(double(mb) * v, double(p.pp) * v + (v > 1 ? p.pp : 0));
    a.activations_in_flight = held * saved_stage;
  }
  // Memory of the first pipeline rank (the most micro-batches in flight) and the last's logits.
  if (p.zero == 0) a.model_states = rank_params * (e + e + 2 * e);  // values, gradients, AdamW moments in T
  else {
    // ZeRO-1 keeps its fp32 gradient shard inside the full gradients' storage (issue 27).
    const double values = p.zero == 3 ? 0 : 2, full_grads = p.zero == 1 ? 2 : 0, state = p.zero == 1 ? 12 : 16;
    a.model_states = rank_params * (values + full_grads + state / zero_shards) + (p.zero >= 2 ? 2 * rank_params / layers_per_rank : 0);
  }
  // The experts: the same formulas over "edp" (DDP's experts are ZeRO-1 there: the trainer's DDP
  // is ZeRO-1 over a size-1 "fsdp", and the experts' FSDP takes its stage).
  if (p.zero == 0) a.expert_states = expert_params * (e + e + 2 * e / edp);
  else {
    const double values = p.zero == 3 ? 0 : 2, full_grads = p.zero == 1 ? 2 : 0, state = p.zero == 1 ? 12 : 16;
    a.expert_states = expert_params * (values + full_grads + state / edp);
  }
  a.model_states += a.expert_states;
  const double recompute_peak = rc.none() ? 0 : full ? block_saved : block_saved - saved_layer;
  a.activations = a.activations_in_flight + recompute_peak;
  a.logits = 4 * n * double(m.vocab) / t;
  a.memory_bytes = a.model_states + a.activations + a.logits;
  a.fits = fits(a.memory_bytes, hw);
  a.model_flops = m.model_flops_per_token() * double(p.batch) * s;
  if (!a.fits && !time_when_unfit) return a;
  if (zero_bubble) {
    const double w = std::min(a.backward, dense_max * gemms + moe_max * moe.w_gemms + head);
    // DualPipeV's overlapped pairs: the expert all-to-alls (sim/cost_model.hpp, the synopsis).
    const bool pairs = p.schedule == "dualpipev";
    const double fh = pairs ? moe_max * moe.a2a_f : 0, bh = pairs ? moe_max * (moe.a2a_b + (full ? moe.a2a_f : 0)) : 0;
    const auto bubble = detail::zero_bubble_pipeline(p.schedule, p.pp, mb, a.forward, a.backward - w, w, fh, bh);
    a.bubble_seconds = bubble.idle;
    a.pipeline_seconds = mb * per_microbatch + bubble.idle - bubble.hidden;
    a.ep_seconds -= bubble.hidden;
  } else {
    a.pipeline_seconds = (mb + double(p.pp - 1) / v) * per_microbatch;
    a.bubble_seconds = double(p.pp - 1) / v * per_microbatch;
  }
  // Once per step, per unit: the gradient reduction (fp32 reduce-scatter under ZeRO, an
  // all-reduce in T under DDP; HSDP: then an all-reduce of the shard over the replicas; a MoE
  // model's experts: a reduce-scatter on "edp", under DDP too) behind the last backward's
  // compute, ZeRO-1/2's parameter sync (an all-gather in T), the optimizer: AdamW on the fp32
  // shard (read value, moments and gradient, write three), the clip's sum of squares, the shard
  // cast to T after the step and, before the next, into the units' flat buffers (ZeRO-1/2 and
  // DDP's fp32 master); under SP the whole parameters' gradients summed over "tp"; the clip's
  // two all-reduces of a norm (over the stage's ranks and over "pp"). Each of the first and
  // the last pipeline rank ends its schedule at about the same time; the step is the later.
  const double backward_compute = bwd_phase_compute / v;  // the last micro-batch's last stage
  auto once_per_step = [&](const RankUnits& r, double& exposed_reduction, double& sync, double& optimizer) {
    const double params = is_moe ? rank_params : r.params();
    const double shard = p.zero >= 1 ? params / zero_shards : params;
    double reduction = 0;
    sync = 0;
    if (p.dp > 1 || zero_shards > 1) {
      reduction = p.zero >= 1 ? per_unit(r, CollectiveKind::reduce_scatter, zero_group, zero_shards, 4)
                              : per_unit(r, CollectiveKind::all_reduce, "dp", p.dp, e);
      if (p.hsdp > 1) reduction += per_unit(r, CollectiveKind::all_reduce, "rep", p.hsdp, 4.0 / zero_shards);
      if ((p.zero == 1 || p.zero == 2) && zero_shards > 1)
        sync = per_unit(r, CollectiveKind::all_gather, zero_group, zero_shards, e);
    }
    if (is_moe && edp > 1) {
      reduction += coll(CollectiveKind::reduce_scatter, "edp", edp, (mixed ? 4 : e) * expert_params);
      if (p.zero < 3) sync += coll(CollectiveKind::all_gather, "edp", edp, e * expert_params);
    }
    exposed_reduction = exposed_gradient_reduction(reduction, backward_compute, p.overlap_gradient_reduction);
    optimizer = p.zero >= 1
                    ? op_seconds({"adamw_update", std::int64_t(12 * shard), std::int64_t(28 * shard), 0}, hw, cal) +
                          memory_bound(4 * shard + (mixed && p.zero < 3 ? 12 * shard : 0))
                    : op_seconds({"adamw_update", std::int64_t(12 * shard), std::int64_t(7 * e * shard), 0}, hw, cal) +
                          memory_bound(e * shard);
    // The experts' AdamW on their shard (fp32 under mixed precision, as the dense shards'; else
    // in T: read value, gradient and moments, write three, and the clip's sum of squares).
    if (is_moe) {
      const double x = expert_shard;
      optimizer +=
          op_seconds({"adamw_update", std::int64_t(12 * x), std::int64_t((mixed ? 28 : 8 * e) * x), 0}, hw, cal) +
          memory_bound(mixed ? 4 * x + (p.zero < 3 ? 12 * x : 0) : e * x);  // the shard's casts, as the dense
    }
    if (tp_on > 0 && !is_moe) optimizer += coll(CollectiveKind::all_reduce, "tp", p.tp, 4 * r.whole);
    optimizer += coll(CollectiveKind::all_reduce, "rep*dp*cp*tp", p.dp * p.cp * p.tp, 8) +
                 coll(CollectiveKind::all_reduce, "pp", p.pp, 8);
  };
  once_per_step(last_rank, a.gradient_reduction, a.parameter_sync, a.optimizer);
  if (!both_ends) {  // (else the first rank is the last)
    double first_reduction = 0, first_sync = 0, first_optimizer = 0;
    once_per_step(first_rank, first_reduction, first_sync, first_optimizer);
    if (first_reduction + first_sync + first_optimizer > a.gradient_reduction + a.parameter_sync + a.optimizer)
      a.gradient_reduction = first_reduction, a.parameter_sync = first_sync, a.optimizer = first_optimizer;
  }
  a.step_seconds = a.pipeline_seconds + a.gradient_reduction + a.optimizer + a.parameter_sync;
  a.tokens_per_second = double(p.batch) * s / a.step_seconds;
  a.mfu = a.model_flops / a.step_seconds / (double(p.gpus()) * hw.peak_flops());
  return a;
}

}  // namespace dtensor::sim
