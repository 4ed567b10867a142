// examples/plan_auto_dry.cpp — the dry run of every model (examples::dry_run_any, declared in
// plan_rescore.hpp) and train_gpt --plan auto's dry run of the analytic best plans
// (examples::dry_rank, declared in plan_auto.hpp): the ranking plan_at_scale --search makes
// (examples/plan_rescore.hpp). One host translation unit, linked by train_gpt, train_gpt_cuda
// (nvcc never compiles the dry run) and plan_at_scale (the dry run is compiled once, not twice).
// It defines models::dry_run_plan's sixteen instantiations explicitly (dry_run_plans.hpp), so that
// tests/unit/test_sim.cpp, which links this object too, uses them instead of compiling its own.
#include "dry_run_plans.hpp"
#include "dtensor/models/dry_run_any.hpp"
#include "plan_auto.hpp"
#include "plan_rescore.hpp"

EXAMPLES_DRY_RUN_PLANS()

namespace examples {

std::vector<dtensor::models::PlanClass> dry_run_any(const dtensor::models::TrainingPlan& p, bool llama, bool bf16,
                                                    bool sp) {
  return dtensor::models::dry_run_any(p, llama, bf16, sp);  // this unit's explicit instantiations
}

std::vector<DryRanked> dry_rank(const PlanModel& m, const std::vector<dtensor::sim::RankedPlan>& ranked,
                                std::size_t finalists, const dtensor::sim::Hardware& hw) {
  // The trainer's model as the dry run builds it (models/gpt_config.hpp; vocab 256: characters).
  dtensor::models::TrainingPlan base{.model = {.vocab = m.vocab,
                                               .seq = m.seq,
                                               .dim = m.dim,
                                               .heads = m.heads,
                                               .layers = m.layers,
                                               .mlp_ratio = 4,
                                               .kv_heads = m.kv_heads,
                                               .ffn = m.ffn,
                                               .mla = m.mla}};
  if (m.experts > 0) {
    base.moe.router.experts = m.experts;
    base.moe.router.topk = m.topk;
    if (m.capacity > 0) base.moe.router.capacity_factor = m.capacity;
    base.moe.every = m.moe_every;
    base.moe.dense_first = m.dense_first;
    base.moe.shared = m.shared;
    base.moe.router.groups = m.groups;
    base.moe.router.topk_groups = m.topk_groups;
    base.moe.node_size = m.ep_node_size;
  }
  std::vector<DryRanked> out;
  for (const auto& f : rescore(base, m.llama, m.bf16, ranked, finalists, hw).finalists)
    out.push_back({f.analytic_rank, f.dry.step, f.dry.memory, f.dry.fits, f.error});
  return out;
}

}  // namespace examples
