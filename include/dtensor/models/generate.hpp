// dtensor/models/generate.hpp — text from a trained GPT or Llama: greedy, temperature, top-k and
// top-p (nucleus) sampling, with a KV cache, on any mesh the model's forward runs on (one rank,
// TP with or without SP, ...).
//
//   auto ids = models::generate(model, prompt_ids, {.new_tokens = 100, .temperature = 0.8, .top_k = 20,
//                                                   .top_p = 0.9, .seed = 1});
//   auto r = models::generate_logits(model, prompt_ids, o);   // r.tokens, r.logits (each step's row, double)
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
// logits to 1e-12 in double). A prompt longer than seq keeps its last seq tokens as context.
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
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/parallel/context_layout.hpp"

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

/// The context size over which a model stores its sequences load-balanced (1: in order).
template <class Model>
int balanced_context(Model& model) {
  if constexpr (requires { model.config().context.load_balanced; })
    return model.config().context.load_balanced ? role_size<Role::context>(model.mesh()) : 1;
  else return 1;
}

/// The last row (original order) of logits [1, t, vocab] stored load-balanced over `cp`
/// (gathered whole on every rank) as double.
template <class Logits>
std::vector<double> last_row(const Logits& logits_dt, int cp = 1) {
  const auto logits = cp > 1 ? parallel::undo_load_balance(full_tensor(logits_dt), 1, cp) : full_tensor(logits_dt);
  const Extent vocab = logits.extent(2), t = logits.extent(1);
  const auto* last = logits.span().data() + (t - 1) * vocab;
  std::vector<double> row(static_cast<std::size_t>(vocab));
  for (Extent i = 0; i < vocab; ++i) row[std::size_t(i)] = double(last[i]);
  return row;
}

/// Whether the model's blocks take a KV cache (nn::TransformerBlock over nn::SelfAttention) and
/// its embedding a first position.
template <class Model>
concept KvCacheable = requires(Model& m, const typename Model::Ids& ids) {
  typename std::remove_cvref_t<decltype(m.blocks().front().inner())>::Attn::KvCache;
  requires std::remove_cvref_t<decltype(m.blocks().front().inner())>::Attn::kv_cacheable;
  m.prologue().forward_at(ids, Extent(0));
};

}  // namespace detail

/// The prompt followed by o.new_tokens generated ones, and each step's logits. Collective over
/// the model's mesh: every rank calls it with the same prompt and options and gets the same.
template <class Model>
GenerateResult generate_logits(Model& model, std::vector<std::int32_t> tokens, const GenerateOptions& o) {
  constexpr const char* op = "models::generate";
  const auto& cfg = model.config();
  if (tokens.empty()) throw Error(op, "the prompt is empty: give at least one token");
  if (o.new_tokens < 0 || o.temperature < 0 || !std::isfinite(o.temperature) || o.top_k < 0)
    throw Error(op, dtensor::detail::cat("new_tokens ", o.new_tokens, ", temperature ", o.temperature, ", top_k ", o.top_k,
                                         ": none may be negative"));
  if (!(o.top_p > 0 && o.top_p <= 1)) throw Error(op, dtensor::detail::cat("top_p ", o.top_p, " must be in (0, 1]"));
  for (std::int32_t t : tokens)
    if (t < 0 || t >= cfg.vocab)
      throw Error(op, dtensor::detail::cat("prompt token ", t, " is not in the vocabulary [0, ", cfg.vocab, ")"));
  using Ids = typename Model::Ids;
  const int cp = detail::balanced_context(model);
  auto ids_of = [&](std::size_t first, std::size_t count) {
    Tensor<std::int32_t, 2> ids(Shape<2>{1, Extent(count)});
    std::copy(tokens.begin() + std::ptrdiff_t(first), tokens.begin() + std::ptrdiff_t(first + count), ids.span().begin());
    // Under context parallelism, in the stored order (what the positions and the causal mask assume).
    return distribute_replicated<typename Ids::layout>(model.mesh(), cp > 1 ? parallel::load_balance(ids, 1, cp) : ids);
  };
  GenerateResult r;
  auto choose = [&](std::vector<double> row, int step) {
    tokens.push_back(choose_token(row, o, std::uint64_t(step)));
    r.logits.push_back(std::move(row));
  };
  int step = 0;
  if constexpr (detail::KvCacheable<Model>) {
    using Cache = typename std::remove_cvref_t<decltype(model.blocks().front().inner())>::Attn::KvCache;
    if (o.kv_cache && tokens.size() <= std::size_t(cfg.seq)) {
      std::vector<Cache> caches(model.blocks().size());
      std::size_t cached = 0;  // positions in the caches
      for (; step < o.new_tokens && tokens.size() <= std::size_t(cfg.seq); ++step) {
        const std::size_t fresh = tokens.size() - cached;  // the whole prompt, then one token
        auto x = model.prologue().forward_at(ids_of(cached, fresh), Extent(cached));
        for (std::size_t l = 0; l < caches.size(); ++l) x = model.blocks()[l].inner().forward_cached(x, caches[l]);
        cached += fresh;
        choose(detail::last_row(model.epilogue().forward(x).y, cp), step);
      }
    }
  }
  for (; step < o.new_tokens; ++step) {  // no cache, or the context beyond seq: the window recomputed
    const std::size_t window = std::min(tokens.size(), std::size_t(cfg.seq));
    auto x = model.prologue().forward(ids_of(tokens.size() - window, window)).y;
    for (auto& block : model.blocks()) x = block.forward(x).y;
    choose(detail::last_row(model.epilogue().forward(x).y, cp), step);
  }
  r.tokens = std::move(tokens);
  return r;
}

/// The prompt followed by o.new_tokens generated ones (generate_logits without the logits).
template <class Model>
std::vector<std::int32_t> generate(Model& model, std::vector<std::int32_t> tokens, const GenerateOptions& o) {
  return generate_logits(model, std::move(tokens), o).tokens;
}

}  // namespace dtensor::models
