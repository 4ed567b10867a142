// examples/plan_at_scale.cpp — a training plan for thousands of GPUs, run dry on this machine:
// the real training step (nn::GPT or nn::Llama with parallel::MegatronPlan; pipeline stages with
// DDP, or FSDP / ZeRO-1/2/3 / HSDP; clipping; AdamW) on meta tensors over the sim communicator,
// once per rank class (models/training_plan.hpp), then the report per class and the estimated step
// time on H100s (docs/dry-run.md).
//
//   plan_at_scale                                          # GPT-3 175B-like on 16,384 GPUs
//   plan_at_scale --arch llama --layers 126 --dim 16384 --heads 128 --kv-heads 8 --ffn 53248
//                 --vocab 128256 --seq 8192 --batch 2048 --dp 128 --tp 8 --pp 16 --microbatches 16
//                 --dtype bf16 --trace step.json           # Llama-3-405B's plan
//   plan_at_scale --zero 3 --dp 64 --tp 1 --pp 1 ...       # FSDP (ZeRO-3) on 64 GPUs; --hsdp R
//   plan_at_scale ... --seq 131072 --dp 8 --cp 16 --zero 1 --checkpoint   # Llama 3's long-context plan
//
// What runs: one micro-batch through each pipeline rank's stages (first, middle and last stages,
// uneven layer splits: one class each; --zero 1|2|3: FSDP inside the stages, fp32 master), or,
// under --zero with pp 1 and cp 1, nn::GPT / nn::Llama under fully_shard. --cp splits every
// sequence (ring, all-gather-KV or Ulysses attention; load-balanced unless --no-cp-balance).
// The pipeline schedule enters through the cost model (parallel/pipeline/simulate.hpp) and the
// activations of the micro-batches in flight are the run's times the schedule's count.
// --experts E (GPT blocks): MoE feed-forwards (every --moe-every-th block, top --topk routing,
// --capacity factor), the experts split over --ep ranks of the data x context ranks, routed
// evenly (the balanced routing a dry run assumes: nn::route_balanced).
//
//   plan_at_scale --layers 32 --dim 4096 --heads 32 --seq 4096 --batch 1024 --dp 64 --tp 8 --pp 4
//                 --microbatches 16 --experts 64 --topk 2 --ep 8 --dtype bf16   # MoE on 2,048 GPUs
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "dtensor/sim/chrome_trace.hpp"
#include "dtensor/sim/cost_model.hpp"
#include "dtensor/models/training_plan.hpp"
#include "dtensor/trace/text_file.hpp"
#include "flags.hpp"

namespace {

using namespace dtensor;
using examples::flag_value;
using examples::UsageError;

struct Options {
  sim::TrainingPlan plan{.model = {.vocab = 50257, .seq = 2048, .dim = 12288, .heads = 96, .layers = 96, .mlp_ratio = 4},
                         .batch = 1536, .microbatches = 16, .dp = 128, .tp = 8, .pp = 16};
  bool sp = true, llama = false, bf16 = false;
  std::string trace;
  sim::Hardware hardware;
};

Options parse(int argc, char** argv) {
  Options o;
  auto& m = o.plan.model;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--layers") m.layers = flag_value<Extent>(a, value(), 1);
    else if (a == "--dim") m.dim = flag_value<Extent>(a, value(), 1);
    else if (a == "--heads") m.heads = flag_value<Extent>(a, value(), 1);
    else if (a == "--kv-heads") m.kv_heads = flag_value<Extent>(a, value(), 1);
    else if (a == "--ffn") m.ffn = flag_value<Extent>(a, value(), 1);
    else if (a == "--vocab") m.vocab = flag_value<Extent>(a, value(), 1);
    else if (a == "--seq") m.seq = flag_value<Extent>(a, value(), 1);
    else if (a == "--mlp-ratio") m.mlp_ratio = flag_value<Extent>(a, value(), 1);
    else if (a == "--checkpoint") m.checkpoint = true;
    else if (a == "--batch") o.plan.batch = flag_value<Extent>(a, value(), 1);
    else if (a == "--dp") o.plan.dp = flag_value<int>(a, value(), 1);
    else if (a == "--tp") o.plan.tp = flag_value<int>(a, value(), 1);
    else if (a == "--pp") o.plan.pp = flag_value<int>(a, value(), 1);
    else if (a == "--zero") o.plan.zero = flag_value<int>(a, value(), 1);
    else if (a == "--hsdp") o.plan.hsdp = flag_value<int>(a, value(), 1);
    else if (a == "--cp") o.plan.cp = flag_value<int>(a, value(), 1);
    else if (a == "--cp-kind") o.plan.cp_kind = parallel::parse_context_kind(value());
    else if (a == "--no-cp-balance") o.plan.cp_balanced = false;
    else if (a == "--microbatches") o.plan.microbatches = flag_value<int>(a, value(), 1);
    else if (a == "--stages-per-rank") o.plan.stages_per_rank = flag_value<int>(a, value(), 1);
    else if (a == "--schedule") o.plan.schedule = value();
    else if (a == "--experts") o.plan.moe.router.experts = flag_value<Extent>(a, value(), 1);
    else if (a == "--topk") o.plan.moe.router.topk = flag_value<Extent>(a, value(), 1);
    else if (a == "--ep") o.plan.ep = flag_value<int>(a, value(), 1);
    else if (a == "--moe-every") o.plan.moe.every = flag_value<Extent>(a, value(), 1);
    else if (a == "--capacity") o.plan.moe.router.capacity_factor = examples::positive_flag_value(a, value());
    else if (a == "--arch") {
      const auto arch = value();
      if (arch != "gpt" && arch != "llama") throw UsageError("--arch " + arch + ": gpt or llama");
      o.llama = arch == "llama";
    } else if (a == "--dtype") {
      const auto dtype = value();
      // f32 as train_gpt spells it; fp32 too (what this tool printed and accepted first).
      if (dtype != "f32" && dtype != "fp32" && dtype != "bf16") throw UsageError("--dtype " + dtype + ": f32 (or fp32) or bf16");
      o.bf16 = dtype == "bf16";
    } else if (a == "--no-sp") o.sp = false;
    else if (a == "--trace") o.trace = value();
    else if (a == "--efficiency") o.hardware.efficiency = examples::positive_flag_value(a, value());
    else if (a == "--peak-tflops") o.hardware.peak_flops = examples::positive_flag_value(a, value()) * 1e12;
    else throw UsageError("unknown flag " + a);
  }
  const auto number = [](auto n) { return std::to_string(n); };
  if (m.heads % o.plan.tp != 0) throw UsageError("--heads " + number(m.heads) + " is not a multiple of --tp " + number(o.plan.tp));
  if (m.dim % m.heads != 0) throw UsageError("--dim " + number(m.dim) + " is not a multiple of --heads " + number(m.heads));
  if (o.plan.batch % o.plan.microbatches != 0)
    throw UsageError("--batch " + number(o.plan.batch) + " is not a multiple of --microbatches " + number(o.plan.microbatches));
  if (!(o.hardware.efficiency <= 1)) throw UsageError("--efficiency must be in (0, 1]");
  if (o.llama && o.plan.has_experts()) throw UsageError("--arch llama with --experts: MoE blocks are GPT blocks");
  // Before the dry run (which may take a while): the trace's directory must exist (the trace is
  // written after it, checked again then), and the plan must be one (the GPU count fits an int).
  if (!o.trace.empty()) {
    std::error_code ec;
    const auto dir = std::filesystem::absolute(o.trace).parent_path();
    if (!std::filesystem::is_directory(dir, ec))
      throw UsageError("--trace " + o.trace + ": the directory " + dir.string() + " does not exist");
  }
  sim::check_plan(o.plan);
  return o;
}

template <class T, class Layers>
std::vector<sim::PlanClass> dry_run(const Options& o) {
  if (o.sp) return sim::dry_run_plan<T, Layers, true>(o.plan);
  return sim::dry_run_plan<T, Layers, false>(o.plan);
}

int run(const Options& o) {
  namespace pp = parallel::pipeline;
  const auto& p = o.plan;
  const auto& m = p.model;
  const auto schedule = pp::make_schedule(pp::parse_schedule_kind(p.schedule), p.pp, p.microbatches, p.stages_per_rank);
  const std::string context = p.cp > 1 ? " x cp " + std::to_string(p.cp) + " (" + std::string(parallel::name_of(p.cp_kind)) +
                                              (p.cp_balanced ? ", load-balanced)" : ")")
                                        : "";
  std::printf("plan_at_scale: %lld GPUs = pp %d x dp %d%s x tp %d%s; %s; %s schedule, %d micro-batches; %s\n", p.gpus(),
              p.pp, p.dp, context.c_str(), p.tp, o.sp ? " + SP" : "",
              p.zero == 0 ? "DDP" : (p.hsdp > 1 ? "HSDP " + std::to_string(p.hsdp) + " x " : std::string("")).append("ZeRO-" + std::to_string(p.zero)).c_str(),
              p.schedule.c_str(), p.microbatches, o.bf16 ? "bf16" : "fp32");
  if (p.has_experts())
    std::printf("MoE: %lld experts, top-%lld, every %lld blocks, over ep %d (balanced routing)\n",
                (long long)p.moe.router.experts, (long long)p.moe.router.topk, (long long)p.moe.every, p.ep);
  std::printf("model: %s, %lld layers, dim %lld, %lld heads (%lld KV), ffn %lld, vocab %lld, seq %lld, global batch %lld%s\n",
              o.llama ? "llama" : "gpt", (long long)m.layers, (long long)m.dim, (long long)m.heads,
              (long long)(m.kv_heads ? m.kv_heads : m.heads), (long long)(m.ffn ? m.ffn : m.mlp_ratio * m.dim),
              (long long)m.vocab, (long long)m.seq, (long long)p.batch, m.checkpoint ? ", activation checkpointing" : "");
  const auto started = std::chrono::steady_clock::now();
  std::vector<sim::PlanClass> classes;
  using ExpertMesh = MetaMesh<"edp", "ep", "tp">;
  if (o.llama) classes = o.bf16 ? dry_run<dtensor::bfloat16, nn::LlamaLayers>(o) : dry_run<float, nn::LlamaLayers>(o);
  else if (p.has_experts())
    classes = o.bf16 ? dry_run<dtensor::bfloat16, nn::MoELayers<dtensor::bfloat16, ExpertMesh>>(o) : dry_run<float, nn::MoELayers<float, ExpertMesh>>(o);
  else classes = o.bf16 ? dry_run<dtensor::bfloat16, nn::DenseLayers>(o) : dry_run<float, nn::DenseLayers>(o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const sim::Topology topology = sim::plan_topology(p, o.hardware);
  double worst = 0;
  for (auto& c : classes) {
    std::cout << '\n' << c.report.to_table();
    const auto est = sim::estimate_step(c.report, topology, schedule, schedule.layout.stages_per_rank);
    worst = std::max(worst, c.peak_in_flight);
    std::printf("estimate: step %.3f s (pipeline %.3f s, bubble %.1f %%, once per step %.3f s); compute %.3f s, "
                "communication %.3f s of which exposed %.3f s; peak memory with %d micro-batch stages in flight %s\n",
                est.step_seconds, est.pipeline_seconds, 100 * est.bubble_fraction, est.once_per_step_seconds,
                est.compute_seconds, est.communication_seconds, est.exposed_communication_seconds, c.in_flight,
                sim::detail::human_bytes(c.peak_in_flight).c_str());
    if (!o.trace.empty() && &c == &classes.front()) {
      trace::detail::write_text_file(o.trace, sim::chrome_trace(est, c.pipeline_rank, c.report.name), "plan_at_scale --trace");
      std::printf("trace of %s (pipeline rank %d): %s\n", c.report.name.c_str(), c.pipeline_rank, o.trace.c_str());
    }
  }
  std::printf("\ndry run: %zu rank classes for %lld GPUs in %.2f s; the most memory any rank holds: %s\n", classes.size(),
              p.gpus(), seconds, sim::detail::human_bytes(worst).c_str());
  return 0;
}

}  // namespace

const char* usage =
    "usage: plan_at_scale [--arch gpt|llama --layers N --dim N --heads N --kv-heads N "
    "--ffn N --vocab N --seq N --batch N --mlp-ratio N --dtype f32|bf16 --checkpoint --dp N --tp N "
    "--pp N --cp N --cp-kind ring|allgather|ulysses --no-cp-balance --zero 1|2|3 --hsdp R --microbatches N --schedule gpipe|1f1b|interleaved|zb|zbv "
    "--stages-per-rank N --experts E --topk K --ep N --moe-every N --capacity F --no-sp --trace FILE --efficiency X --peak-tflops X]\n";

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)  // --help anywhere, before any flag is checked or any work
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(usage, stdout);
      return 0;
    }
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "plan_at_scale: %s\n%s", e.what(), usage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_at_scale: %s\n", e.what());
    return 1;
  }
}
