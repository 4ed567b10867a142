// dtensor/nn/context_options.hpp — how attention crosses a split of the sequence over a context
// dimension: the kind (ring, all-gather-KV, Ulysses) and its options, as plain data.
//
//   nn::ContextAttentionOptions o{.kind = nn::ContextKind::ulysses, .load_balanced = true};
//   nn::AttentionConfig c{.dim = 64, .heads = 4, .seq = 32, .context = o};     // nn/attention.hpp
//
// The data lives here, below parallel/, because a module's configuration carries it (an
// attention, a block, a model); what runs it — the context-parallel attention core, ring,
// all-gather and Ulysses — is parallel/context_parallel.hpp's (parallel::ContextAttention), given
// to the attention module as a type by the model or the plan, so nn/ never includes parallel/.
// parallel:: names the same types (parallel::ContextAttentionOptions, parallel::ContextKind).
#pragma once

#include <string_view>
#include <vector>

#include "dtensor/core/error.hpp"

namespace dtensor::nn {

/// How attention reaches the keys of the other ranks of the context dimension.
enum class ContextKind {
  ring,       // K/V chunks rotate with send/recv, overlapped with the current chunk's attention
  allgather,  // K and V all-gathered once (PyTorch's default rotate method)
  ulysses,    // all-to-all: sequence-split to head-split and back (DeepSpeed-Ulysses)
};

constexpr std::string_view name_of(ContextKind k) {
  switch (k) {
    case ContextKind::ring: return "ring";
    case ContextKind::allgather: return "allgather";
    case ContextKind::ulysses: return "ulysses";
  }
  return "?";
}

/// "ring", "allgather" or "ulysses"; throws otherwise.
inline ContextKind parse_context_kind(std::string_view s) {
  for (auto k : {ContextKind::ring, ContextKind::allgather, ContextKind::ulysses})
    if (s == name_of(k)) return k;
  throw Error("parse_context_kind", dtensor::detail::cat("unknown context-parallel kind \"", s, "\": ring, allgather or ulysses"));
}

/// One event of a ring pass, for showing the overlap: the transfer of the chunk for `step` is
/// issued, the attention of `step`'s chunk computes, or the transfer for `step` is waited on.
struct ContextEvent {
  enum Kind { issue, compute, wait } kind;
  int step;
  friend bool operator==(const ContextEvent&, const ContextEvent&) = default;
};

struct ContextAttentionOptions {
  ContextKind kind = ContextKind::ring;
  bool load_balanced = false;  // the sequence is stored in load_balanced_order (context_layout.hpp)
  bool overlap = true;         // ring: issue the next chunk's transfer before this chunk's attention
  bool causal = true;
  double scale = 0;                            // 0: 1 / sqrt(head dimension)
  std::vector<ContextEvent>* trace = nullptr;  // ring: append the forward's events here
  // Grouped-query attention: k and v hold heads / kv_repeat heads, each serving kv_repeat query
  // heads. They travel (ring, all-gather) as they are and are repeated where the attention
  // computes, so the context collectives move the KV heads only; Ulysses repeats them first.
  int kv_repeat = 1;
};

}  // namespace dtensor::nn
