// examples/dry_run_plans.hpp — models::dry_run_plan's sixteen instantiations (the element type
// float or bf16; GPT, Llama, MoE-GPT or Llama-MoE layers; sequence parallelism on or off), declared `extern`.
// plan_auto_dry.cpp defines them, once (EXAMPLES_DRY_RUN_PLANS()); a program that links its
// object (train_gpt, train_gpt_cuda, plan_at_scale, tests/unit/test_sim.cpp) and includes this
// header uses that copy instead of compiling its own: each is a whole model's dry run, the
// longest part of those translation units (CI's build time, docs/benchmarks.md).
#pragma once

#include <vector>

#include "dtensor/models/training_plan.hpp"

namespace examples::dry_run_types {
using ExpertMesh = dtensor::MetaMesh<"edp", "ep", "tp">;  // = models::DryRunExpertMesh (models/dry_run_any.hpp)
using MoEF32 = dtensor::models::MoELayers<float, ExpertMesh>;
using MoEBF16 = dtensor::models::MoELayers<dtensor::bfloat16, ExpertMesh>;
using LlamaMoEF32 = dtensor::models::MoELayers<float, ExpertMesh, dtensor::models::LlamaLayers>;
using LlamaMoEBF16 = dtensor::models::MoELayers<dtensor::bfloat16, ExpertMesh, dtensor::models::LlamaLayers>;
}  // namespace examples::dry_run_types

#define EXAMPLES_DRY_RUN_PLAN(kw, T, Layers, SP)                                                      \
  kw template std::vector<::dtensor::models::PlanClass> dtensor::models::dry_run_plan<T, Layers, SP>( \
      const ::dtensor::models::TrainingPlan&);

// EXAMPLES_DRY_RUN_PLANS(extern) declares the sixteen; EXAMPLES_DRY_RUN_PLANS() defines them.
#define EXAMPLES_DRY_RUN_PLANS(kw)                                                              \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::dtensor::models::DenseLayers, true)                        \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::dtensor::models::DenseLayers, false)                       \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::dtensor::models::LlamaLayers, true)                        \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::dtensor::models::LlamaLayers, false)                       \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::examples::dry_run_types::MoEF32, true)                     \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::examples::dry_run_types::MoEF32, false)                    \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::dtensor::models::DenseLayers, true)          \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::dtensor::models::DenseLayers, false)         \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::dtensor::models::LlamaLayers, true)          \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::dtensor::models::LlamaLayers, false)         \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::examples::dry_run_types::MoEBF16, true)      \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::examples::dry_run_types::MoEBF16, false)     \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::examples::dry_run_types::LlamaMoEF32, true)                \
  EXAMPLES_DRY_RUN_PLAN(kw, float, ::examples::dry_run_types::LlamaMoEF32, false)               \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::examples::dry_run_types::LlamaMoEBF16, true) \
  EXAMPLES_DRY_RUN_PLAN(kw, ::dtensor::bfloat16, ::examples::dry_run_types::LlamaMoEBF16, false)

EXAMPLES_DRY_RUN_PLANS(extern)
