// dtensor/models/generate.hpp — text from a trained GPT or Llama: greedy, temperature and top-k
// sampling, on any mesh the model's forward runs on (one rank, TP with or without SP, ...).
//
//   auto ids = models::generate(model, prompt_ids, {.new_tokens = 100, .temperature = 0.8, .top_k = 20, .seed = 1});
//
// Each new token is one forward of the last (at most seq) tokens as a batch of one sequence:
// the model's embedding, blocks and head (nn::Stack's parts, without the loss), the logits of
// the last position gathered whole (full_tensor: every rank holds the same values), then the
// next token chosen from them identically on every rank: the first largest logit (greedy,
// temperature 0), or a draw from softmax(logits / temperature) over the top_k largest (all when
// 0), with a counter-based generator seeded by `seed`, the same on every rank. So one rank and
// TP = 2 give the same tokens where their logits agree to the last bit of the choice (greedy:
// the same argmax; tests/unit/test_llama.cpp checks it).
// No KV cache: every step recomputes the whole window, O(seq^2) per token instead of O(seq) —
// fine for the short samples a trainer prints, not for serving. A prompt longer than seq keeps
// its last seq tokens as context.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/distributed/distribute.hpp"

namespace dtensor::models {

struct GenerateOptions {
  int new_tokens = 1;
  double temperature = 0;  // 0: greedy (the first largest logit)
  int top_k = 0;           // sample among the k largest logits; 0: all
  std::uint64_t seed = 0;
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
  const std::size_t k = o.top_k > 0 ? std::min(order.size(), std::size_t(o.top_k)) : order.size();
  std::vector<double> weight(k);
  const double top = double(logits[std::size_t(order[0])]);
  for (std::size_t i = 0; i < k; ++i) weight[i] = std::exp((double(logits[std::size_t(order[i])]) - top) / o.temperature);
  const double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  double u = detail::uniform01(o.seed, step) * total;
  for (std::size_t i = 0; i < k; ++i) {
    if (u < weight[i]) return order[i];
    u -= weight[i];
  }
  return order[k - 1];  // rounding at the very end of the range
}

/// The prompt followed by o.new_tokens generated ones. Collective over the model's mesh: every
/// rank calls it with the same prompt and options and gets the same tokens.
template <class Model>
std::vector<std::int32_t> generate(Model& model, std::vector<std::int32_t> tokens, const GenerateOptions& o) {
  constexpr const char* op = "models::generate";
  const auto& cfg = model.config();
  if (tokens.empty()) throw Error(op, "the prompt is empty: give at least one token");
  if (o.new_tokens < 0 || o.temperature < 0 || !std::isfinite(o.temperature) || o.top_k < 0)
    throw Error(op, dtensor::detail::cat("new_tokens ", o.new_tokens, ", temperature ", o.temperature, ", top_k ", o.top_k,
                                         ": none may be negative"));
  for (std::int32_t t : tokens)
    if (t < 0 || t >= cfg.vocab)
      throw Error(op, dtensor::detail::cat("prompt token ", t, " is not in the vocabulary [0, ", cfg.vocab, ")"));
  using Ids = typename Model::Ids;
  using Logit = std::remove_cvref_t<decltype(full_tensor(model.epilogue().forward(model.prologue().forward(std::declval<const Ids&>()).y).y))>;
  for (int step = 0; step < o.new_tokens; ++step) {
    const std::size_t window = std::min(tokens.size(), std::size_t(cfg.seq));
    Tensor<std::int32_t, 2> ids(Shape<2>{1, Extent(window)});
    std::copy(tokens.end() - std::ptrdiff_t(window), tokens.end(), ids.span().begin());
    const Ids x_ids = distribute_replicated<typename Ids::layout>(model.mesh(), ids);
    auto x = model.prologue().forward(x_ids).y;
    for (auto& block : model.blocks()) x = block.forward(x).y;
    const Logit logits = full_tensor(model.epilogue().forward(x).y);  // [1, window, vocab]
    const Extent vocab = logits.extent(2);
    const auto* last = logits.span().data() + (Extent(window) - 1) * vocab;
    const std::vector<typename Logit::value_type> row(last, last + vocab);
    tokens.push_back(choose_token(row, o, std::uint64_t(step)));
  }
  return tokens;
}

}  // namespace dtensor::models
