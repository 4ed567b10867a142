// dtensor/models/text_generation.hpp — text from a pipelined character model as it is (after
// training, or loaded from a checkpoint), printed by rank 0: on the training mesh itself, its FSDP
// shards gathered once for the whole generation (models/pipeline_generate.hpp), and optionally
// again on a serving mesh (tp N over ranks 0..N-1, the weights moved there in memory:
// models/serve.hpp) whose tokens must equal the training mesh's.
//
//   models::print_generated_text({.prompt = "The ", .options = {.new_tokens = 200}}, corpus,
//                                trainer.pipeline(), trainer.mesh(), trainer.schedule());
//
// Collective over the mesh: every rank generates the same text. The flags that ask for it
// (--generate, --prompt, --temperature, --top-k, --top-p, --serve-mesh) are models::cli's below:
// rows of a flag table (train/flag_table.hpp), their checks, and the TextGeneration they make.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/models/generate.hpp"
#include "dtensor/models/pipeline_generate.hpp"
#include "dtensor/models/serve.hpp"
#include "dtensor/models/text_corpus.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/train/flag_table.hpp"
#include "dtensor/train/flags.hpp"

namespace dtensor::models {

/// What to generate: the prompt, the sampling (models/generate.hpp; new_tokens 0: nothing) and
/// the serving mesh's tp (0: none).
struct TextGeneration {
  std::string prompt = "The ";
  GenerateOptions options{};
  int serve_tp = 0;
  std::string prompt_name = "the prompt";  // in the error for a character the corpus lacks ("--prompt")
};

namespace detail {

/// The serving mesh's run: the trained model moved in memory to tp N over ranks 0..N-1, the same
/// prompt and options; throws unless its tokens equal `trained` (the training mesh's).
template <class Stage, class Mesh>
void serve_text(const TextGeneration& g, std::vector<Stage>& stages, const Mesh& mesh,
                const parallel::pipeline::StageLayout& layout, const std::vector<std::int32_t>& prompt,
                const std::vector<std::int32_t>& trained) {
  using Layers = std::remove_cvref_t<decltype(stages.front().model().layers())>;
  constexpr bool moe = requires { typename Layers::ExpertMesh; };
  const int n = g.serve_tp;
  const auto s = serve_on_tp(stages, mesh, layout, n, prompt, g.options);
  if (s.serve_rank != 0) return;
  const auto& moved = s.moved;
  std::printf(
      "served on tp=%d (ranks 0..%d), weights moved in memory from %d pipeline stage(s)%s: %zu parameters, %zu B "
      "over %zu links (minimum %zu B, %zu B copied locally) in %.3f s; tokens %s the training mesh's\n",
      n, n - 1, layout.stages(), moe ? " and their experts" : "", moved.parameters, moved.bytes, moved.links,
      moved.minimum_bytes, moved.local_bytes, s.move_seconds, s.tokens == trained ? "equal to" : "DIFFERENT from");
  if (s.tokens != trained)
    throw Error("models::text_generation", "the serving mesh generated other tokens than the training mesh");
}

}  // namespace detail

/// Generates g.options.new_tokens characters after g.prompt on the pipeline's mesh (and the
/// serving mesh); rank 0 prints how, the speed and the text. Nothing when new_tokens is 0.
template <class Pipeline, class Mesh>
void print_generated_text(const TextGeneration& g, const Corpus& corpus, Pipeline& model, const Mesh& mesh,
                          const parallel::pipeline::Schedule& schedule) {
  if (g.options.new_tokens == 0) return;
  const auto prompt = encode_prompt(g.prompt, corpus, g.prompt_name);
  auto& stages = model.executor().stages();
  const auto out =
      generate_on_pipeline(model, schedule.layout, mesh, prompt, g.options, [&](const std::vector<std::int32_t>& ids) {
        if (g.serve_tp <= 0) return;
        if constexpr (std::is_same_v<mesh_space_t<Mesh>, host_space>)
          detail::serve_text(g, stages, mesh, schedule.layout, prompt, ids);
        else
          throw Error("models::print_generated_text", "a serving mesh for a model in device memory: not supported yet");
      });
  if (mesh.comm().rank() != 0) return;
  const auto& s = g.options;
  char how[96] = "greedy";
  if (s.temperature > 0)
    std::snprintf(how, sizeof how, "temperature %g, top-k %d, top-p %g", s.temperature, s.top_k, s.top_p);
  using Stage = std::remove_cvref_t<decltype(stages.front())>;
  const char* cache = KvCacheable<Stage> ? "KV cache" : "no KV cache: each window recomputed";
  std::printf("generated (%s, %d characters, %s; %d pipeline stages on %d ranks, %.1f characters/s):\n%s\n", how,
              s.new_tokens, cache, schedule.layout.stages(), mesh.comm().size(), s.new_tokens / out.seconds,
              decode(out.tokens, corpus).c_str());
}

}  // namespace dtensor::models

namespace dtensor::models::cli {

using namespace train::cli;

/// The generation flags' values (their meaning and defaults: generation_flag_rows).
struct GenerationFlags {
  int generate = 0, top_k = 0, serve_tp = 0;
  double temperature = 0, top_p = 1;
  std::string prompt = "The ";
  std::optional<std::uint64_t> sampling_seed;  // the generate program's --seed; else the training's
};

template <class O>
FlagTable<O> generation_flag_rows() {
  static_assert(std::is_base_of_v<GenerationFlags, O>);
  using G = GenerationFlags;
  return {
      {"", "", "text (where the model is: the host, or the GPU with --device cuda):"},
      {"--generate", "N",
       "N characters after --prompt from the trained model, on the training mesh with a KV cache per pipeline "
       "stage; with --resume DIR at or past --steps, from the checkpoint without training (the generate program: "
       "the same, the model's shape read from the checkpoint; generate --help)",
       integer(&G::generate, 1)},
      {"--prompt", "TEXT", "the text to continue (default \"The \"; characters of the training text)",
       text(&G::prompt)},
      {"--temperature", "T", "T > 0: sampled, not greedy", positive(&G::temperature)},
      {"--top-k", "K", "sampling from the K likeliest (needs --temperature)", integer(&G::top_k, 1)},
      {"--top-p", "P", "sampling from the nucleus: P in (0, 1], 1 = all (needs --temperature)", positive(&G::top_p, 1)},
      {"--serve-mesh", "tp=N",
       "the same text again on a serving mesh (tp N over ranks 0..N-1), the trained weights moved there in memory "
       "with the fewest bytes (docs/cross-mesh.md); its tokens must equal the training mesh's; from every pipeline "
       "stage, MoE experts included",
       valued(
           [](O& o, const std::string& f, const std::string& v) {
             if (!v.starts_with("tp=")) throw UsageError("--serve-mesh expects tp=N, got '" + v + "'");
             o.serve_tp = flag_value<int>(f, v.substr(3), 1);
           },
           &G::serve_tp)},
  };
}

/// The sampling flags need --generate (and --temperature); the serving mesh fits the `ranks`.
/// On a GPU (`device` "cuda") generation runs where the model is, with the threads backend: the
/// choice of each token and the ranks' agreement on the prompt exchange host buffers, which
/// NCCL's collectives do not take; the serving mesh's move is the host's.
inline void check_generation_flags(const GenerationFlags& o, int ranks, const std::string& device = "cpu",
                                   const std::string& backend = "threads") {
  if (o.generate > 0 && device == "cuda" && backend == "nccl")
    throw UsageError("--generate with --device cuda --backend nccl: not supported yet (use the threads backend)");
  if (o.serve_tp > 0 && device == "cuda") throw UsageError("--serve-mesh with --device cuda: not supported yet");
  if (o.generate == 0 && (o.temperature > 0 || o.top_k > 0 || o.top_p < 1))
    throw UsageError("--temperature, --top-k and --top-p need --generate N");
  if (o.top_k > 0 && o.temperature == 0)
    throw UsageError("--top-k needs --temperature T (without it generation is greedy)");
  if (o.top_p < 1 && o.temperature == 0)
    throw UsageError("--top-p " + cat(o.top_p) + " needs --temperature T (without it generation is greedy)");
  if (o.serve_tp > 0 && o.generate == 0) throw UsageError("--serve-mesh needs --generate N");
  if (o.serve_tp > ranks)
    throw UsageError("--serve-mesh tp=" + std::to_string(o.serve_tp) + ": more ranks than the training mesh's " +
                     std::to_string(ranks));
}

/// What the flags ask to generate; `seed`: the sampling's unless the generate program's --seed.
inline TextGeneration text_generation(const GenerationFlags& o, std::uint64_t seed) {
  return {.prompt = o.prompt,
          .options = {.new_tokens = o.generate,
                      .temperature = o.temperature,
                      .top_k = o.top_k,
                      .top_p = o.top_p,
                      .seed = o.sampling_seed.value_or(seed)},
          .serve_tp = o.serve_tp,
          .prompt_name = "--prompt"};
}

}  // namespace dtensor::models::cli
