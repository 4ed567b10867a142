// dtensor/sim/published_runs.hpp — published training runs the cost model is checked against,
// with their plans, and the model's prediction for each (`plan_at_scale --published`, test_sim).
//
//   auto rows = models::published_dry_runs(sim::published_runs(), dry_run);  // models/published_dry_run.hpp
//   for (const auto& row : rows) {
//     auto p = sim::predict(row);     // p.predicted, p.published (same unit), p.ratio()
//   }
//   sim::fit_calibration(sim::fit_rows(rows));  sim::leave_one_out(rows);
//   sim::predict_analytic(run);       // the analytic estimate's figure of a PublishedRun
//
// One time model (issue 43): a row's figure is its dry run's — the row's plan run once as the
// trainer runs it, on meta, with the row's software (fused or materialised attention, gradient
// reduction overlapped or not), its records costed by sim::estimate_plan — and the fits cost
// those records again under each calibration they try (TimedRun: a row with its time model).
// The analytic estimate (sim/analytic.hpp) is the dry run's fast twin; analytic_runs times the
// rows by it instead (the search's pruning; test_sim holds the two within 5 % on these rows).
//
// Sources (the figures as the papers print them; the plans from their configuration tables):
//   Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
//     Table 5: iteration time with sequence parallelism and selective recomputation, A100s,
//     configurations of its Table 1 (t = 8, no data parallelism, micro-batch 1), vocabulary
//     51,200, sequence 2,048.
//   Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
//     Megatron-LM", Table 1: achieved TFLOP/s per GPU (their count: 96 B s l h^2 (1 + s/6h +
//     V/16lh), full recomputation included), A100s, full recomputation, interleaved schedule
//     where pp > 1. The table does not give micro-batch sizes or virtual stages: the values here
//     are assumptions (stated per row).
//   Llama 3 report (Dubey et al. 2024), Table 4: BF16 TFLOP/s per GPU on H100s, TP 8, PP 16,
//     interleaved, 8K and 131K sequences.
//   Held out beyond the rows (never fitted):
//   Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", §2.4:
//     60.1, 50.2 and 44.4 s per iteration (126, 121, 113 TFLOP/s per GPU) on 280, 350 and 420
//     DGX A100 nodes, TP 8, PP 35, batch 1920, sequence 2048, DeepSpeed's 1F1B pipeline.
//   BigScience BLOOM 176B (model card / training page; Le Scao et al. 2022 §3.4): about 150
//     TFLOP/s per GPU on 384 A100s (48 nodes), TP 4, PP 12, DP 8, batch 2048, sequence 2048,
//     ZeRO-1, four 100 Gb/s Omni-Path links per node (50 Gb/s per GPU).
//   torchtitan's H100 benchmarks (github.com/pytorch/torchtitan, benchmarks/
//     llama3_h100_202412_torchtitan.md, December 2024), Tables 1 and 3: Llama 3.1 8B under FSDP
//     (1D), local batch 2, selective activation checkpointing, bf16 without torch.compile or
//     Float8: 5,762 tokens/s per GPU on 8 H100s (global batch 16), 5,605 on 128 (global batch
//     256); Grand Teton hosts: H100 SXM with 96 GB HBM2e at 2.4 TB/s and a 500 W power limit (its
//     footnote: the bf16 peak lies between the SXM's and the NVL's, not known exactly), 400 Gb/s
//     RDMA per GPU (the device h100-500w). Sequence 8,192 (torchtitan's Llama 3 8B configuration).
//     And its docs/performance.md (2024): Llama 3.1 405B, FSDP 16 x TP 8 on 128 of those H100s,
//     local batch 2, full activation checkpointing, 109 tokens/s per GPU (29.0 % MFU).
//
// The calibration (sim::calibration) is checked honestly: the constants that published
// microbenchmarks give are fixed from them (sim/cost_model.hpp says which), the rest is fitted
// on the rows marked `fit` only, and every other row is a hold-out, in two stages over two
// devices: fit_calibration fits the GEMM constants on the fit rows of devices at their rated
// power (A100 rows), then fit_device_scale fits a power-limited device's compute_scale on its own
// fit rows (h100-500w: torchtitan's two 8B rows) under that calibration. leave_one_out refits both
// without each row in turn. test_sim asserts that the fits of the rows' dry runs give exactly
// sim::calibration and sim::h100_500w_compute_scale, and the errors of the held-out rows.
// The software each ran is part of its plan: Megatron-LM of 2021/22 materialized the attention
// scores and did not overlap the data-parallel gradient reduction; Llama 3's stack (as ours)
// uses fused attention and overlaps it. Both the dry run (kernels::meta::MaterializedScores,
// EstimateOptions::overlap_gradient_reduction) and the analytic estimate honour those fields.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/sim/analytic.hpp"
#include "dtensor/sim/device.hpp"

namespace dtensor::sim {

struct PublishedRun {
  std::string name;    // "Korthikanti T5 175B"
  std::string device;  // sim::device name
  ModelShape model;
  PlanShape plan;
  bool iteration_seconds = false;  // the figure is an iteration time (else TFLOP/s per GPU)
  double published = 0;
  std::string flops_count;         // for TFLOP/s: "narayanan" (their formula) or "palm" (model FLOPs); "tokens": tokens/s per GPU
  bool fit = false;                // in the calibration's fit set (else held out)
  std::string note;                // what the row assumes beyond the paper, or its source
  std::vector<std::pair<std::string, std::string>> device_fields;  // the cluster's differences (sim::set_device_field)

  Hardware hardware() const {
    Hardware h = dtensor::sim::device(device);
    for (const auto& [k, v] : device_fields) set_device_field(h, k, v);
    return h;
  }
};

inline std::vector<PublishedRun> published_runs() {
  const auto gpt = [](std::int64_t layers, std::int64_t dim, std::int64_t heads) {
    return ModelShape{.layers = layers, .dim = dim, .heads = heads, .vocab = 51200, .seq = 2048};
  };
  // Megatron-LM 2021/22: scores in HBM, gradient reduction after the backward, the 16-bit
  // gradients all-reduced as they are (sim::as_run's DDP in bf16 all-reduces fp32 gradients, as
  // train_gpt does: bf16_moments keeps the 16-bit reduction; the memory column then leaves out
  // the fp32 master, 8 of the 16 bytes per parameter these runs held; time is what rows check).
  const auto megatron = [](PlanShape p) {
    p.fused_attention = false;
    p.overlap_gradient_reduction = false;
    p.bf16_moments = true;
    return p;
  };
  const auto korthikanti = [&](std::int64_t batch, std::int64_t micro, int pp) {
    return megatron({.batch = batch, .microbatch = micro, .dp = 1, .tp = 8, .pp = pp, .selective = true});
  };
  const auto narayanan = [&](std::int64_t batch, std::int64_t micro, int dp, int tp, int pp, int v) {
    return megatron({.batch = batch, .microbatch = micro, .dp = dp, .tp = tp, .pp = pp, .sp = false, .recompute = true,
                     .schedule = v > 1 ? "interleaved" : "1f1b", .stages_per_rank = v});
  };
  const ModelShape llama405{.layers = 126, .dim = 16384, .heads = 128, .kv_heads = 8, .ffn = 53248, .vocab = 128256,
                            .seq = 8192, .llama = true};
  ModelShape llama405_long = llama405;
  llama405_long.seq = 131072;
  const auto llama = [](int dp, int cp, std::int64_t batch) {
    return PlanShape{.batch = batch, .microbatch = 1, .dp = dp, .tp = 8, .pp = 16, .cp = cp, .zero = 1,
                     .schedule = "interleaved", .stages_per_rank = 2, .cp_kind = "allgather"};
  };
  std::vector<PublishedRun> runs{
      {"Korthikanti T5 22B", "a100", gpt(48, 6144, 64), korthikanti(4, 1, 1), true, 1.10, "", false, "", {}},
      {"Korthikanti T5 175B", "a100", gpt(96, 12288, 96), korthikanti(64, 1, 8), true, 13.75, "", false, "", {}},
      {"Korthikanti T5 530B", "a100", gpt(105, 20480, 128), korthikanti(280, 1, 35), true, 37.83, "", false, "", {}},
      {"Korthikanti T5 1T", "a100", gpt(128, 25600, 160), korthikanti(512, 1, 64), true, 71.49, "", false, "", {}},
      {"Narayanan T1 1.7B", "a100", gpt(24, 2304, 24), narayanan(512, 16, 32, 1, 1, 1), false, 137, "narayanan", false, "", {}},
      {"Narayanan T1 3.6B", "a100", gpt(30, 3072, 32), narayanan(512, 16, 32, 2, 1, 1), false, 138, "narayanan", false, "", {}},
      {"Narayanan T1 7.5B", "a100", gpt(36, 4096, 32), narayanan(512, 16, 32, 4, 1, 1), false, 142, "narayanan", false, "", {}},
      {"Narayanan T1 18B", "a100", gpt(40, 6144, 48), narayanan(1024, 8, 32, 8, 1, 1), false, 135, "narayanan", false, "", {}},
      {"Narayanan T1 39B", "a100", gpt(48, 8192, 64), narayanan(1536, 4, 32, 8, 2, 2), false, 138, "narayanan", false, "", {}},
      {"Narayanan T1 145B", "a100", gpt(80, 12288, 96), narayanan(2304, 2, 24, 8, 8, 2), false, 148, "narayanan", false, "", {}},
      {"Narayanan T1 310B", "a100", gpt(96, 16384, 128), narayanan(2160, 1, 15, 8, 16, 2), false, 155, "narayanan", false, "", {}},
      {"Narayanan T1 530B", "a100", gpt(105, 20480, 128), narayanan(2520, 1, 9, 8, 35, 3), false, 163, "narayanan", false, "", {}},
      {"Narayanan T1 1T", "a100", gpt(128, 25600, 160), narayanan(3072, 1, 6, 8, 64, 2), false, 163, "narayanan", false, "", {}},
      {"Llama 3 T4 8K, 8,192 GPUs", "h100", llama405, llama(64, 1, 2048), false, 430, "palm", false, "", {}},
      {"Llama 3 T4 8K, 16,384 GPUs", "h100", llama405, llama(128, 1, 2048), false, 400, "palm", false, "", {}},
      {"Llama 3 T4 131K, 16,384 GPUs", "h100", llama405_long, llama(8, 16, 128), false, 380, "palm", false, "", {}},
  };
  // The fit set: Korthikanti's four iteration times and every other Narayanan row from the
  // smallest (sizes 1.7B to 1T, pipelines 1 to 64 ranks); everything else is held out.
  for (auto& r : runs)
    r.fit = r.name.rfind("Korthikanti", 0) == 0 || r.name == "Narayanan T1 1.7B" || r.name == "Narayanan T1 7.5B" ||
            r.name == "Narayanan T1 39B" || r.name == "Narayanan T1 310B" || r.name == "Narayanan T1 1T";
  // Held out beyond the rows (see the synopsis). MT-NLG ran Megatron's TP inside
  // DeepSpeed's pipeline (1F1B, gradients reduced after the backward, scores in HBM) with full
  // recomputation (its TFLOP/s are Narayanan's count with recomputation) and ZeRO-1, micro-batch 1.
  const auto mtnlg = [&](int dp) {
    return megatron({.batch = 1920, .microbatch = 1, .dp = dp, .tp = 8, .pp = 35, .zero = 1, .sp = false, .recompute = true});
  };
  const char* mtnlg_note = "Smith et al. 2022 s2.4; micro-batch 1 assumed";
  runs.push_back({"MT-NLG 530B, 2,240 GPUs", "a100", gpt(105, 20480, 128), mtnlg(8), true, 60.1, "", false, mtnlg_note, {}});
  runs.push_back({"MT-NLG 530B, 2,800 GPUs", "a100", gpt(105, 20480, 128), mtnlg(10), true, 50.2, "", false, mtnlg_note, {}});
  runs.push_back({"MT-NLG 530B, 3,360 GPUs", "a100", gpt(105, 20480, 128), mtnlg(12), true, 44.4, "", false, mtnlg_note, {}});
  // BLOOM: vocabulary 250,880 (padded), micro-batch 2 and full recomputation as in its
  // Megatron-DeepSpeed configuration; Omni-Path 4 x 100 Gb/s per 8 GPUs.
  ModelShape bloom = gpt(70, 14336, 112);
  bloom.vocab = 250880;
  runs.push_back({"BLOOM 176B, 384 GPUs", "a100", bloom,
                  megatron({.batch = 2048, .microbatch = 2, .dp = 8, .tp = 4, .pp = 12, .zero = 1, .sp = false, .recompute = true}),
                  false, 150, "narayanan", false, "BigScience training page (about 150 TFLOP/s); micro-batch 2",
                  {{"network_gbps", "50"}}});
  // torchtitan on H100s (see the synopsis): FSDP = ZeRO-3 over every rank, fused attention (SDPA),
  // overlapped reduction, on the h100-500w device (sim/device.hpp: Grand Teton's 500 W HBM2e
  // H100s; its compute_scale is fitted on the two 8B rows, the 405B row held out).
  // torchtitan's "selective" checkpointing is op-level: it saves the attention's output and every
  // second matmul's, recomputing the rest (the norms, activations, RoPE and half of the GEMM
  // FLOPs); modelled as recomputing the norms, the activation and the feed-forward (nn::Recompute
  // norm,act,mlp: 81 % of an 8B block's GEMM FLOPs against their 50 %: an approximation).
  const ModelShape llama8{.layers = 32, .dim = 4096, .heads = 32, .kv_heads = 8, .ffn = 14336, .vocab = 128256,
                          .seq = 8192, .llama = true};
  const auto titan = [](int dp) {
    return PlanShape{.batch = 2 * std::int64_t(dp), .microbatch = 2, .dp = dp, .zero = 3,
                     .recompute_modules = {.norm = true, .act = true, .mlp = true}};
  };
  const char* titan_note = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3 (FSDP, bf16, no compile)";
  runs.push_back({"torchtitan 8B FSDP, 8 H100s", "h100-500w", llama8, titan(8), false, 5762, "tokens", true, titan_note, {}});
  runs.push_back({"torchtitan 8B FSDP, 128 H100s", "h100-500w", llama8, titan(128), false, 5605, "tokens", true, titan_note, {}});
  // torchtitan's docs/performance.md (its 2024 version, before the table above replaced it):
  // Llama 3.1 405B on 128 H100s (94 GB), FSDP 16 x TP 8 (TP with sequence parallelism), local
  // batch 2 (global 32), full activation checkpointing, no Float8 or async TP: 109 tokens/s per
  // GPU (29.0 % MFU by their count). The same Grand Teton hosts (500 W).
  runs.push_back({"torchtitan 405B FSDP 16 x TP 8, 128 H100s", "h100-500w", llama405,
                  PlanShape{.batch = 32, .microbatch = 2, .dp = 16, .tp = 8, .zero = 3, .recompute = true}, false, 109,
                  "tokens", false, "torchtitan docs/performance.md (2024): 405B, batch 2, full AC, 109 WPS", {}});
  // The same run with Float8 (torchao's Float8Linear: every Linear's GEMMs in FP8 with per-tensor
  // scales, the output layer excepted): 177 tokens/s per GPU. Modelled as --dtype fp8 (every
  // nn::Linear in FP8, the head too; the FSDP gathers in bf16 where torchao can gather FP8).
  runs.push_back({"torchtitan 405B FSDP 16 x TP 8, Float8, 128 H100s",
                  "h100-500w",
                  llama405,
                  PlanShape{.batch = 32, .microbatch = 2, .dp = 16, .tp = 8, .zero = 3, .recompute = true, .fp8 = true},
                  false,
                  177,
                  "tokens",
                  false,
                  "torchtitan docs/performance.md (2024): 405B, batch 2, full AC, Float8, 177 WPS",
                  {}});
  // DeepSeek-V3 (arXiv 2412.19437 §3.2, §3.3): 2,048 H800s, PP 16 (DualPipe: dualpipev here), EP 64
  // over 8 nodes, ZeRO-1 over the data ranks, no TP; batch 15,360 x 4,096; 256 routed experts
  // top-8 of width 2,048 within 4 of 8 node groups, one shared expert, the first 3 blocks dense;
  // FP8 GEMMs. Its dispatch crosses the network once per node a token reaches: the node-level
  // dispatch over nodes of 8 (parallel/node_dispatch.hpp). 180K H800 GPU hours per trillion
  // tokens: about 19.9 s per step (docs/dry-run.md). Multi-head latent attention as its Table 1
  // and §4.2 give it (128 heads, kv_lora_rank 512, q_lora_rank 1536, per head 128 + 64 rotary
  // query/key features and 128 value features): 671.0B parameters, 37.6B active (the paper: 671B,
  // 37B; its multi-token prediction module not counted). Approximated: the H800 as an H100 with
  // 160 GB/s NVLink. Held out (docs/dry-run.md, "A published MoE configuration").
  const ModelShape deepseek_v3{.layers = 61,
                               .dim = 7168,
                               .heads = 128,
                               .ffn = 18432,
                               .vocab = 129280,
                               .seq = 4096,
                               .llama = true,
                               .experts = 256,
                               .topk = 8,
                               .expert_ffn = 2048,
                               .shared_experts = 1,
                               .expert_groups = 8,
                               .topk_groups = 4,
                               .dense_first = 3,
                               .kv_lora_rank = 512,
                               .q_lora_rank = 1536,
                               .qk_nope_dim = 128,
                               .qk_rope_dim = 64,
                               .v_head_dim = 128};
  runs.push_back({"DeepSeek-V3 671B, 2,048 H800s",
                  "h100",
                  deepseek_v3,
                  PlanShape{.batch = 15360,
                            .microbatch = 1,
                            .dp = 128,
                            .pp = 16,
                            .ep = 64,
                            .ep_node_size = 8,
                            .zero = 1,
                            .schedule = "dualpipev",
                            .stages_per_rank = 2,
                            .fp8 = true},
                  true,
                  19.9,
                  "",
                  false,
                  "DeepSeek-V3 report §3.2-3.3 and Table 1 (180K H800 GPU hours per trillion tokens)",
                  {{"nvlink_gbytes_per_s", "160"}}});
  return runs;
}

/// Whether a device's compute_scale is fitted on its rows (fit_device_scale) rather than 1.
inline bool scaled_device(const std::string& device) { return device == "h100-500w"; }

/// A row's step in seconds under a calibration and a compute_scale (> 0 replaces the device's;
/// 0 keeps it): the time model the report and the fits read.
using StepModel = std::function<double(const Calibration&, double compute_scale)>;

/// A published row with its time model: the dry run's (models::published_dry_runs,
/// models/published_dry_run.hpp: the row's plan run once on meta, its records costed again by
/// sim::estimate_plan under each calibration) or the analytic estimate's (analytic_runs).
struct TimedRun : PublishedRun {
  StepModel step;
  std::string time_model;    // "dry run" or "analytic": what `step` is
  std::string dry_run_note;  // where the analytic estimate stands in for a dry run: the dry run's refusal
};

namespace detail {
/// `f` remembering its results per (calibration, scale): the fits ask the same ones again
/// (leave_one_out refits on subsets of the same rows), and a dry run's re-costing is not free.
inline StepModel remembered(StepModel f) {
  static_assert(sizeof(Calibration) == 5 * sizeof(double), "the key below lists every field of Calibration");
  auto known = std::make_shared<std::map<std::array<double, 6>, double>>();
  return [f = std::move(f), known](const Calibration& c, double scale) {
    const std::array<double, 6> key{c.gemm_max_fraction, c.gemm_half_intensity, c.attention_fraction,
                                    c.hbm_fraction,      c.link_fraction,       scale};
    if (const auto it = known->find(key); it != known->end()) return it->second;
    const double seconds = f(c, scale);
    known->emplace(key, seconds);
    return seconds;
  };
}
}  // namespace detail

/// The analytic estimate of a published row (sim/analytic.hpp); `compute_scale` > 0 replaces the
/// device's (what the fits try).
inline AnalyticEstimate analytic_of(const PublishedRun& run, const Calibration& cal = calibration,
                                    double compute_scale = 0) {
  Hardware hw = run.hardware();
  if (compute_scale > 0) hw.compute_scale = compute_scale;
  return analytic_estimate(run.model, run.plan, hw, cal);
}

/// A row timed by the analytic estimate.
inline TimedRun analytic_run(const PublishedRun& run) {
  (void)run.hardware();  // a bad device or field fails here, naming it
  TimedRun r{run, {}, "analytic", ""};
  r.step = detail::remembered(
      [run](const Calibration& cal, double scale) { return analytic_of(run, cal, scale).step_seconds; });
  return r;
}

/// Every row timed by the analytic estimate.
inline std::vector<TimedRun> analytic_runs(const std::vector<PublishedRun>& runs) {
  std::vector<TimedRun> out;
  for (const auto& r : runs) out.push_back(analytic_run(r));
  return out;
}

struct Prediction {
  double step_seconds = 0;
  double predicted = 0, published = 0;  // in the run's unit (seconds, TFLOP/s or tokens/s per GPU)
  double ratio() const { return predicted / published; }
};

/// The row's figure (its unit: iteration seconds, tokens/s per GPU, or TFLOP/s per GPU by its
/// count) for a step of `step_seconds`.
inline double figure_of(const PublishedRun& run, double step_seconds) {
  if (!(step_seconds > 0))
    throw Error("sim::predict", dtensor::detail::cat(run.name, ": a step of ", step_seconds, " s has no figure"));
  if (run.iteration_seconds) return step_seconds;
  if (run.flops_count == "tokens")  // tokens per second per GPU
    return double(run.plan.batch) * double(run.model.seq) / step_seconds / double(run.plan.gpus());
  const double b = double(run.plan.batch), s = double(run.model.seq), l = double(run.model.layers);
  const double h = double(run.model.dim), v = double(run.model.vocab);
  const double flops = run.flops_count == "narayanan" ? 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
                                                      : run.model.model_flops_per_token() * b * s;
  return flops / step_seconds / double(run.plan.gpus()) / 1e12;
}

/// The cost model's figure for a published row by its time model; `compute_scale` > 0 replaces
/// the device's (what the fits try).
inline Prediction predict(const TimedRun& run, const Calibration& cal = calibration, double compute_scale = 0) {
  if (!run.step) throw Error("sim::predict", dtensor::detail::cat(run.name, ": no time model"));
  Prediction p;
  p.published = run.published;
  p.step_seconds = run.step(cal, compute_scale);
  p.predicted = figure_of(run, p.step_seconds);
  return p;
}

/// The analytic estimate's figure for a published row (beside the dry run's in --published).
inline Prediction predict_analytic(const PublishedRun& run, const Calibration& cal = calibration,
                                   double compute_scale = 0) {
  return predict(analytic_run(run), cal, compute_scale);
}

/// The grid the fitted constants are chosen from (see sim/cost_model.hpp for which are fitted):
/// gemm_max_fraction within the range published cuBLAS benchmarks reach for large bf16 GEMMs,
/// gemm_half_intensity over the intensities of a block's GEMMs.
struct CalibrationGrid {
  std::vector<double> gemm_max_fraction{0.75, 0.76, 0.77, 0.78, 0.79, 0.80, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86, 0.87};
  std::vector<double> gemm_half_intensity{0, 10, 20, 30, 40, 50, 60, 80, 100, 130, 160, 200};
};

/// The calibration whose largest error over `runs` (|log(predicted / published)|) is least, the
/// measured constants kept from `base`; ties go to the first in grid order. Rows of a device
/// whose compute_scale is fitted (scaled_device) are left out: fit_device_scale fits them. A
/// grid point stops at the first row that makes it no better than the best so far, and that
/// row is tried first at the next point (the answer is the same; far fewer rows are costed).
inline Calibration fit_calibration(std::vector<TimedRun> runs, const Calibration& base = calibration,
                                   const CalibrationGrid& grid = {}) {
  runs.erase(std::remove_if(runs.begin(), runs.end(), [](const TimedRun& r) { return scaled_device(r.device); }),
             runs.end());
  if (runs.empty()) throw Error("sim::fit_calibration", "no runs to fit");
  Calibration best = base;
  double best_error = std::numeric_limits<double>::infinity();
  std::vector<std::size_t> order(runs.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  for (const double g : grid.gemm_max_fraction)
    for (const double i : grid.gemm_half_intensity) {
      Calibration c = base;
      c.gemm_max_fraction = g;
      c.gemm_half_intensity = i;
      double worst = 0;
      for (std::size_t k = 0; k < order.size(); ++k) {
        worst = std::max(worst, std::abs(std::log(predict(runs[order[k]], c).ratio())));
        if (worst >= best_error) {
          std::rotate(order.begin(), order.begin() + std::ptrdiff_t(k), order.begin() + std::ptrdiff_t(k) + 1);
          break;
        }
      }
      if (worst < best_error - 1e-12) best_error = worst, best = c;
    }
  return best;
}

/// The compute_scale (grid 0.30, 0.31, ..., 1.00) of `device` whose largest error over the rows of
/// `runs` on that device is least under `cal`; ties go to the larger scale.
inline double fit_device_scale(const std::vector<TimedRun>& runs, const std::string& device,
                               const Calibration& cal = calibration) {
  double best = 0, best_error = std::numeric_limits<double>::infinity();
  for (int k = 100; k >= 30; --k) {
    const double scale = k / 100.0;
    double worst = 0;
    bool any = false;
    for (const auto& r : runs) {
      if (r.device != device) continue;
      any = true;
      worst = std::max(worst, std::abs(std::log(predict(r, cal, scale).ratio())));
    }
    if (!any) throw Error("sim::fit_device_scale", dtensor::detail::cat("no runs on device '", device, "' to fit"));
    if (worst < best_error - 1e-12) best_error = worst, best = scale;
  }
  return best;
}

/// The fit rows of `runs` (PublishedRun or TimedRun).
template <class Run>
std::vector<Run> fit_rows(const std::vector<Run>& runs) {
  std::vector<Run> out;
  for (const auto& r : runs)
    if (r.fit) out.push_back(r);
  return out;
}

/// Each row predicted by the calibration fitted on the fit rows without it (for a held-out row:
/// the fit rows' calibration), a scaled device's compute_scale refitted likewise (on its other fit
/// rows; none left: 1, the unscaled device): ratio predicted / published per row, in order.
inline std::vector<double> leave_one_out(const std::vector<TimedRun>& runs, const CalibrationGrid& grid = {}) {
  const auto fits = fit_rows(runs);
  const auto scale_of = [](const std::vector<TimedRun>& rows, const TimedRun& run, const Calibration& cal) {
    if (!scaled_device(run.device)) return 0.0;  // the device's own (1)
    const bool any = std::any_of(rows.begin(), rows.end(), [&](const TimedRun& r) { return r.device == run.device; });
    return any ? fit_device_scale(rows, run.device, cal) : 1.0;
  };
  const auto all_fit = fit_calibration(fits, calibration, grid);
  std::vector<double> ratios;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    if (!runs[k].fit) {
      ratios.push_back(predict(runs[k], all_fit, scale_of(fits, runs[k], all_fit)).ratio());
      continue;
    }
    std::vector<TimedRun> others;
    for (std::size_t j = 0; j < runs.size(); ++j)
      if (j != k && runs[j].fit) others.push_back(runs[j]);
    const auto cal = scaled_device(runs[k].device) ? all_fit : fit_calibration(others, calibration, grid);
    ratios.push_back(predict(runs[k], cal, scale_of(others, runs[k], cal)).ratio());
  }
  return ratios;
}

}  // namespace dtensor::sim
