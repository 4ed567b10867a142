// examples/plan_auto_dry.cpp — train_gpt --plan auto's dry run of the analytic best plans
// (examples::dry_rank, declared in plan_auto.hpp): the ranking plan_at_scale --search makes
// (examples/plan_rescore.hpp), in its own host translation unit so that the CUDA trainer, which
// compiles train_gpt.hpp with nvcc, links the dry run without nvcc compiling it.
#include "plan_auto.hpp"
#include "plan_rescore.hpp"

namespace examples {

std::vector<DryRanked> dry_rank(const PlanModel& m, const std::vector<dtensor::sim::RankedPlan>& ranked,
                                std::size_t finalists, const dtensor::sim::Hardware& hw) {
  // The trainer's model as the dry run builds it (models/gpt_config.hpp; vocab 256: characters).
  dtensor::sim::TrainingPlan base{.model = {.vocab = m.vocab, .seq = m.seq, .dim = m.dim, .heads = m.heads,
                                            .layers = m.layers, .mlp_ratio = 4, .kv_heads = m.kv_heads, .ffn = m.ffn}};
  if (m.experts > 0) {
    base.moe.router.experts = m.experts;
    base.moe.router.topk = m.topk;
    if (m.capacity > 0) base.moe.router.capacity_factor = m.capacity;
    base.moe.every = m.moe_every;
  }
  std::vector<DryRanked> out;
  for (const auto& f : rescore(base, m.llama, m.bf16, ranked, finalists, hw).finalists)
    out.push_back({f.analytic_rank, f.dry.step, f.dry.memory, f.dry.fits, f.error});
  return out;
}

}  // namespace examples
