// dtensor/models/dry_run_any.hpp — models::dry_run_plan chosen at run time: the element type
// (bf16 or float), the blocks (GPT's or Llama's, dense or with experts) and sequence parallelism.
//
//   auto classes = models::dry_run_any(plan, /*llama=*/true, /*bf16=*/true, /*sp=*/true);
//
// Each choice is a whole model's dry run to compile (the longest part of a translation unit that
// instantiates it): dry_run_any is a template, so that including this header compiles none of
// them (the first call does), and a program that links examples/plan_auto_dry.cpp's object,
// which defines the sixteen explicitly, declares them extern first (examples/dry_run_plans.hpp)
// and uses that copy.
#pragma once

#include <vector>

#include "dtensor/models/training_plan.hpp"

namespace dtensor::models {

/// The expert mesh of a MoE plan's dry run (models::MoELayers over each stage's ranks).
using DryRunExpertMesh = MetaMesh<"edp", "ep", "tp">;

/// dry_run_plan<T, Layers, SP>(p) with T bfloat16 (`bf16`) or float, Layers Llama's blocks
/// (`llama`) or GPT's, with experts where the plan has them (models::LlamaMoE's SwiGLU experts in
/// Llama blocks, GELU experts in GPT's), SP sequence parallelism on "tp" (`sp`). (A template of
/// no parameter a caller gives: see the top of this file.)
template <int = 0>
std::vector<PlanClass> dry_run_any(const TrainingPlan& p, bool llama, bool bf16, bool sp) {
  using bf = bfloat16;
  auto run = [&]<class T, class Layers>() {
    return sp ? dry_run_plan<T, Layers, true>(p) : dry_run_plan<T, Layers, false>(p);
  };
  if (llama && p.has_experts())
    return bf16 ? run.template operator()<bf, MoELayers<bf, DryRunExpertMesh, LlamaLayers>>()
                : run.template operator()<float, MoELayers<float, DryRunExpertMesh, LlamaLayers>>();
  if (llama) return bf16 ? run.template operator()<bf, LlamaLayers>() : run.template operator()<float, LlamaLayers>();
  if (p.has_experts())
    return bf16 ? run.template operator()<bf, MoELayers<bf, DryRunExpertMesh>>()
                : run.template operator()<float, MoELayers<float, DryRunExpertMesh>>();
  return bf16 ? run.template operator()<bf, DenseLayers>() : run.template operator()<float, DenseLayers>();
}

}  // namespace dtensor::models
