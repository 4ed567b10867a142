// dtensor/models/pipeline_generate.hpp — text from a model as it trains: generation on the
// training mesh itself, over its pipeline stages, with its FSDP shards gathered.
//
//   const auto g = models::generate_on_pipeline(pipeline, layout, mesh, prompt, {.new_tokens = 200});
//   g.tokens;   // the same on every rank; g.seconds: the generation's time
//   models::generate_on_pipeline(pipeline, layout, mesh, prompt, o, [&](const auto& tokens) {
//     models::serve_on_tp(pipeline.executor().stages(), mesh, layout, 4, prompt, o);  // while gathered
//   });
//
// `pipeline` owns a pipeline::Executor and one fully_shard group per local stage
// (parallel::pipeline::ShardedPipeline, or train::Trainer's): every stage's ZeRO-3 shards are
// gathered once (unshard: one all-gather per unit) for the whole generation and freed after
// (reshard), instead of per token. The stages pass each token's activation along, every stage
// keeps the KV caches of its blocks, the last one's logits are broadcast over "pp"
// (models/generate.hpp). `then(tokens)` runs while the stages are still gathered (serving them
// elsewhere, models/serve.hpp). Collective over every rank of `mesh`, with the same prompt and
// options on each (generate checks).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "dtensor/models/generate.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"

namespace dtensor::models {

/// The generated tokens (the prompt's first) and how long the generation took on this rank.
struct PipelineGeneration {
  std::vector<std::int32_t> tokens;
  double seconds = 0;
};

/// Generates from `prompt` on `pipeline`'s stages (laid out by `layout` over `mesh`, "pp" first),
/// its FSDP shards gathered for the whole generation; `then(tokens)` before they are freed.
template <class Pipeline, class Mesh, class Then>
PipelineGeneration generate_on_pipeline(Pipeline& pipeline, const parallel::pipeline::StageLayout& layout,
                                        const Mesh& mesh, const std::vector<std::int32_t>& prompt,
                                        const GenerateOptions& o, Then&& then) {
  auto& stages = pipeline.executor().stages();
  for (std::size_t i = 0; i < stages.size(); ++i) pipeline.fsdp(i).unshard();
  PipelineGeneration g;
  const auto start = std::chrono::steady_clock::now();
  g.tokens = generate(stages, layout, mesh, prompt, o);
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  then(g.tokens);
  for (std::size_t i = 0; i < stages.size(); ++i) pipeline.fsdp(i).reshard();
  return g;
}

/// The same without a step while gathered.
template <class Pipeline, class Mesh>
PipelineGeneration generate_on_pipeline(Pipeline& pipeline, const parallel::pipeline::StageLayout& layout,
                                        const Mesh& mesh, const std::vector<std::int32_t>& prompt,
                                        const GenerateOptions& o) {
  return generate_on_pipeline(pipeline, layout, mesh, prompt, o, [](const std::vector<std::int32_t>&) {});
}

}  // namespace dtensor::models
