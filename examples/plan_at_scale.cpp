// examples/plan_at_scale.cpp — a training plan for thousands of GPUs, run dry on this machine:
// the real training step (models::GPT or models::Llama with parallel::MegatronPlan; pipeline stages with
// DDP, or FSDP / ZeRO-1/2/3 / HSDP; clipping; AdamW) on meta tensors over the sim communicator,
// once per rank class (models/training_plan.hpp), then the report per class and the estimated step
// time on H100s (docs/dry-run.md).
//
//   plan_at_scale                                          # GPT-2 124M-like, bf16, DDP on 8 GPUs
//   plan_at_scale --layers 96 --dim 12288 --heads 96 --seq 2048 --batch 1536 --dp 128 --tp 8
//                 --pp 16 --microbatches 16                # GPT-3 175B-like on 16,384 GPUs
//   plan_at_scale --arch llama --layers 126 --dim 16384 --heads 128 --kv-heads 8 --ffn 53248
//                 --vocab 128256 --seq 8192 --batch 2048 --dp 128 --tp 8 --pp 16 --microbatches 16
//                 --dtype bf16 --trace step.json           # Llama-3-405B's plan
//   plan_at_scale --zero 3 --dp 64 --tp 1 --pp 1 ...       # FSDP (ZeRO-3) on 64 GPUs; --hsdp R
//   plan_at_scale ... --seq 131072 --dp 8 --cp 16 --zero 1 --checkpoint   # Llama 3's long-context plan
//   plan_at_scale ... --recompute selective        # or full (= --checkpoint), or a list: core_attn,norm,act,mlp
//
// What runs: one micro-batch through each pipeline rank's stages (first, middle and last stages,
// uneven layer splits: one class each; --zero 1|2|3: FSDP inside the stages, fp32 master), or,
// under --zero with pp 1 and cp 1, models::GPT / models::Llama under fully_shard. --cp splits every
// sequence (ring, all-gather-KV or Ulysses attention; load-balanced unless --no-cp-balance).
// The pipeline schedule enters through the cost model (parallel/pipeline/simulate.hpp) and the
// activations of the micro-batches in flight are the run's times the schedule's count.
// --experts E (GPT blocks): MoE feed-forwards (every --moe-every-th block, top --topk routing,
// --capacity factor), the experts split over --ep ranks of the data x context ranks, routed
// evenly (the balanced routing a dry run assumes: nn::route_balanced), within --topk-groups M of
// --expert-groups G groups when given (group-limited routing: the merged dispatch's bytes shrink).
//
//   plan_at_scale --layers 32 --dim 4096 --heads 32 --seq 4096 --batch 1024 --dp 64 --tp 8 --pp 4
//                 --microbatches 16 --experts 64 --topk 2 --ep 8 --dtype bf16 --device h200   # MoE on 2,048 GPUs
//
// --kv-lora-rank N with --arch llama (and --q-lora-rank, --qk-nope-dim, --qk-rope-dim, --v-head-dim:
// models/mla_flags.hpp, the trainer's flags and checks): DeepSeek's multi-head latent attention in
// every block (nn::MultiHeadLatentAttention), dry-run as built and charged so by the analytic
// estimate and --search (sim::ModelShape's MLA fields); the report's header and --json give its
// shape and the model's parameters.
//
// The device: --device h100|h200|a100|h100-500w (sim/device.hpp), --device-file F (every field), and
// --device-field name=value for one field. The report: per class its tables, then the plan's step
// (the critical path across classes and pipeline stages, sim::estimate_plan), tokens/s, MFU,
// TFLOP/s per GPU, the slowest class and the memory verdict (in-step peak against the device's
// memory less the reserve); --json prints the same as one JSON object instead of text (a figure
// that cannot be computed is null, its reason under "unavailable"; never NaN or Inf; one plan's
// report only: --json with --search, --serve or --published is refused). MFU counts the model
// FLOPs a token needs (PaLM's 6 N + 12 L h s), N a MoE model's active parameters (the router and
// its top-k experts per MoE block). A plan that does not fit exits with status 3 after its report.
//
//   plan_at_scale --arch llama ... --tp 8 --pp 2 --dtype bf16 --serve 8,8192
//
// --serve BATCH,CONTEXT: serving instead of training: per rank of the busiest pipeline stage the
// weights and the KV cache of BATCH sequences of CONTEXT positions (sim/serving.hpp: what
// models::generate with its cache holds), KV cache per token, and whether it fits the device;
// then the prefill time and the decode latency per token (sim::serving_latency: memory-bound
// decode, TP all-reduces, PP sends and CP all-gathers on the link model). With --cp the KV cache
// is split over the context ranks (models::generate's, parallel::ContextAttention::decode).
//
//   plan_at_scale --search --gpus 16384 --arch llama ... --seq 8192 --batch 2048 [--top 5 --finalists 12]
//
// --search: every plan of the model on --gpus GPUs (sim/search.hpp: tp, cp and its kind, pp with
// its schedule, dp with DDP / ZeRO / HSDP, recomputation), ranked by the analytic estimate
// (sim/analytic.hpp); the best --finalists are dry-run and ranked by the dry run's estimate (0:
// the analytic ranking alone; the output's "ranked by" line says which); the top --top printed
// with the analytic step over the dry run's ("= 0.995 x") and why each lost to the first. A finalist that does not fit in its own dry run (or that the
// dry run refuses) is dropped and the next taken (examples/plan_rescore.hpp; the output counts
// them): no printed plan is one its dry run rejects. DDP in bf16 holds fp32 master values and
// moments (sim::as_run), --bf16-moments for AdamW in bf16 on the values instead.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "dtensor/models/mla_flags.hpp"
#include "dtensor/models/published_dry_run.hpp"
#include "dtensor/models/training_plan.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/sync/traffic.hpp"
#include "dtensor/sim/chrome_trace.hpp"
#include "dtensor/sim/cost_model.hpp"
#include "dtensor/sim/device.hpp"
#include "dtensor/sim/offload_tiers.hpp"
#include "dtensor/sim/published_runs.hpp"
#include "dtensor/sim/search.hpp"
#include "dtensor/sim/serving.hpp"
#include "dtensor/trace/text_file.hpp"
#include "flag_table.hpp"
#include "flags.hpp"
#include "plan_rescore.hpp"

namespace {

using namespace dtensor;
using examples::flag_value;
using examples::UsageError;

// --kv-lora-rank and the MLA shape flags: models::cli::MlaFlags (the trainer's, models/mla_flags.hpp).
struct Options : models::cli::MlaFlags {
  // The defaults: a small plan (GPT-2 124M's shape, bf16, DDP on one node of 8 GPUs), so that a
  // bare `plan_at_scale` runs in a moment and describes something people train; a large plan
  // is given by its flags (the examples above).
  models::TrainingPlan plan{
      .model = {.vocab = 50257, .seq = 1024, .dim = 768, .heads = 12, .layers = 12, .mlp_ratio = 4},
      .batch = 64,
      .microbatches = 1,
      .dp = 8,
      .tp = 1,
      .pp = 1};
  bool sp = true, llama = false, bf16 = true;
  // bf16 under DDP: fp32 master values and AdamW moments (sim::as_run; `ddp_master` when the dry
  // run runs the plan as the ZeRO-1 over one shard that holds them), unless --bf16-moments.
  bool bf16_moments = false, ddp_master = false;
  std::string trace;
  sim::Hardware hardware;
  bool json = false, search = false, published = false;
  long long search_gpus = 0;
  int top = 5, finalists = 12;
  int search_ep = 0;  // --ep with --search: only that expert parallelism
  std::vector<std::pair<std::string, long long>> rank_of;  // --rank-of tp=8,pp=16,dp=128: where that plan ranks, and why
  long long serve_batch = 0, serve_context = 0;            // --serve BATCH,CONTEXT
  // --sync-table: the strategies of parallel/sync/ on the data dimension against DDP (docs/beyond-sync.md),
  // with --inner-steps H, --fragments F, --overlap tau and --staleness s.
  bool sync_table = false;
  int inner_steps = 100, fragments = 4, overlap = 1, staleness = 1;
  // --offload optimizer|params|activations, a comma list (docs/dry-run.md, sim/offload_tiers.hpp): every
  // rank class's bytes per tier (device, host, disk) and the step's transfers at --disk-gbps and
  // --pcie-gbps (GB/s per rank) through --offload-buffer-mib of host staging; the fit is then the
  // device tier's. A flag of one plan, not a dimension of --search.
  sim::TierOptions tiers;
  // Parse state: --device / --device-file (one of them, once), and the --device-field and
  // --peak-tflops fields, applied after both.
  bool device_given = false;
  std::vector<std::pair<std::string, std::string>> device_fields;
};

/// An integer flag of a value inside the plan (`get(o)`: o.plan.model.layers, ...), as examples::integer.
template <std::integral T, class Get>
auto integer_at(Get get, std::type_identity_t<T> lo, std::type_identity_t<T> hi = std::numeric_limits<T>::max()) {
  return [=](Options& o, const std::string& flag, const std::string& v) { get(o) = flag_value<T>(flag, v, lo, hi); };
}

/// Every flag, one row each (examples/flag_table.hpp): the parse, the synopsis and --help.
const examples::FlagTable<Options>& flag_table() {
  using O = Options;
  using examples::integer, examples::set_to;
  auto device = [](O& o, const std::string& f, const std::string& v) {  // --device or --device-file, once
    if (o.device_given) throw UsageError("give one of --device and --device-file, once");
    o.device_given = true;
    o.hardware = f == "--device" ? sim::device(v) : sim::read_device_file(v);
  };
  static const examples::FlagTable<O> rows{
      {"", "",
       "the model (defaults: GPT-2 124M's shape: --layers 12 --dim 768 --heads 12 --vocab 50257 --seq 1024 "
       "--mlp-ratio 4, --dtype bf16):"},
      {"--arch", "gpt|llama", "GPT's blocks (default) or Llama's (RMSNorm, rotary GQA, SwiGLU)",
       [](O& o, const std::string&, const std::string& v) {
         if (v != "gpt" && v != "llama") throw UsageError("--arch " + v + ": gpt or llama");
         o.llama = v == "llama";
       }},
      {"--layers", "N", "transformer blocks", integer_at<Extent>([](O& o) -> auto& { return o.plan.model.layers; }, 1)},
      {"--dim", "N", "the model's width", integer_at<Extent>([](O& o) -> auto& { return o.plan.model.dim; }, 1)},
      {"--heads", "N", "attention heads", integer_at<Extent>([](O& o) -> auto& { return o.plan.model.heads; }, 1)},
      {"--kv-heads", "N", "KV heads (grouped-query attention; dividing --heads)",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.model.kv_heads; }, 1)},
      {"--ffn", "N", "the MLP's width (default --mlp-ratio x --dim)",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.model.ffn; }, 1)},
      {"--vocab", "N", "the vocabulary", integer_at<Extent>([](O& o) -> auto& { return o.plan.model.vocab; }, 1)},
      {"--seq", "N", "positions per sequence", integer_at<Extent>([](O& o) -> auto& { return o.plan.model.seq; }, 1)},
      {"--mlp-ratio", "N", "the MLP's width over --dim",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.model.mlp_ratio; }, 1)},
      {"--dtype", "f32|bf16|fp8",
       "the model's element type (fp32 too, for f32); fp8: bf16 with every Linear's GEMMs in FP8, as "
       "train_gpt --dtype fp8",
       [](O& o, const std::string&, const std::string& v) {
         // f32 as train_gpt spells it; fp32 too (what this tool printed and accepted first).
         if (v != "f32" && v != "fp32" && v != "bf16" && v != "fp8")
           throw UsageError("--dtype " + v + ": f32 (or fp32), bf16 or fp8");
         o.bf16 = v == "bf16" || v == "fp8";
         o.plan.fp8 = v == "fp8";
       }},
      {"--bf16-moments", "",
       "bf16 under DDP: AdamW's moments in bf16 on the values, no fp32 master (default: fp32 "
       "master values and moments)",
       set_to(&O::bf16_moments, true)},
      {"--checkpoint", "", "recompute every block in its backward (= --recompute full)",
       [](O& o, const std::string&, const std::string&) { o.plan.model.checkpoint = true; }},
      {"--recompute", "none|full|selective|core_attn,norm,act,mlp", "what the blocks recompute (nn/recompute.hpp)",
       [](O& o, const std::string&, const std::string& v) {
         try {
           o.plan.model.recompute = nn::Recompute::parse(v);
         } catch (const Error& e) {
           throw UsageError("--recompute " + v + ": " + e.what());
         }
       }},
      {"", "", "the plan (default: --batch 64 --dp 8 --tp 1 --pp 1 --microbatches 1, DDP, SP with --tp):"},
      {"--batch", "N", "sequences per step over all GPUs",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.batch; }, 1)},
      {"--dp", "N", "data-parallel ranks", integer_at<int>([](O& o) -> auto& { return o.plan.dp; }, 1)},
      {"--tp", "N", "tensor-parallel ranks", integer_at<int>([](O& o) -> auto& { return o.plan.tp; }, 1)},
      {"--pp", "N", "pipeline ranks", integer_at<int>([](O& o) -> auto& { return o.plan.pp; }, 1)},
      {"--cp", "N", "context-parallel ranks: every sequence split",
       integer_at<int>([](O& o) -> auto& { return o.plan.cp; }, 1)},
      {"--cp-kind", "ring|allgather|ulysses", "context attention (default ring)",
       [](O& o, const std::string&, const std::string& v) {
         try {
           o.plan.cp_kind = parallel::parse_context_kind(v);
         } catch (const Error& e) {
           throw UsageError("--cp-kind: " + std::string(e.what()));
         }
       }},
      {"--no-cp-balance", "", "the sequence's chunks in order (default: load-balanced over the context ranks)",
       [](O& o, const std::string&, const std::string&) { o.plan.cp_balanced = false; }},
      {"--zero", "0|1|2|3", "0: DDP (default); 1, 2, 3: FSDP / ZeRO inside the stages (fp32 master)",
       integer_at<int>([](O& o) -> auto& { return o.plan.zero; }, 0, 3)},
      {"--hsdp", "R", "HSDP: R replicas of the ZeRO shards",
       integer_at<int>([](O& o) -> auto& { return o.plan.hsdp; }, 1)},
      {"--microbatches", "N", "micro-batches per step (dividing --batch)",
       integer_at<int>([](O& o) -> auto& { return o.plan.microbatches; }, 1)},
      {"--schedule", "gpipe|1f1b|interleaved|zb|zbv|dualpipev", "the pipeline schedule",
       [](O& o, const std::string&, const std::string& v) {
         try {
           (void)parallel::pipeline::parse_schedule_kind(v);
         } catch (const Error& e) {
           throw UsageError("--schedule: " + std::string(e.what()));
         }
         o.plan.schedule = v;
       }},
      {"--stages-per-rank", "N", "pipeline stages on each rank (interleaved)",
       integer_at<int>([](O& o) -> auto& { return o.plan.stages_per_rank; }, 1)},
      {"--no-sp", "", "no sequence parallelism with --tp", set_to(&O::sp, false)},
      {"", "", "the software (default: dtensor's, fused attention and the gradient reduction behind the backward):"},
      {"--unfused-attention", "",
       "the attention scores in HBM (QK^T, softmax, dropout, PV as separate kernels: Megatron-LM of 2021/22); the "
       "dry run records their traffic",
       [](O& o, const std::string&, const std::string&) { o.plan.fused_attention = false; }},
      {"--no-overlap-grad-reduce", "",
       "the gradient reduction after the last backward, exposed (Megatron-LM of 2021/22), not behind it",
       [](O& o, const std::string&, const std::string&) { o.plan.overlap_gradient_reduction = false; }},
      {"", "",
       "mixture of experts (GELU experts in GPT blocks, SwiGLU in --arch llama's; routed evenly, as a dry run "
       "assumes):"},
      {"--experts", "E", "MoE feed-forwards of E experts",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.router.experts; }, 1)},
      {"--topk", "K", "top-K routing", integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.router.topk; }, 1)},
      {"--ep", "N", "the experts over N of the data x context ranks",
       integer_at<int>([](O& o) -> auto& { return o.plan.ep; }, 1)},
      {"--moe-every", "N", "every N-th block a MoE block",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.every; }, 1)},
      {"--dense-first", "N", "the first N blocks dense (DeepSeek-V3: 3)",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.dense_first; }, 0)},
      {"--capacity", "F", "the capacity factor",
       [](O& o, const std::string& f, const std::string& v) {
         o.plan.moe.router.capacity_factor = examples::positive_flag_value(f, v);
       }},
      {"--expert-ffn", "N", "the experts' width (default the dense feed-forward's: --ffn, else --mlp-ratio x --dim)",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.hidden; }, 1)},
      {"--shared-experts", "N",
       "N shared experts (DeepSeek's): one feed-forward of N x the experts' width every token passes",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.shared; }, 1)},
      {"--expert-groups", "G",
       "G groups of E / G consecutive experts for --topk-groups (default 1; G = --ep: a group per expert rank)",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.router.groups; }, 1)},
      {"--topk-groups", "M",
       "group-limited routing (DeepSeek-V3's node-limited): each token's top-K from M of the G groups, so its "
       "row travels to at most M groups' ranks (the balanced routing keeps the limit)",
       integer_at<Extent>([](O& o) -> auto& { return o.plan.moe.router.topk_groups; }, 1)},
      {"--ep-node-size", "L",
       "the node-level dispatch (DeepSeek-V3's): the --ep ranks as nodes of L, a token across once per node its "
       "choices reach, then forwarded inside (--search: nodes of gcd(ep, L); default: one row per token and expert "
       "rank)",
       integer_at<int>([](O& o) -> auto& { return o.plan.moe.node_size; }, 1)},
      {"", "", "the device (sim/device.hpp; default h100) and the report:"},
      {"--device", "h100|h200|a100|h100-500w", "a known device", device},
      {"--device-file", "F", "a device file with every field", device},
      {"--device-field", "NAME=VALUE",
       "one field of the device: name peak_bf16_tflops peak_fp32_tflops "
       "hbm_gbytes_per_s memory_gbytes nvlink_domain nvlink_gbytes_per_s nvlink_latency_us "
       "network_gbps network_latency_us [compute_scale sm_count gemm_tile_m gemm_tile_n gemm_overhead_us]",
       [](O& o, const std::string&, const std::string& v) {
         const auto eq = v.find('=');
         if (eq == std::string::npos) throw UsageError("--device-field " + v + ": expected NAME=VALUE");
         o.device_fields.emplace_back(v.substr(0, eq), v.substr(eq + 1));
       }},
      {"--peak-tflops", "X", "the device's bf16 peak (at most 1e6)",
       [](O& o, const std::string& f, const std::string& v) {
         // A bound well past any GPU (an H200 is ~1e3 bf16): 1e300 was accepted and made the MFU 0.
         const double peak = examples::positive_flag_value(f, v);
         if (peak > 1e6) throw UsageError("--peak-tflops " + v + " exceeds 1e6 TFLOP/s per GPU");
         o.device_fields.emplace_back("peak_bf16_tflops", std::to_string(peak));
       }},
      {"--trace", "FILE", "a Chrome trace of the step", examples::text(&O::trace)},
      {"--json", "", "the report as one JSON object (one plan's report only)", set_to(&O::json, true)},
      {"", "", "--search, --serve, --published, --sync-table, --offload:"},
      {"--search", "", "every plan of the model on --gpus GPUs, ranked (sim/search.hpp)", set_to(&O::search, true)},
      {"--gpus", "N", "--search: the GPUs", integer(&O::search_gpus, 1, 1LL << 31)},
      {"--top", "K", "--search: the plans printed (default 5)", integer(&O::top, 1, 1000)},
      {"--finalists", "N", "--search: the analytic best that are dry-run (default 12; 0: the analytic ranking alone)",
       integer(&O::finalists, 0, 1000)},
      {"--rank-of", "tp=T,pp=P,dp=D[,cp=C,v=V,zero=Z,micro=B,ep=E]", "--search: where that plan ranks, and why",
       [](O& o, const std::string&, const std::string& spec) {
         std::size_t begin = 0;
         while (begin < spec.size()) {
           const std::size_t end = std::min(spec.find(',', begin), spec.size());
           const std::string item = spec.substr(begin, end - begin);
           const auto eq = item.find('=');
           const std::string key = item.substr(0, eq);
           if (eq == std::string::npos || (key != "tp" && key != "pp" && key != "dp" && key != "cp" && key != "v" &&
                                           key != "zero" && key != "micro" && key != "ep"))
             throw UsageError("--rank-of " + spec + ": expected KEY=N items, KEY one of tp pp dp cp v zero micro ep");
           o.rank_of.emplace_back(key, flag_value<long long>("--rank-of " + key, item.substr(eq + 1), 0, 1LL << 31));
           begin = end + 1;
         }
       }},
      {"--published", "", "the published runs' plans against their reported figures", set_to(&O::published, true)},
      {"--serve", "BATCH,CONTEXT", "serving instead of training: weights and KV cache per rank, prefill and decode",
       [](O& o, const std::string&, const std::string& spec) {
         const auto comma = spec.find(',');
         if (comma == std::string::npos) throw UsageError("--serve " + spec + ": expected BATCH,CONTEXT");
         o.serve_batch = flag_value<long long>("--serve batch", spec.substr(0, comma), 1, 1LL << 31);
         o.serve_context = flag_value<long long>("--serve context", spec.substr(comma + 1), 1, 1LL << 31);
       }},
      {"--sync-table", "", "the strategies of parallel/sync/ on the data dimension against DDP",
       set_to(&O::sync_table, true)},
      {"--inner-steps", "H", "--sync-table: local steps per sync (default 100)", integer(&O::inner_steps, 1, 1 << 20)},
      {"--fragments", "F", "--sync-table: Streaming DiLoCo's pieces (default 4)", integer(&O::fragments, 1, 1 << 20)},
      {"--overlap", "T", "--sync-table: steps an all-reduce overlaps (default 1)", integer(&O::overlap, 0, 1 << 20)},
      {"--staleness", "S", "--sync-table: async's delay (default 1)", integer(&O::staleness, 0, 1 << 20)},
      {"--offload", "optimizer,params,activations",
       "a comma list: every rank class's bytes per tier (device, host, "
       "disk) and the step's transfers (sim/offload_tiers.hpp)",
       [](O& o, const std::string&, const std::string& v) {
         try {
           o.tiers.offload = sim::parse_offload(v);
         } catch (const Error& e) {
           throw UsageError("--offload: " + std::string(e.what()));
         }
       }},
      {"--disk-gbps", "X", "--offload: the disk's GB/s per rank",
       [](O& o, const std::string& f, const std::string& v) {
         o.tiers.disk_bytes_per_second = 1e9 * examples::positive_flag_value(f, v);
       }},
      {"--pcie-gbps", "X", "--offload: PCIe's GB/s per rank",
       [](O& o, const std::string& f, const std::string& v) {
         o.tiers.pcie_bytes_per_second = 1e9 * examples::positive_flag_value(f, v);
       }},
      {"--offload-buffer-mib", "X", "--offload: the host staging buffer",
       [](O& o, const std::string& f, const std::string& v) {
         o.tiers.buffer_bytes = double(1 << 20) * examples::positive_flag_value(f, v);
       }},
      {"--help", "", "this text (also -h; anywhere on the line, before any flag is checked)"},
  };
  // The trainer's MLA rows (models/mla_flags.hpp) after the model's sizes.
  static const examples::FlagTable<O> table = [] {
    const auto at = std::find_if(rows.begin(), rows.end(), [](const auto& r) { return r.name == "--mlp-ratio"; });
    return examples::joined_rows<O>({examples::FlagTable<O>(rows.begin(), at + 1), models::cli::mla_flag_rows<O>(),
                                     examples::FlagTable<O>(at + 1, rows.end())});
  }();
  return table;
}

sim::ModelShape model_shape(const Options& o) {
  const auto& m = o.plan.model;
  const auto& moe = o.plan.moe;
  return sim::with_mla({.layers = m.layers,
                        .dim = m.dim,
                        .heads = m.heads,
                        .kv_heads = m.kv_heads,
                        .ffn = m.ffn ? m.ffn : m.mlp_ratio * m.dim,
                        .vocab = m.vocab,
                        .seq = m.seq,
                        .llama = o.llama,
                        .experts = moe.router.experts,
                        .topk = moe.router.topk,
                        .moe_every = moe.every,
                        // The experts' width as models::MoELayers builds them: --expert-ffn, else the dense width.
                        .expert_ffn = moe.router.experts == 0 ? 0
                                      : moe.hidden            ? moe.hidden
                                      : m.ffn                 ? m.ffn
                                                              : m.mlp_ratio * m.dim,
                        .shared_experts = moe.router.experts == 0 ? 0 : moe.shared,
                        .expert_groups = moe.router.groups,
                        .topk_groups = moe.router.topk_groups,
                        .dense_first = moe.router.experts == 0 ? 0 : moe.dense_first},
                       m.mla);
}

Options parse(int argc, char** argv) {
  Options o;
  auto& m = o.plan.model;
  const std::vector<std::string> given = examples::parse_flags(flag_table(), o, argc, argv, "plan_at_scale");
  for (const auto& [name, text] : o.device_fields) sim::set_device_field(o.hardware, name, text);
  o.hardware.fp32 = !o.bf16;
  o.hardware.check("plan_at_scale --device");
  const auto was_given = [&](const char* flag) { return std::find(given.begin(), given.end(), flag) != given.end(); };
  // MLA: the trainer's checks (a UsageError naming the flag), then the model's attention shape.
  models::cli::check_mla_flags(o, o.llama ? "llama" : "gpt", m.kv_heads);
  m.mla = models::cli::latent_attention_config(o);
  // Flags that only mean something beside another one are errors alone, not silently ignored.
  for (const char* f : {"--topk", "--moe-every", "--dense-first", "--ep", "--capacity", "--expert-ffn",
                        "--shared-experts", "--expert-groups", "--topk-groups", "--ep-node-size"})
    if (was_given(f) && !o.plan.has_experts()) throw UsageError(std::string(f) + " has no effect without --experts E");
  for (const char* f : {"--gpus", "--top", "--finalists", "--rank-of"})
    if (was_given(f) && !o.search) throw UsageError(std::string(f) + " has no effect without --search");
  for (const char* f : {"--inner-steps", "--fragments", "--overlap", "--staleness"})
    if (was_given(f) && !o.sync_table) throw UsageError(std::string(f) + " has no effect without --sync-table");
  for (const char* f : {"--disk-gbps", "--pcie-gbps", "--offload-buffer-mib"})
    if (was_given(f) && !o.tiers.offload.any()) throw UsageError(std::string(f) + " has no effect without --offload");
  if (o.tiers.offload.any() && (o.search || o.published || o.json || was_given("--serve")))
    throw UsageError("--offload is for one plan's text report (not --search, --published, --serve or --json)");
  if (o.sync_table && (o.fragments > o.inner_steps || o.overlap >= o.inner_steps))
    throw UsageError("--sync-table: --fragments " + std::to_string(o.fragments) + " and --overlap " + std::to_string(o.overlap) +
                     " must be at most and below --inner-steps " + std::to_string(o.inner_steps));
  if (o.sync_table && (o.search || o.published || o.json)) throw UsageError("--sync-table is for one plan's text report");
  // The software flags describe one plan's dry run: --published rows carry their own software,
  // --search ranks dtensor's, --serve runs no training step.
  for (const char* f : {"--unfused-attention", "--no-overlap-grad-reduce"})
    if (was_given(f) && (o.search || o.published || was_given("--serve")))
      throw UsageError(std::string(f) +
                       " is for one plan's dry run (not --search, --serve or --published: each "
                       "published row states its own software)");
  if (o.json && (o.search || o.published || was_given("--serve")))
    throw UsageError("--json is for one plan's report (not --search, --serve or --published: those print text)");
  if (o.bf16_moments && !o.bf16) throw UsageError("--bf16-moments needs --dtype bf16 (an fp32 model's moments are fp32)");
  if (o.bf16_moments && o.plan.zero > 0)
    throw UsageError("--bf16-moments is for DDP (--zero 0): fully_shard keeps fp32 master values and moments");
  if (o.plan.fp8 && o.hardware.peak_fp8_flops <= 0)
    throw UsageError("--dtype fp8 on --device " + o.hardware.name + ": it has no FP8 tensor cores (peak_fp8_tflops 0)");
  if (o.plan.fp8 && (o.plan.model.checkpoint || o.plan.model.recompute.full || o.plan.model.recompute.mlp))
    throw UsageError(
        "--dtype fp8 with --checkpoint or --recompute full|mlp: a recomputed Linear would record its FP8 "
        "amaxes twice (docs/fp8.md), as train_gpt refuses it");
  if (o.published) return o;
  // The dry run builds every block and expert as a module and walks the sequence's positions (the
  // context layout, the pipeline's per-token work): sizes past these bounds would exhaust memory
  // (std::bad_alloc) or run for minutes before any report. Far above published models (Llama 3:
  // 126 layers, 131,072 positions; DeepSeek-V3: 256 experts).
  if (m.layers > 100'000) throw UsageError("--layers " + std::to_string(m.layers) + " exceeds the dry run's 100000");
  if (o.plan.moe.router.experts > 100'000)
    throw UsageError("--experts " + std::to_string(o.plan.moe.router.experts) + " exceeds the dry run's 100000");
  if (m.seq > (Extent(1) << 24)) throw UsageError("--seq " + std::to_string(m.seq) + " exceeds the dry run's 16777216");
  examples::check_kv_heads(m.heads, m.kv_heads);
  // Sizes whose element counts overflow int64 end here, before any work (plan or search).
  try {
    sim::check_model_sizes(model_shape(o), o.plan.batch, "plan_at_scale");
  } catch (const Error& e) {
    throw UsageError("the model flags (--layers, --dim, --ffn, --vocab, --seq, --batch): " + std::string(e.what()));
  }
  if (o.search) {
    if (o.search_gpus == 0) throw UsageError("--search needs --gpus N");
    if (was_given("--zero") || was_given("--hsdp"))
      throw UsageError("--zero and --hsdp are dimensions of --search (it tries DDP, ZeRO-1/2/3 and HSDP)");
    o.search_ep = was_given("--ep") ? o.plan.ep : 0;  // given: only that ep; else every one the search allows
    return o;
  }
  const auto number = [](auto n) { return std::to_string(n); };
  if (m.heads % o.plan.tp != 0) throw UsageError("--heads " + number(m.heads) + " is not a multiple of --tp " + number(o.plan.tp));
  if (m.dim % m.heads != 0) throw UsageError("--dim " + number(m.dim) + " is not a multiple of --heads " + number(m.heads));
  if (o.plan.batch % o.plan.microbatches != 0)
    throw UsageError("--batch " + number(o.plan.batch) + " is not a multiple of --microbatches " +
                     number(o.plan.microbatches));
  // Before the dry run (which may take a while): the trace's directory must exist (the trace is
  // written after it, checked again then), and the plan must be one (the GPU count fits an int).
  examples::check_output_file("--trace", o.trace);  // a directory, a missing or unwritable one (flags.hpp)
  sim::check_plan(o.plan);
  // DDP in bf16 as it runs (sim::as_run, inside the dry run): ZeRO-1 over one shard per data
  // rank, fp32 master and moments.
  o.plan.bf16_moments = o.bf16_moments;
  o.ddp_master = sim::as_run(o.plan, o.bf16).zero != o.plan.zero;
  return o;
}

std::vector<models::PlanClass> dry_run_any(const Options& o) {
  return examples::dry_run_any(o.plan, o.llama, o.bf16, o.sp);
}

/// What the report says about a whole plan.
struct PlanSummary {
  sim::PlanEstimate estimate;
  double step = 0, tokens_per_second = 0, mfu = 0, model_tflops_per_gpu = 0, hardware_tflops_per_gpu = 0;
  double memory = 0;           // the most any rank holds in the step, in-flight micro-batches included (--offload: on the device)
  std::vector<sim::TierReport> tiers;  // --offload: per class
  std::size_t memory_class = 0;
  double construction = 0;     // the most any rank holds while the trainer is built (its "parameters" phase)
  std::size_t construction_class = 0;
  bool construction_fits = false;
  bool fits = false;           // the step and the construction both fit
};

/// A rank class's tiers' input (sim::tier_input_of): the master apart from the values where the
/// dry run's optimizer holds one (fully_shard<float>: ZeRO-3, or a bf16 model under ZeRO-1/2;
/// zero 0 is AdamW straight on the parameters).
sim::TierInput tier_input(const Options& o, const models::PlanClass& c) {
  const bool separate_master = o.plan.zero == 3 || (o.plan.zero > 0 && o.bf16) || o.ddp_master;
  auto in = sim::tier_input_of(c.report, c.peak_in_flight, separate_master);
  if (o.tiers.offload.activations) {
    // --offload activations (nn::ActivationOffload, a block at a time): what the micro-batch
    // stages in flight at the rank's peak leave saved — the dry run's forward measures one
    // micro-batch on one stage (saved_per_stage) — over their blocks.
    const auto& p = o.plan;
    const int stages = p.pipelined() ? p.pp * models::plan_schedule(p).layout.stages_per_rank : 1;
    const int per_stage = int((p.model.layers + stages - 1) / stages);
    const double held = c.held_at_peak > 0 ? c.held_at_peak : double(c.in_flight);
    in.saved_activations = std::min(in.activations_peak, held * double(c.saved_per_stage));
    in.blocks = std::max(1, int(std::lround(held)) * per_stage);
  }
  return in;
}

PlanSummary summarize(const Options& o, const std::vector<models::PlanClass>& classes) {
  const auto& p = o.plan;
  PlanSummary r;
  const auto score = examples::dry_score(p, classes, o.hardware);  // what --search ranks by (plan_rescore.hpp)
  r.estimate = score.estimate;
  r.step = score.step;
  const double gpus = double(p.gpus()), tokens = double(p.batch) * double(p.model.seq);
  r.tokens_per_second = tokens / r.step;
  double executed = 0;  // FLOPs all ranks run in a step (recomputation included)
  for (const auto& c : classes)
    for (const auto& ph : c.report.phases)
      executed += double(ph.flops()) * double(c.report.ranks) *
                  (sim::is_microbatch_phase(ph.name) ? double(p.microbatches) : 1.0);
  r.hardware_tflops_per_gpu = executed / gpus / r.step / 1e12;
  // PaLM's count; a MoE model's with the parameters a token multiplies (router, top-k experts).
  const double model_flops = model_shape(o).model_flops_per_token() * tokens;
  r.model_tflops_per_gpu = model_flops / gpus / r.step / 1e12;
  r.mfu = model_flops / (gpus * o.hardware.peak_flops() * r.step);
  r.memory = score.memory, r.memory_class = score.memory_class, r.fits = score.fits;
  r.construction = score.construction, r.construction_class = score.construction_class;
  r.construction_fits = score.construction_fits;
  if (o.tiers.offload.any()) {  // --offload: what stays on the device
    r.memory = 0;
    for (std::size_t i = 0; i < classes.size(); ++i) {
      r.tiers.push_back(sim::offload_tiers(tier_input(o, classes[i]), o.tiers));
      const double device = r.tiers.back().bytes.device;
      if (device > r.memory) r.memory = device, r.memory_class = i;
    }
    r.fits = sim::fits(r.memory, o.hardware) && r.construction_fits;
  }
  return r;
}

/// A JSON number, or null where the figure is not finite (JSON has no NaN or Inf): `missing`
/// then gets the field's name and why, printed as the report's "unavailable" object.
std::string json_number(double x, const char* field, std::vector<std::string>& missing) {
  if (std::isfinite(x)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", x);
    return buf;
  }
  missing.push_back(std::string("\"") + field + "\":\"" +
                    (std::isnan(x) ? "not a number (a ratio of zeros: a step or class without work)"
                                   : "infinite (divided by a zero step time)") + "\"");
  return "null";
}

std::string json_string(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

/// The blocks' attention in --json: multi-head ("mha"), grouped-query ("gqa", its KV heads) or
/// multi-head latent ("mla", its shape).
std::string attention_json(const models::GPTConfig& m) {
  const auto& c = m.mla;
  if (c.enabled())
    return examples::cat("{\"kind\":\"mla\",\"q_lora_rank\":", c.q_lora_rank, ",\"kv_lora_rank\":", c.kv_lora_rank,
                         ",\"qk_nope_head_dim\":", c.qk_nope_head_dim, ",\"qk_rope_head_dim\":", c.qk_rope_head_dim,
                         ",\"v_head_dim\":", c.v_head_dim, "}");
  if (m.kv_heads != 0 && m.kv_heads != m.heads)
    return examples::cat("{\"kind\":\"gqa\",\"kv_heads\":", m.kv_heads, "}");
  return "{\"kind\":\"mha\"}";
}

void print_json(const Options& o, const std::vector<models::PlanClass>& classes, const PlanSummary& r, double seconds) {
  const auto& p = o.plan;
  std::vector<std::string> missing;  // "field":"why" of every null
  const auto num = [&](double x, const std::string& field) { return json_number(x, field.c_str(), missing); };
  std::string out = examples::cat(
      "{\"gpus\":", p.gpus(), ",\"pp\":", p.pp, ",\"dp\":", p.dp, ",\"cp\":", p.cp, ",\"tp\":", p.tp,
      ",\"zero\":", p.zero, ",\"fp32_master\":", o.ddp_master || p.zero > 0 || !o.bf16 ? "true" : "false",
      ",\"microbatches\":", p.microbatches, ",\"schedule\":", json_string(p.schedule),
      ",\"parameters\":", num(model_shape(o).params(), "parameters"), ",\"attention\":", attention_json(p.model),
      ",\"fused_attention\":", p.fused_attention ? "true" : "false",
      ",\"overlap_gradient_reduction\":", p.overlap_gradient_reduction ? "true" : "false",
      ",\"device\":", json_string(o.hardware.name), ",\"step_seconds\":", num(r.step, "step_seconds"),
      ",\"pipeline_seconds\":", num(r.estimate.pipeline_seconds, "pipeline_seconds"),
      ",\"bubble_fraction\":", num(r.estimate.bubble_fraction, "bubble_fraction"),
      ",\"tokens_per_second\":", num(r.tokens_per_second, "tokens_per_second"), ",\"mfu\":", num(r.mfu, "mfu"),
      ",\"model_tflops_per_gpu\":", num(r.model_tflops_per_gpu, "model_tflops_per_gpu"),
      ",\"hardware_tflops_per_gpu\":", num(r.hardware_tflops_per_gpu, "hardware_tflops_per_gpu"),
      ",\"memory_bytes\":", num(r.memory, "memory_bytes"),
      ",\"device_memory_bytes\":", num(o.hardware.memory_bytes, "device_memory_bytes"),
      ",\"memory_reserve_fraction\":", num(sim::memory_reserve_fraction, "memory_reserve_fraction"),
      ",\"fits\":", r.fits ? "true" : "false", ",\"construction_bytes\":", num(r.construction, "construction_bytes"),
      ",\"construction_fits\":", r.construction_fits ? "true" : "false",
      ",\"slowest_class\":", json_string(classes[r.estimate.slowest].report.name),
      ",\"dry_run_seconds\":", num(seconds, "dry_run_seconds"), ",\"classes\":[");
  for (std::size_t i = 0; i < classes.size(); ++i) {
    const auto& c = classes[i];
    const auto& e = r.estimate.classes[i];
    const std::string at = "classes[" + std::to_string(i) + "].";
    out += examples::cat(
        i ? "," : "", "{\"name\":", json_string(c.report.name), ",\"ranks\":", (long long)c.report.ranks,
        ",\"pipeline_rank\":", c.pipeline_rank, ",\"step_seconds\":", num(e.step_seconds, at + "step_seconds"),
        ",\"once_per_step_seconds\":", num(e.once_per_step_seconds, at + "once_per_step_seconds"),
        ",\"compute_seconds\":", num(e.compute_seconds, at + "compute_seconds"),
        ",\"communication_seconds\":", num(e.communication_seconds, at + "communication_seconds"),
        ",\"exposed_communication_seconds\":", num(e.exposed_communication_seconds, at + "exposed_communication_seconds"),
        ",\"memory_bytes\":", num(c.peak_in_flight, at + "memory_bytes"),
        ",\"construction_bytes\":", (long long)c.report.construction_peak_total(), ",\"memory_by_tag\":{");
    bool first = true;
    for (std::size_t t = 0; t < memory_tag_count; ++t) {
      std::int64_t peak = 0;
      for (const auto& ph : c.report.phases)
        if (ph.name != sim::RankReport::construction_phase) peak = std::max(peak, ph.peak[t]);
      if (peak == 0) continue;
      out += examples::cat(first ? "" : ",", json_string(std::string(name_of(MemoryTag(t)))), ":", (long long)peak);
      first = false;
    }
    out += "}}";
  }
  out += "]";
  if (!missing.empty()) {
    out += ",\"unavailable\":{";
    for (std::size_t i = 0; i < missing.size(); ++i) out += (i ? "," : "") + missing[i];
    out += "}";
  }
  std::printf("%s}\n", out.c_str());
}

void print_header(const Options& o) {
  const auto& p = o.plan;
  const auto& m = p.model;
  const std::string context = p.cp > 1 ? " x cp " + std::to_string(p.cp) + " (" + std::string(parallel::name_of(p.cp_kind)) +
                                              (p.cp_balanced ? ", load-balanced)" : ")")
                                        : "";
  std::printf(
      "plan_at_scale: %lld GPUs = pp %d x dp %d%s x tp %d%s; %s; %s schedule, %d micro-batches; %s; device %s\n",
      p.gpus(), p.pp, p.dp, context.c_str(), p.tp, o.sp ? " + SP" : "",
      o.ddp_master  ? "DDP with fp32 master values and AdamW moments (run as ZeRO-1 over one shard per data rank)"
      : p.zero == 0 ? (o.bf16 ? "DDP, AdamW moments in bf16 (no fp32 master)" : "DDP")
                    : (p.hsdp > 1 ? "HSDP " + std::to_string(p.hsdp) + " x " : std::string(""))
                          .append("ZeRO-" + std::to_string(p.zero))
                          .c_str(),
      p.schedule.c_str(), p.microbatches,
      o.plan.fp8 ? "bf16, FP8 GEMMs"
      : o.bf16   ? "bf16"
                 : "fp32",
      o.hardware.name.c_str());
  // A power-limited device (sim/device.hpp): its GEMMs and attention at a share of the calibrated rates.
  if (o.hardware.compute_scale != 1)
    std::printf("device %s: GEMMs and attention at %.2f of the calibrated rates (compute_scale; MFU still counts the "
                "rated %.0f TFLOP/s)\n", o.hardware.name.c_str(), o.hardware.compute_scale, o.hardware.peak_flops() / 1e12);
  if (p.has_experts())
    std::printf("MoE: %lld %s experts, top-%lld, every %lld blocks after %lld dense, over ep %d (balanced routing)%s\n",
                (long long)p.moe.router.experts, o.llama ? "SwiGLU" : "GELU MLP", (long long)p.moe.router.topk,
                (long long)p.moe.every, (long long)p.moe.dense_first, p.ep,
                p.moe.shared > 0 ? (", " + std::to_string(p.moe.shared) + " shared").c_str() : "");
  std::printf("model: %s, %lld layers, dim %lld, %lld heads (%lld KV), ffn %lld, vocab %lld, seq %lld, global batch %lld%s\n",
              o.llama ? "llama" : "gpt", (long long)m.layers, (long long)m.dim, (long long)m.heads,
              (long long)(m.kv_heads ? m.kv_heads : m.heads), (long long)(m.ffn ? m.ffn : m.mlp_ratio * m.dim),
              (long long)m.vocab, (long long)m.seq, (long long)p.batch,
              m.checkpoint || m.recompute.full ? ", activation checkpointing"
              : m.recompute.modules()           ? (", recompute " + m.recompute.to_string()).c_str()
                                                : "");
  if (!p.fused_attention || !p.overlap_gradient_reduction)
    std::printf("software: %s%s%s\n", p.fused_attention ? "" : "attention scores in HBM (unfused kernels)",
                !p.fused_attention && !p.overlap_gradient_reduction ? "; " : "",
                p.overlap_gradient_reduction ? "" : "gradient reduction after the backward (exposed)");
  if (m.mla.enabled())
    std::printf(
        "attention: multi-head latent (MLA): q latent %lld, kv latent %lld, head %lld + %lld rotary, v %lld; "
        "%.4g B parameters\n",
        (long long)m.mla.q_lora_rank, (long long)m.mla.kv_lora_rank, (long long)m.mla.qk_nope_head_dim,
        (long long)m.mla.qk_rope_head_dim, (long long)m.mla.v_head_dim, model_shape(o).params() / 1e9);
}

/// --sync-table: the slowest class's gradient reduction (what DDP all-reduces on the data
/// dimension, E elements) priced per strategy by parallel::sync::sync_step_cost from DDP's times
/// in this dry run: the step is the plan's, less DDP's exposed reduction, plus the strategy's.
void print_sync_table(const Options& o, const std::vector<models::PlanClass>& classes, const PlanSummary& r) {
  using parallel::sync::SyncKind;
  const std::size_t slowest = r.estimate.slowest;
  const auto& report = classes[slowest].report;
  const auto& est = r.estimate.classes[slowest];
  double payload = 0, element_bytes = 0, other_phases = 0;
  for (std::size_t i = 0; i < report.phases.size(); ++i) {
    const auto& ph = report.phases[i];
    for (const auto& c : ph.collectives)
      if (sim::comm_role(c, ph.name) == sim::CommRole::gradient_reduction) {
        payload += double(c.bytes);
        element_bytes = double(size_of(c.dtype));
      }
    if (!sim::is_microbatch_phase(ph.name)) other_phases += est.phases[i].total();
  }
  if (payload == 0) {
    std::printf("\n--sync-table: no gradient reduction on a data dimension in this plan (dp 1)\n");
    return;
  }
  const double exposed = std::max(0.0, est.once_per_step_seconds - other_phases);
  const parallel::sync::SyncTiming timing{.reduce_seconds = est.gradient_reduction_seconds, .exposed_seconds = exposed,
                                          .compute_seconds = r.step - exposed};
  const std::size_t elements = std::size_t(payload / element_bytes);
  const int h = o.inner_steps, f = o.fragments, tau = o.overlap;
  struct Row {
    std::string name;
    parallel::sync::SyncSetting setting;
  };
  const std::vector<Row> rows = {
      {"ddp", {.kind = SyncKind::ddp}},
      {"async s=" + std::to_string(o.staleness), {.kind = SyncKind::async, .staleness = o.staleness}},
      {"local-sgd H=" + std::to_string(h), {.kind = SyncKind::local_sgd, .inner_steps = h}},
      {"diloco H=" + std::to_string(h), {.kind = SyncKind::diloco, .inner_steps = h}},
      {"diloco H=" + std::to_string(h) + " bf16", {.kind = SyncKind::diloco, .inner_steps = h, .bf16_reduce = true}},
      {"streaming H=" + std::to_string(h) + " F=" + std::to_string(f), {.kind = SyncKind::diloco, .inner_steps = h, .fragments = f}},
      {"streaming H=" + std::to_string(h) + " F=" + std::to_string(f) + " tau=" + std::to_string(tau),
       {.kind = SyncKind::diloco, .inner_steps = h, .fragments = f, .overlap_steps = tau}},
      {"fedavg L=" + std::to_string(h), {.kind = SyncKind::fedavg, .inner_steps = h}},
  };
  std::printf("\nsync strategies on the data dimension (%s, %s of gradients of %.0f-byte elements per rank; DDP's reduction "
              "%.3f s, %.3f s of it exposed; docs/beyond-sync.md):\n",
              report.name.c_str(), sim::human_bytes(payload).c_str(), element_bytes, est.gradient_reduction_seconds, exposed);
  std::printf("  %-28s %14s %14s %12s %12s %10s %9s\n", "strategy", "bytes/step", "peak bytes", "comm s/step", "exposed s",
              "step s", "vs DDP");
  const double ddp_step = r.step;
  for (const auto& row : rows) {
    const auto c = parallel::sync::sync_step_cost(row.setting, elements, std::size_t(element_bytes), timing);
    std::printf("  %-28s %14.0f %14.0f %12.4f %12.4f %10.4f %8.3fx\n", row.name.c_str(), c.payload_bytes, c.peak_payload_bytes,
                c.comm_seconds, c.exposed_seconds, c.step_seconds, ddp_step / c.step_seconds);
  }
}

/// --offload: each rank class's tiers and transfers, and how much of them the step's compute hides.
void print_offload(const Options& o, const std::vector<models::PlanClass>& classes, const PlanSummary& r) {
  const auto& t = o.tiers;
  std::printf("\noffload %s (sim/offload_tiers.hpp; disk %.3g GB/s and PCIe %.3g GB/s per rank%s):\n",
              t.offload.to_string().c_str(), t.disk_bytes_per_second / 1e9, t.pcie_bytes_per_second / 1e9,
              t.offload.disk() ? (", " + sim::human_bytes(t.buffer_bytes) + " host staging buffer").c_str() : "");
  std::printf("  %-24s %12s %12s %12s %14s %10s %14s %10s %12s %10s\n", "class", "device", "host", "disk", "disk/step",
              "disk s", "PCIe/step", "PCIe s", "compute s", "exposed s");
  for (std::size_t i = 0; i < classes.size(); ++i) {
    const auto& x = r.tiers[i];
    const double compute = r.estimate.classes[i].compute_seconds;
    std::printf("  %-24s %12s %12s %12s %14s %10.4f %14s %10.4f %12.4f %10.4f\n", classes[i].report.name.c_str(),
                sim::human_bytes(x.bytes.device).c_str(), sim::human_bytes(x.bytes.host).c_str(),
                sim::human_bytes(x.bytes.disk).c_str(), sim::human_bytes(x.disk_bytes_per_step).c_str(),
                x.disk_seconds, sim::human_bytes(x.pcie_bytes_per_step).c_str(), x.pcie_seconds, compute,
                sim::exposed_transfer_seconds(x, compute));
  }
  std::printf("  overlap: the reads are prefetched a unit (a chunk) ahead and the writes go behind, beside the step's "
              "compute; 'exposed' is what the longer of the disk and PCIe transfers exceeds that compute by (an upper "
              "bound on hiding: the update waits for its first chunk). The fit above is the device tier's.\n");
}

int run_plan(const Options& o) {
  const auto& p = o.plan;
  if (!o.json) {
    print_header(o);
    // A micro-batch smaller than the data ranks leaves some without a sequence: they run the
    // step's collectives and the optimizer, no forward work (the plan is valid, but wasteful).
    if (p.micro_batch() < p.dp)
      std::printf("note: a micro-batch of %lld sequences over dp %d: %lld data ranks get no sequence\n",
                  (long long)p.micro_batch(), p.dp, (long long)(p.dp - p.micro_batch()));
  }
  const auto started = std::chrono::steady_clock::now();
  const std::vector<models::PlanClass> classes = dry_run_any(o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const PlanSummary r = summarize(o, classes);
  if (o.json) print_json(o, classes, r, seconds);
  else {
    for (std::size_t i = 0; i < classes.size(); ++i) {
      const auto& c = classes[i];
      const auto& est = r.estimate.classes[i];
      std::cout << '\n' << c.report.to_table();
      std::printf("estimate: ends at %.3f s (pipeline rank %d idle %.1f %%, once per step %.3f s of which gradient "
                  "reduction %.3f s before overlap); compute %.3f s, communication %.3f s of which exposed %.3f s; "
                  "memory with %d micro-batch stages in flight %s\n",
                  est.step_seconds, c.pipeline_rank, 100 * est.bubble_fraction, est.once_per_step_seconds,
                  est.gradient_reduction_seconds, est.compute_seconds, est.communication_seconds,
                  est.exposed_communication_seconds, c.in_flight, sim::human_bytes(c.peak_in_flight).c_str());
    }
    std::printf("\ndry run: %zu rank classes for %lld GPUs in %.2f s; the most memory any rank holds in the step: %s "
                "(%s)\n", classes.size(), p.gpus(), seconds, sim::human_bytes(r.memory).c_str(),
                classes[r.memory_class].report.name.c_str());
    std::printf("step: %.3f s on %s (pipeline %.3f s, bubble %.1f %%; slowest class %s); %.4g tokens/s; ",
                r.step, o.hardware.name.c_str(), r.estimate.pipeline_seconds, 100 * r.estimate.bubble_fraction,
                classes[r.estimate.slowest].report.name.c_str(), r.tokens_per_second);
    std::printf("MFU %.1f %% (%.0f model TFLOP/s per GPU%s); ", 100 * r.mfu, r.model_tflops_per_gpu,
                p.has_experts() ? ", active parameters" : "");
    std::printf("%.0f TFLOP/s per GPU executed (recomputation included)\n", r.hardware_tflops_per_gpu);
    std::printf("memory: %s %s of %s per GPU less the %.0f %% reserve (%s)\n", r.fits ? "fits," : "DOES NOT FIT:",
                sim::human_bytes(r.memory).c_str(), sim::human_bytes(o.hardware.memory_bytes).c_str(),
                100 * sim::memory_reserve_fraction,
                sim::human_bytes(o.hardware.memory_bytes * (1 - sim::memory_reserve_fraction)).c_str());
    std::printf("construction: %s %s per GPU (%s): the trainer built, the model drawn as shards\n",
                r.construction_fits ? "fits," : "DOES NOT FIT:", sim::human_bytes(r.construction).c_str(),
                classes[r.construction_class].report.name.c_str());
    if (!r.tiers.empty()) print_offload(o, classes, r);
  }
  if (o.sync_table) print_sync_table(o, classes, r);
  if (!o.trace.empty()) {
    const auto& c = classes.front();
    trace::write_text_file(o.trace, sim::chrome_trace(r.estimate.classes.front(), c.pipeline_rank, c.report.name),
                                   "plan_at_scale --trace");
    if (!o.json) std::printf("trace of %s (pipeline rank %d): %s\n", c.report.name.c_str(), c.pipeline_rank, o.trace.c_str());
  }
  if (!r.construction_fits) {
    std::fprintf(stderr, "plan_at_scale: the plan does not fit: building it holds %s per GPU (construction, %s) > %s of %s "
                 "less the %.0f %% reserve\n",
                 sim::human_bytes(r.construction).c_str(), classes[r.construction_class].report.name.c_str(),
                 sim::human_bytes(o.hardware.memory_bytes * (1 - sim::memory_reserve_fraction)).c_str(),
                 o.hardware.name.c_str(), 100 * sim::memory_reserve_fraction);
    return 3;
  }
  if (!r.fits) {
    std::fprintf(stderr, "plan_at_scale: the plan does not fit: %s per GPU (%s) > %s of %s less the %.0f %% reserve\n",
                 sim::human_bytes(r.memory).c_str(), classes[r.memory_class].report.name.c_str(),
                 sim::human_bytes(o.hardware.memory_bytes * (1 - sim::memory_reserve_fraction)).c_str(),
                 o.hardware.name.c_str(), 100 * sim::memory_reserve_fraction);
    return 3;
  }
  return 0;
}

/// The space --search enumerates: every factorization up to sim::exhaustive_gpus GPUs (the
/// trainer's --plan auto space, so both choose alike), else sim/search.hpp's powers of two.
sim::SearchSpace search_space(const Options& o) {
  return {.gpus = o.search_gpus,
          .batch = o.plan.batch,
          .bf16 = o.bf16,
          .exhaustive = o.search_gpus <= sim::exhaustive_gpus,
          .ep = o.search_ep,
          .ep_node_size = o.plan.moe.node_size,
          .bf16_moments = o.bf16_moments,
          .fp8 = o.plan.fp8};
}

/// Whether an analytic plan has every field --rank-of names.
bool matches(const sim::PlanShape& p, const std::vector<std::pair<std::string, long long>>& want) {
  for (const auto& [k, v] : want) {
    const long long have = k == "tp" ? p.tp : k == "pp" ? p.pp : k == "dp" ? p.dp : k == "cp" ? p.cp
                         : k == "v"  ? p.stages_per_rank : k == "zero" ? p.zero : k == "ep" ? p.ep : p.microbatch;
    if (have != v) return false;
  }
  return true;
}

/// --rank-of: the best-ranked variant of the named plan among the fitting ones, term by term
/// against the first; and, when a faster variant of it does not fit, that one with its memory.
void print_rank_of(const Options& o, const sim::ModelShape& model, const std::vector<sim::RankedPlan>& ranked) {
  const auto it = std::find_if(ranked.begin(), ranked.end(), [&](const sim::RankedPlan& r) { return matches(r.plan, o.rank_of); });
  if (it == ranked.end()) std::printf("--rank-of: no fitting plan of the search has those fields\n");
  else
    std::printf("--rank-of: its fastest fitting variant is #%zu of %zu (analytic): %s\n  term | this plan | #1 | difference\n%s",
                std::size_t(it - ranked.begin()) + 1, ranked.size(), sim::describe(it->plan).c_str(),
                sim::compare_plans(*it, ranked.front()).c_str());
  auto space = search_space(o);
  space.keep_unfit = true;
  const auto all = sim::search_plans(model, space, o.hardware);
  const auto any = std::find_if(all.begin(), all.end(), [&](const sim::RankedPlan& r) { return matches(r.plan, o.rank_of); });
  if (any != all.end() && !any->estimate.fits)
    std::printf("  faster, but does not fit (%s of %s less the %.0f %% reserve): %s\n%s",
                sim::human_bytes(any->estimate.memory_bytes).c_str(),
                sim::human_bytes(o.hardware.memory_bytes).c_str(), 100 * sim::memory_reserve_fraction,
                sim::describe(any->plan).c_str(), sim::compare_plans(*any, ranked.front()).c_str());
}

/// --search: analytic ranking, the finalists dry-run (see the top of this file).
int run_search(const Options& o) {
  const auto started = std::chrono::steady_clock::now();
  const sim::ModelShape model = model_shape(o);
  const auto ranked = sim::search_plans(model, search_space(o), o.hardware);
  const double analytic_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // The same ranking train_gpt --plan auto makes (examples/plan_rescore.hpp).
  const auto rescored = examples::rescore(o.plan, o.llama, o.bf16, ranked, std::size_t(o.finalists), o.hardware);
  const auto& finalists = rescored.finalists;
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("search: %s %.1fB parameters%s, seq %lld, batch %lld on %lld x %s: %zu plans fit (analytic%s, %.2f s); "
              "%zu finalists dry-run; %.2f s in all\n",
              o.llama ? "llama" : "gpt", model.params() / 1e9,
              model.moe() ? (", " + std::to_string(model.experts) + " experts top-" + std::to_string(model.topk)).c_str() : "",
              (long long)model.seq, (long long)o.plan.batch, o.search_gpus, o.hardware.name.c_str(), ranked.size(),
              o.search_gpus <= sim::exhaustive_gpus ? ", every factorization" : "", analytic_seconds, rescored.dry_run, total);
  if (rescored.dropped_unfit + rescored.dropped_refused > 0)
    std::printf("dropped: %zu of the analytic best do not fit in their dry run, %zu refused by it%s%s; the next taken "
                "instead (at most %d dry runs), those whose analytic memory x %.2f (the dry run's largest excess over the "
                "analytic estimate among the dropped) does not fit last (%zu of them not dry-run)\n",
                rescored.dropped_unfit, rescored.dropped_refused, rescored.last_refusal.empty() ? "" : " (last: ",
                rescored.last_refusal.empty() ? "" : (rescored.last_refusal + ")").c_str(), 3 * o.finalists,
                rescored.memory_ratio, rescored.skipped);
  if (finalists.empty() && o.finalists > 0) {
    std::printf("none of the %zu analytic best plans fits in its dry run: no plan printed (the analytic memory "
                "estimate and the dry run disagree; docs/dry-run.md)\n", rescored.dry_run);
    return 3;
  }
  if (finalists.empty()) {  // --finalists 0: the analytic ranking alone
    std::printf("ranked by: the analytic estimate (sim/analytic.hpp; no plan dry-run: --finalists 0)\n");
    for (std::size_t i = 0; i < ranked.size() && i < std::size_t(o.top); ++i) {
      std::printf("%zu. %s: step %.3f s (analytic), MFU %.1f %%, memory %s\n", i + 1, sim::describe(ranked[i].plan).c_str(),
                  ranked[i].estimate.step_seconds, 100 * ranked[i].estimate.mfu,
                  sim::human_bytes(ranked[i].estimate.memory_bytes).c_str());
      if (i > 0) std::printf("   analytic: %s\n", sim::why_slower(ranked[i], ranked.front()).c_str());
    }
    if (!o.rank_of.empty()) print_rank_of(o, model, ranked);
    return 0;
  }
  std::printf("ranked by: the simulated step (the real step on meta space, sim::estimate_plan) of the %zu analytic "
              "best that fit in it; below them the analytic estimate alone decides\n", finalists.size());
  const auto& best = finalists.front();
  const double tokens = double(o.plan.batch) * double(model.seq);
  for (std::size_t i = 0; i < finalists.size() && i < std::size_t(o.top); ++i) {
    const auto& f = finalists[i];
    const double mfu = f.ranked.estimate.model_flops / (double(f.ranked.plan.gpus()) * o.hardware.peak_flops() * f.dry.step);
    // The analytic step over the dry run's: how well the pruning estimate agrees on this plan.
    std::printf("%zu. %s: step %.3f s (analytic %.3f s = %.3f x, #%zu), MFU %.1f %%, %.4g tokens/s, memory %s\n", i + 1,
                sim::describe(f.ranked.plan).c_str(), f.dry.step, f.ranked.estimate.step_seconds,
                f.ranked.estimate.step_seconds / f.dry.step, f.analytic_rank + 1, 100 * mfu, tokens / f.dry.step,
                sim::human_bytes(f.dry.memory).c_str());
    if (i > 0)
      std::printf("   loses by %.3f s in the dry run; analytic: %s\n", f.dry.step - best.dry.step,
                  sim::why_slower(f.ranked, best.ranked).c_str());
  }
  if (!o.rank_of.empty()) print_rank_of(o, model, ranked);
  return 0;
}

/// --published: the published runs of sim/published_runs.hpp against the cost model (one
/// calibration over two devices), each row timed by its dry run (models/published_dry_run.hpp:
/// the row's plan run once on meta, its records costed again for the fits): each row's error,
/// the analytic estimate's figure beside it and their ratio, whether the row was in the fit set,
/// its leave-one-out error; then the fit rows by name and what was fitted on them.
int run_published() {
  const auto runs = sim::published_runs();
  const auto started = std::chrono::steady_clock::now();
  const auto rows = models::published_dry_runs(runs, examples::dry_run_any);  // plan_auto_dry.cpp's dry runs
  const double dry_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const auto fits = sim::fit_rows(rows);
  const auto fitted = sim::fit_calibration(fits);
  const double fitted_scale = sim::fit_device_scale(fits, "h100-500w", fitted);
  const auto loo = sim::leave_one_out(rows);
  const double fit_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() - dry_seconds;
  std::printf(
      "run | set | device | published | predicted (dry run) | error | analytic | analytic / dry run | "
      "leave-one-out | memory (analytic)\n");
  double worst_fit = 0, worst_held = 0, lo = 0, hi = 0;
  std::string refused;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& run = rows[i];
    const auto p = sim::predict(run);
    const auto a = sim::analytic_of(run);
    const double analytic = sim::figure_of(run, a.step_seconds), step_ratio = a.step_seconds / p.step_seconds;
    const char* unit = run.iteration_seconds ? " s" : run.flops_count == "tokens" ? " tokens/s" : " TFLOP/s";
    const bool dry = run.dry_run_note.empty();
    char ratio_text[32] = "-";  // none where the analytic estimate stands in for the dry run
    if (dry) std::snprintf(ratio_text, sizeof ratio_text, "%.3f x", step_ratio);
    std::printf("%s | %s | %s | %.2f%s | %.2f%s%s | %+.1f %% | %.2f%s | %s | %+.1f %% | %s\n", run.name.c_str(),
                run.fit ? "fit" : "held out", run.device.c_str(), p.published, unit, p.predicted, unit,
                dry ? "" : " (analytic: not dry-run, below)", 100 * (p.ratio() - 1), analytic, unit, ratio_text,
                100 * (loo[i] - 1), sim::human_bytes(a.memory_bytes).c_str());
    (run.fit ? worst_fit : worst_held) = std::max(run.fit ? worst_fit : worst_held, std::abs(p.ratio() - 1));
    if (dry) lo = lo == 0 ? step_ratio : std::min(lo, step_ratio), hi = std::max(hi, step_ratio);
    else refused += examples::cat("\n  ", run.name, ": ", run.dry_run_note);
  }
  std::string names;
  for (const auto& r : fits) names += (names.empty() ? "" : "; ") + r.name;
  std::printf("fit rows (%zu, on %s): %s\n", fits.size(), "a100 and h100-500w", names.c_str());
  const auto& c = sim::calibration;
  std::printf(
      "calibration: gemm_max_fraction %.2f, gemm_half_intensity %.0f FLOP/B (fitted on the a100 fit rows' dry "
      "runs: %.2f, %.0f), attention_fraction %.2f, hbm_fraction %.2f, link_fraction %.2f (measured, not "
      "fitted); h100-500w compute_scale %.2f (fitted on its fit rows under that calibration: %.2f)\n",
      c.gemm_max_fraction, c.gemm_half_intensity, fitted.gemm_max_fraction, fitted.gemm_half_intensity,
      c.attention_fraction, c.hbm_fraction, c.link_fraction, sim::h100_500w_compute_scale, fitted_scale);
  std::printf(
      "largest error: fit rows %.1f %%, held-out rows %.1f %%; the analytic step over the dry run's: %.3f to "
      "%.3f x\n",
      100 * worst_fit, 100 * worst_held, lo, hi);
  if (!refused.empty())
    std::printf("timed by the analytic estimate (the dry run refuses the plan):%s\n", refused.c_str());
  std::printf(
      "time: %zu rows dry-run once each in %.1f s; the fits and leave-one-out re-cost their records in %.1f s\n",
      rows.size(), dry_seconds, fit_seconds);
  return 0;
}

/// --serve: weights and KV cache per rank (sim/serving.hpp).
int run_serve(const Options& o) {
  const auto m = model_shape(o);
  const sim::ServingShape shape{.batch = o.serve_batch, .context = o.serve_context, .tp = o.plan.tp, .pp = o.plan.pp,
                                .cp = o.plan.cp, .bytes = o.bf16 ? 2.0 : 4.0};
  const auto s = sim::serving_memory(m, shape);
  const bool fits = sim::fits(s.total, o.hardware);
  std::printf("serving %s %.2fB parameters, tp %d x pp %d x cp %d, %s: %lld sequences x %lld positions\n"
              "per rank (%lld layers): weights %s, KV cache %s (%s per token), total %s: %s on %s\n",
              o.llama ? "llama" : "gpt", m.params() / 1e9, o.plan.tp, o.plan.pp, o.plan.cp, o.bf16 ? "bf16" : "f32", o.serve_batch,
              o.serve_context, (long long)s.layers, sim::human_bytes(s.weights).c_str(),
              sim::human_bytes(s.kv_cache).c_str(), sim::human_bytes(s.kv_per_token).c_str(),
              sim::human_bytes(s.total).c_str(), fits ? "fits" : "does not fit", o.hardware.name.c_str());
  const auto t = sim::serving_latency(m, shape, o.hardware);
  std::printf("latency (one batch in flight): prefill %.4g ms; decode %.4g ms per token (weights + KV cache at HBM "
              "bandwidth %.4g ms, FLOPs %.4g ms, TP all-reduces %.4g ms, PP sends %.4g ms, CP all-gathers %.4g ms), "
              "%.4g tokens/s over the batch\n",
              1e3 * t.prefill, 1e3 * t.decode, 1e3 * t.decode_memory, 1e3 * t.decode_compute, 1e3 * t.decode_tp,
              1e3 * t.decode_pp, 1e3 * t.decode_cp, double(o.serve_batch) / t.decode);
  return fits ? 0 : 3;
}

int run(const Options& o) {
  return o.published ? run_published() : o.serve_batch ? run_serve(o) : o.search ? run_search(o) : run_plan(o);
}

}  // namespace

int main(int argc, char** argv) {
  // --help anywhere on the line, before anything else is parsed or run.
  if (examples::help_requested(argc, argv))
    std::printf("plan_at_scale: a training plan for thousands of GPUs, run dry (docs/dry-run.md)\n");
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "plan_at_scale: %s\n%s  plan_at_scale --help: what each flag does\n", e.what(),
                 examples::flags_synopsis(flag_table(), "plan_at_scale").c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_at_scale: %s\n", e.what());
    return 1;
  }
}
