// dtensor/models/generate.hpp — text from a trained GPT or Llama: greedy, temperature, top-k and
// top-p (nucleus) sampling, with a KV cache, on any mesh the model's forward runs on (one rank,
// TP with or without SP, ...), whole or cut into pipeline stages.
//
//   auto ids = models::generate(model, prompt_ids, {.new_tokens = 100, .temperature = 0.8, .top_k = 20,
//                                                   .top_p = 0.9, .seed = 1});
//   auto r = models::generate_logits(model, prompt_ids, o);   // r.tokens, r.logits (each step's row, double)
//   auto stages = pipeline::split(models::GptParts<float, StageMesh, Plan>(stage_mesh, cfg), layout, mesh.coordinate(0));
//   auto ids = models::generate(stages, layout, mesh, prompt_ids, o);  // over pipeline stages (mesh: "pp" first)
//
// Pipeline parallelism: each rank runs its stages in stage order for every token — the first
// stage from the tokens, a later one from the activation of the stage before it (a message
// from that stage's rank: send_to / recv_from, as a pipeline's forward) — and keeps the KV
// caches of its own blocks; the last stage's logits row is broadcast over the pipeline
// dimension, so every rank chooses the same token. Per token: one message per stage boundary
// between ranks and one broadcast of vocab doubles; the stages work one after another (one
// sequence: nothing to overlap). FSDP-sharded stages hold their full parameters first
// (fully_shard's unshard(); examples/train_gpt's --generate does so).
//
// With the KV cache (o.kv_cache, the default, where the blocks offer forward_cached:
// nn::TransformerBlock over nn::SelfAttention), the prompt is run once (the prefill, causal over
// its positions, keys and values kept per layer: nn::SelfAttention::KvCache), then each new
// token is one forward of that single position at its global position (the embedding's
// forward_at, the rotary angles of that position) whose query attends to every cached key —
// O(context) per token instead of O(context^2). The cache holds at most cfg.seq positions (the
// position table's rows); once the context would exceed them, each step recomputes the last
// seq tokens as a window (the no-cache path), which is what the model can see. Without the cache
// every step recomputes the window: the embedding, blocks and head (nn::Stack's parts, without
// the loss) of the last (at most seq) tokens as a batch of one sequence. Either way the logits
// of the last position are gathered whole (full_tensor: every rank holds the same values) and
// the next token is chosen from them identically on every rank: the first largest logit
// (greedy, temperature 0), or a draw from softmax(logits / temperature) restricted to the top_k
// largest (all when 0) and then to the smallest set of largest ones whose probability reaches
// top_p (1: all), with a counter-based generator seeded by `seed`, the same on every rank. So one
// rank and TP = 2 give the same tokens where their logits agree to the last bit of the choice,
// and the cached and uncached paths agree to rounding (tests/unit/test_llama.cpp checks both;
// logits to 1e-12 in double; pipelines of 2 to 6 stages, looped and V-shaped, against one rank).
// A prompt longer than seq keeps its last seq tokens as context. Every rank must call with the
// same prompt and options: one all-gather of their hash at the start finds ranks that differ
// (comm/settings_agreement.hpp), which all throw.
// Under context parallelism (a mesh with a context dimension) the ids of a window or prompt are
// distributed as training distributes them: in the stored (load-balanced, with
// cfg.context.load_balanced) order, and the last row is taken at the original last position.
// The KV cache is then split over the context ranks (each keeps its shard of the prompt's K and
// V, and each decoded row goes to one rank): parallel::ContextAttention::prefill / decode.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtensor/comm/settings_agreement.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/distributed/transfer.hpp"
#include "dtensor/parallel/context_layout.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"

namespace dtensor::models {

struct GenerateOptions {
  int new_tokens = 1;
  double temperature = 0;  // 0: greedy (the first largest logit)
  int top_k = 0;           // sample among the k largest logits; 0: all
  double top_p = 1;        // nucleus: the fewest largest logits whose probability reaches top_p; 1: all
  std::uint64_t seed = 0;
  bool kv_cache = true;    // keep keys and values (where the model's blocks can); false: recompute each step
};

/// The prompt and the generated tokens, and the logits (the whole vocabulary, as double) each
/// generated token was chosen from.
struct GenerateResult {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<double>> logits;
};

namespace detail {

/// splitmix64: a counter-based draw, so that every rank gets the same number at the same step
/// without any state to keep in step.
inline double uniform01(std::uint64_t seed, std::uint64_t step) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (step + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

}  // namespace detail

/// The next token from one row of logits (the vocabulary's scores) under the options; `step`
/// numbers the draws of one generation.
template <class T>
std::int32_t choose_token(const std::vector<T>& logits, const GenerateOptions& o, std::uint64_t step) {
  if (logits.empty()) throw Error("models::choose_token", "no logits (vocabulary of size 0)");
  if (o.temperature == 0) return std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; equal logits by index, so the order is the same everywhere.
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return logits[std::size_t(a)] > logits[std::size_t(b)]; });
  std::size_t k = o.top_k > 0 ? std::min(order.size(), std::size_t(o.top_k)) : order.size();
  std::vector<double> weight(k);
  const double top = double(logits[std::size_t(order[0])]);
  for (std::size_t i = 0; i < k; ++i) weight[i] = std::exp((double(logits[std::size_t(order[i])]) - top) / o.temperature);
  double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  if (o.top_p < 1) {  // nucleus: keep the largest until their share reaches top_p (at least one)
    double kept = 0;
    std::size_t n = 0;
    while (n < k && (n == 0 || kept < o.top_p * total)) kept += weight[n++];
    k = n, total = kept;
  }
  double u = detail::uniform01(o.seed, step) * total;
  for (std::size_t i = 0; i < k; ++i) {
    if (u < weight[i]) return order[i];
    u -= weight[i];
  }
  return order[k - 1];  // rounding at the very end of the range
}

namespace detail {

/// The context size over which a model of this configuration on this mesh stores its sequences
/// load-balanced (1: in order).
template <class Config, class Mesh>
int balanced_context(const Config& cfg, const Mesh& mesh) {
  if constexpr (requires { cfg.context.load_balanced; })
    return cfg.context.load_balanced ? role_size<Role::context>(mesh) : 1;
  else return 1;
}

/// The last row (original order) of logits [1, t, vocab] stored load-balanced over `cp`
/// (gathered whole on every rank) as double. Logits in device memory (a GPU's model) are copied
/// to the host once, whole: the token is chosen there.
template <class Logits>
std::vector<double> last_row(const Logits& logits_dt, int cp = 1) {
  auto whole = into_space<host_space>(full_tensor(logits_dt));
  const auto logits = cp > 1 ? parallel::undo_load_balance(whole, 1, cp) : std::move(whole);
  const Extent vocab = logits.extent(2), t = logits.extent(1);
  const auto* last = logits.span().data() + (t - 1) * vocab;
  std::vector<double> row(static_cast<std::size_t>(vocab));
  for (Extent i = 0; i < vocab; ++i) row[std::size_t(i)] = double(last[i]);
  return row;
}

/// Whether the model's blocks take a KV cache (nn::TransformerBlock over nn::SelfAttention) and
/// its embedding a first position.
template <class Model>
concept KvCacheable = requires(Model& m, const typename Model::Input& ids) {
  typename std::remove_cvref_t<decltype(m.blocks().front().inner())>::Attn::KvCache;
  requires std::remove_cvref_t<decltype(m.blocks().front().inner())>::Attn::kv_cacheable;
  m.prologue().forward_at(ids, Extent(0));
};

/// The options and the prompt checked, then agreed on by every rank of `comm` (one all-gather
/// of a small record: ranks given another prompt or options throw together instead of
/// generating different text or hanging in a mismatched collective).
inline void check_generate_input(Communicator& comm, const std::vector<std::int32_t>& tokens, const GenerateOptions& o,
                                 Extent vocab) {
  constexpr const char* op = "models::generate";
  if (tokens.empty()) throw Error(op, "the prompt is empty: give at least one token");
  if (o.new_tokens < 0 || o.temperature < 0 || !std::isfinite(o.temperature) || o.top_k < 0)
    throw Error(op, dtensor::detail::cat("new_tokens ", o.new_tokens, ", temperature ", o.temperature, ", top_k ", o.top_k,
                                         ": none may be negative"));
  if (!(o.top_p > 0 && o.top_p <= 1)) throw Error(op, dtensor::detail::cat("top_p ", o.top_p, " must be in (0, 1]"));
  for (std::int32_t t : tokens)
    if (t < 0 || t >= vocab)
      throw Error(op, dtensor::detail::cat("prompt token ", t, " is not in the vocabulary [0, ", vocab, ")"));
  std::string prompt;
  for (std::int32_t t : tokens) prompt += dtensor::detail::cat(t, ",");
  require_same_settings(comm, op, {{"prompt", prompt}, {"new_tokens", dtensor::detail::cat(o.new_tokens)},
                                   {"temperature", dtensor::detail::cat(o.temperature)}, {"top_k", dtensor::detail::cat(o.top_k)},
                                   {"top_p", dtensor::detail::cat(o.top_p)}, {"seed", dtensor::detail::cat(o.seed)},
                                   {"kv_cache", o.kv_cache ? "on" : "off"}});
}

/// The decoding loop of every model form (a whole model, a pipeline's stages).
/// `forward(tokens, first, count, cached)` runs the model on tokens [first, first + count) and
/// returns the last position's logits, the same on every rank: cached — positions first..
/// continue the KV caches (the prompt as the prefill, then one token at a time); not cached — the
/// window, from position 0. With the cache, the loop goes on with recomputed windows once the
/// context passes `seq`.
template <class Forward>
GenerateResult decode(std::vector<std::int32_t> tokens, const GenerateOptions& o, Extent seq, bool cacheable,
                      Forward&& forward) {
  GenerateResult r;
  auto choose = [&](std::vector<double> row, int step) {
    tokens.push_back(choose_token(row, o, std::uint64_t(step)));
    r.logits.push_back(std::move(row));
  };
  int step = 0;
  if (cacheable && o.kv_cache && tokens.size() <= std::size_t(seq)) {
    std::size_t cached = 0;  // positions in the caches
    for (; step < o.new_tokens && tokens.size() <= std::size_t(seq); ++step) {
      const std::size_t fresh = tokens.size() - cached;  // the whole prompt, then one token
      choose(forward(tokens, cached, fresh, true), step);
      cached += fresh;
    }
  }
  for (; step < o.new_tokens; ++step) {  // no cache, or the context beyond seq: the window recomputed
    const std::size_t window = std::min(tokens.size(), std::size_t(seq));
    choose(forward(tokens, tokens.size() - window, window, false), step);
  }
  r.tokens = std::move(tokens);
  return r;
}

/// Tokens [first, first + count) as the model's ids [1, count], replicated over the mesh; stored
/// load-balanced over `cp` (what the positions and the causal mask of a context-parallel model
/// assume), in order when cp is 1.
template <class Ids, class Mesh>
Ids ids_of(const Mesh& mesh, const std::vector<std::int32_t>& tokens, std::size_t first, std::size_t count, int cp) {
  Tensor<std::int32_t, 2> ids(Shape<2>{1, Extent(count)});
  std::copy(tokens.begin() + std::ptrdiff_t(first), tokens.begin() + std::ptrdiff_t(first + count), ids.span().begin());
  // Made on the host, then copied to the model's memory (a GPU's: the tokens are its input).
  return distribute_replicated<typename Ids::layout>(
      mesh, into_space<mesh_space_t<Mesh>>(cp > 1 ? parallel::load_balance(ids, 1, cp) : std::move(ids)));
}

/// The KV caches of a model's (or a stage's) blocks: one per block; none where the blocks keep
/// none (KvCacheable false: the window is recomputed).
template <class Model, bool = KvCacheable<Model>>
struct BlockCaches {
  std::vector<int> caches;
};
template <class Model>
struct BlockCaches<Model, true> {
  std::vector<typename std::remove_cvref_t<decltype(std::declval<Model&>().blocks().front().inner())>::Attn::KvCache> caches;
};

/// The model's (or a stage's) blocks on x: continuing the caches (cached; the first call sizes
/// them) or as in training (a window from position 0, nothing kept).
template <class Model, class X>
X run_blocks(Model& model, X x, BlockCaches<Model>& bc, bool cached) {
  if constexpr (KvCacheable<Model>) {
    if (cached) {
      bc.caches.resize(model.blocks().size());
      for (std::size_t l = 0; l < bc.caches.size(); ++l) x = model.blocks()[l].inner().forward_cached(x, bc.caches[l]);
      return x;
    }
  }
  for (auto& block : model.blocks()) x = block.forward(x).y;
  return x;
}

/// The prologue on tokens [first, first + count): at those positions (cached) or from 0.
template <class Model>
auto run_prologue(Model& model, const std::vector<std::int32_t>& tokens, std::size_t first, std::size_t count, bool cached,
                  int cp) {
  const auto ids = ids_of<typename Model::Input>(model.mesh(), tokens, first, count, cp);
  if constexpr (KvCacheable<Model>)
    if (cached) return model.prologue().forward_at(ids, Extent(first));
  return model.prologue().forward(ids).y;
}

}  // namespace detail

/// Whether a model's stages keep a KV cache (generation then feeds one new token per step; programs
/// say which way they generate).
template <class Model>
concept KvCacheable = detail::KvCacheable<Model>;

/// The prompt followed by o.new_tokens generated ones, and each step's logits. Collective over
/// the model's mesh: every rank calls it with the same prompt and options (checked: ranks that
/// differ throw together) and gets the same.
template <class Model>
GenerateResult generate_logits(Model& model, std::vector<std::int32_t> tokens, const GenerateOptions& o) {
  const auto& cfg = model.config();
  detail::check_generate_input(model.mesh().comm(), tokens, o, cfg.vocab);
  const int cp = detail::balanced_context(cfg, model.mesh());
  detail::BlockCaches<Model> caches;
  return detail::decode(std::move(tokens), o, cfg.seq, detail::KvCacheable<Model>,
                        [&](const std::vector<std::int32_t>& t, std::size_t first, std::size_t count, bool cached) {
                          if (!cached) caches = {};
                          auto x = detail::run_blocks(model, detail::run_prologue(model, t, first, count, cached, cp), caches, cached);
                          return detail::last_row(model.epilogue().forward(x).y, cp);
                        });
}

/// Pipeline-parallel generation: `stages` are this pipeline rank's stages of a model
/// (pipeline::split: layout.stages_of(mesh.coordinate(0)), in that order), `mesh` the whole mesh
/// (its first dimension the pipeline's). Each step runs the stages in order — the first from the
/// tokens, each next one from the previous stage's activation, sent to its rank when it lives
/// on another (one point-to-point message per stage boundary per step, as a pipeline forward
/// sends) — and the last stage's logits row is broadcast over the pipeline dimension (one
/// broadcast of vocab doubles per step), so every rank chooses the same token. Each stage keeps
/// the KV caches of its own blocks: the prompt once, then one position per token. FSDP-sharded
/// stages must hold their full parameters (unshard() first: ZeRO-3). Collective over `mesh`.
template <class Stage, MeshType Mesh>
GenerateResult generate_logits(std::vector<Stage>& stages, const parallel::pipeline::StageLayout& layout, const Mesh& mesh,
                               std::vector<std::int32_t> tokens, const GenerateOptions& o) {
  constexpr const char* op = "models::generate";
  namespace pp = parallel::pipeline;
  static_assert(role_of<Mesh>(0) == Role::pipeline,
                "models::generate over pipeline stages: the mesh's first dimension must be the pipeline dimension");
  const int here = mesh.coordinate(0);
  const std::vector<int> mine = layout.stages_of(here);
  if (layout.ranks != mesh.size(0) || stages.size() != mine.size())
    mesh.comm().fail(op, dtensor::detail::cat("a layout of ", layout.stages(), " stages on ", layout.ranks,
                                              " pipeline ranks, a pipeline dimension of ", mesh.size(0), ", and ",
                                              stages.size(), " stages on pipeline rank ", here, " (the layout puts ",
                                              mine.size(), " here)"));
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (stages[i].index() != mine[i])
      mesh.comm().fail(op, dtensor::detail::cat("pipeline rank ", here, ": its stage ", i, " is stage ", stages[i].index(),
                                                ", the layout puts stage ", mine[i], " there"));
  const auto& cfg = stages.front().model().config();
  detail::check_generate_input(mesh.comm(), tokens, o, cfg.vocab);
  using X = typename Stage::X;
  constexpr auto pp_name = pp::detail::first_dimension<Mesh>::name;
  const int last_rank = layout.rank_of(layout.stages() - 1);
  const int cp = detail::balanced_context(cfg, stages.front().mesh());
  std::vector<detail::BlockCaches<Stage>> caches(stages.size());
  return detail::decode(
      std::move(tokens), o, cfg.seq, detail::KvCacheable<Stage>,
      [&](const std::vector<std::int32_t>& t, std::size_t first, std::size_t count, bool cached) {
        if (!cached) caches.assign(stages.size(), {});
        std::vector<double> row(static_cast<std::size_t>(cfg.vocab));
        std::optional<X> carry;  // the previous stage's output, when it ran here
        for (std::size_t i = 0; i < stages.size(); ++i) {
          Stage& stage = stages[i];
          const int s = stage.index();
          X x = stage.is_first() ? detail::run_prologue(stage, t, first, count, cached, cp)
                : carry ? std::move(*carry)
                        : recv_from<typename X::layout, typename X::value_type>(
                              stage.mesh(), mesh.template slice<pp_name>(layout.rank_of(s - 1)),
                              stage.activation_shape(detail::ids_of<typename Stage::Input>(stage.mesh(), t, first, count, cp)), s);
          carry.reset();
          x = detail::run_blocks(stage, std::move(x), caches[i], cached);
          if (stage.is_last()) {
            row = detail::last_row(stage.epilogue().forward(x).y, cp);
          } else if (layout.rank_of(s + 1) == here) {
            carry = std::move(x);
          } else {
            send_to(x, mesh.template slice<pp_name>(layout.rank_of(s + 1)), s + 1).wait();  // x ends with this iteration
          }
        }
        mesh.group(0).broadcast(std::span<double>(row), last_rank);
        return row;
      });
}

/// The prompt followed by o.new_tokens generated ones (generate_logits without the logits).
template <class Model>
std::vector<std::int32_t> generate(Model& model, std::vector<std::int32_t> tokens, const GenerateOptions& o) {
  return generate_logits(model, std::move(tokens), o).tokens;
}

/// The prompt followed by o.new_tokens generated ones, over pipeline stages (generate_logits
/// over stages without the logits).
template <class Stage, MeshType Mesh>
std::vector<std::int32_t> generate(std::vector<Stage>& stages, const parallel::pipeline::StageLayout& layout, const Mesh& mesh,
                                   std::vector<std::int32_t> tokens, const GenerateOptions& o) {
  return generate_logits(stages, layout, mesh, std::move(tokens), o).tokens;
}

}  // namespace dtensor::models
