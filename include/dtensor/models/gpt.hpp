// dtensor/models/gpt.hpp — a GPT language model: token + position embedding, pre-norm blocks, final
// norm, LM head, mean cross-entropy.
//
//   nn::GPTConfig cfg{.vocab = 96, .seq = 64, .dim = 128, .heads = 4, .layers = 2};
//   nn::GPT<float, Mesh> model(mesh, cfg);                              // no tensor parallelism
//   nn::GPT<float, Mesh, parallel::MegatronPlan<true>> tp(mesh, cfg);   // TP + SP (parallel/gpt_plan.hpp)
//   auto [loss, saved] = model.forward(ids, targets);   // ids, targets: [B, T] int32, batch split on the data dims
//   model.backward(std::move(saved));                   // gradients into the parameters (Partial where pending)
//   // or, split: auto wctx = model.backward_input(std::move(saved)); model.backward_weight(std::move(wctx));
//   double value = full_tensor(loss)[0];                // the global mean loss (an all-reduce on the data dims)
//
// The model's parameters live in flat groups, one per unit (FSDP's units; what DDP reduces as
// soon as backward has finished them), derived by nn::WithUnits (nn/units.hpp) from children():
// "embed" (wte, wpe), one per block ("h.0", ...), "head" (ln_f, lm_head). units(), set_hooks,
// hooks() and set_grads_ready are nn::WithUnits'; the model only marks where each unit's work
// runs: pre_forward / post_forward around its forward, pre_backward before its backward, and
// grads_ready as soon as its gradients are complete (head first, embed last). The split backward
// (backward_input, then backward_weight) runs pre_backward in backward_input and grads_ready in
// backward_weight.
//
// The batch may split unevenly over the data dimensions (torch.chunk: some ranks may hold fewer
// sequences, or none); sequences have at most cfg.seq positions, each position's embedding taken
// from its global index in the sequence (under context parallelism, the sequence split on the
// context dimension for the whole model, the index in the original order; cfg.context says how
// attention crosses the split, and the loss is the mean over the global positions). The plan
// (nn::ReplicatedPlan, parallel::MegatronPlan<SP>) gives the style of every Linear, of the token embedding, the residual stream's placement on
// the tensor dimension and the loss; the position embedding and the norms are replicated
// weights applied to the residual stream. The collectives are the plan's (parallel/gpt_plan.hpp).
//
// Initialisation (GPT-2): every weight N(0, 0.02), the blocks' output projections N(0, 0.02 /
// sqrt(2 * layers)), biases 0, norms 1 and 0; each drawn whole from cfg.seed and a per-module
// offset, so every plan and mesh starts from the same parameters.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <vector>

#include "dtensor/nn/block.hpp"
#include "dtensor/nn/checkpoint.hpp"
#include "dtensor/nn/embedding.hpp"
#include "dtensor/nn/positions.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/parallel/context_layout.hpp"
#include "dtensor/parallel/context_parallel.hpp"

namespace dtensor::nn {

struct GPTConfig {
  Extent vocab = 0;
  Extent seq = 0;      // T: the context length (and the rows of the position table)
  Extent dim = 0;      // C
  Extent heads = 1;
  Extent layers = 1;
  Extent mlp_ratio = 4;
  bool checkpoint = false;  // activation checkpointing of every block (set_checkpoint picks blocks)
  std::uint64_t seed = 1234;
  // Attention on a mesh with a context dimension (docs/context-parallel.md). With load_balanced,
  // ids and targets must be given in parallel::load_balanced_order (parallel::load_balance).
  parallel::ContextAttentionOptions context{};
  // Architecture variants (nn::GPT uses the defaults; nn::Llama, models/llama.hpp, sets them).
  Extent kv_heads = 0;     // KV heads of grouped-query attention (0: heads)
  Extent ffn = 0;          // feed-forward width (0: mlp_ratio * dim)
  double rope_theta = 0;   // > 0: rotary positions in attention with this base (Llama 3: 500000)
  bool bias = true;        // biases in the attention projections
  double norm_eps = 1e-5;  // the norms' epsilon
};

/// The blocks of nn::GPT (its Layers parameter): each a TransformerBlock with the plan's MLP.
/// A Layers type names the block type, builds block `layer`, adds the units of parameters that
/// are not on the model's mesh (add_units: none here) and its auxiliary losses to the loss
/// (add_losses: none here), weighting their gradients like the loss's (set_loss_scale).
/// models/moe_gpt.hpp's MoELayers puts a mixture of experts in some blocks.
struct DenseLayers {
  template <class T, class Mesh, class Plan>
  using block = TransformerBlock<T, Mesh, Plan, MLP<T, Mesh, typename Plan::fc1, typename Plan::fc2>,
                                 LayerNorm<T, Mesh, typename Plan::between>, parallel::PlanAttention<T, Mesh, Plan>>;
  template <class Block, class Mesh>
  Block make_block(Extent /*layer*/, std::string name, const Mesh& mesh, const BlockConfig& c, std::uint64_t seed) const {
    return Block(std::move(name), mesh, c, seed);
  }
  template <class Blocks>
  void add_units(Blocks&, Extent /*first_layer*/ = 0) {}
  template <class Loss, class Blocks>
  void add_losses(Loss&, const Blocks&) const {}
  template <class Blocks>
  void set_loss_scale(const Blocks&, double /*scale*/) const {}
};

namespace detail {
/// What a Layers policy may say about the rest of the model: the residual stream's norm
/// (`template <class T, class Mesh, class P> using norm = ...`; default LayerNorm) and whether
/// the model has a learned position table (`static constexpr bool learned_positions`; default
/// true; nn::Llama's rotary positions live in attention instead).
template <class Layers, class T, class Mesh, class P>
struct layers_norm {
  using type = LayerNorm<T, Mesh, P>;
};
template <class Layers, class T, class Mesh, class P>
  requires requires { typename Layers::template norm<T, Mesh, P>; }
struct layers_norm<Layers, T, Mesh, P> {
  using type = typename Layers::template norm<T, Mesh, P>;
};
template <class Layers>
constexpr bool layers_learned_positions() {
  if constexpr (requires { Layers::learned_positions; }) return Layers::learned_positions;
  else return true;
}
}  // namespace detail

template <kernels::host::FloatElement T, MeshType Mesh, class Plan = ReplicatedPlan, class Id = std::int32_t,
          class Layers = DenseLayers>
class GPT : public WithUnits<T, Mesh> {
  static_assert(require_dense_roles<"nn::GPT", Mesh>());

 public:
  using between = typename Plan::between;
  using Block = Checkpointed<typename Layers::template block<T, Mesh, Plan>>;
  using X = typename Block::In;
  using Wte = Embedding<T, Mesh, typename Plan::wte, Id>;
  using Wpe = Embedding<T, Mesh, Replicated<between>, Id>;
  using Norm = typename detail::layers_norm<Layers, T, Mesh, between>::type;
  static constexpr bool learned_positions = detail::layers_learned_positions<Layers>();
  using Head = Linear<T, Mesh, typename Plan::head>;
  using LossFn = typename Plan::template loss<T, Mesh, typename Head::OutL>;
  using Ids = DTensor<Id, 2, Mesh, tokens<Mesh>>;
  using Loss = typename LossFn::Loss;
  using Unit = typename WithUnits<T, Mesh>::Unit;
  static_assert(std::is_same_v<typename Wte::Out, X> && std::is_same_v<typename Wpe::Out, X> &&
                    std::is_same_v<typename Head::In, X>,
                "GPT: the plan's embedding and head styles must give and take the residual stream's layout");

  struct Saved {
    typename Wte::Saved wte;
    typename Wpe::Saved wpe;
    std::vector<typename Block::Saved> blocks;
    typename Norm::Saved ln_f;
    typename Head::Saved head;
    typename LossFn::Saved loss;
  };
  struct WeightCtx {
    typename Wte::WeightCtx wte;
    typename Wpe::WeightCtx wpe;
    std::vector<typename Block::WeightCtx> blocks;
    typename Norm::WeightCtx ln_f;
    typename Head::WeightCtx head;
  };

  GPT(const Mesh& mesh, GPTConfig c, Layers layers = {}) : mesh_(mesh), c_(c), layers_(std::move(layers)) {
    check_config("nn::GPT", mesh, c);
    wte_ = make_wte(mesh, c);
    if constexpr (learned_positions) wpe_ = make_wpe(mesh, c);
    blocks_.reserve(std::size_t(c.layers));
    for (Extent l = 0; l < c.layers; ++l) blocks_.push_back(make_block(mesh, c, l, layers_));
    ln_f_ = make_ln_f(mesh, c);
    head_ = make_head(mesh, c);
    this->make_units(*this);  // embed, the blocks, head: from children()
    layers_.add_units(blocks_);
  }
  GPT(GPT&&) = default;
  GPT& operator=(GPT&&) = default;

  // The modules, each built exactly as the constructor builds it (same name, seed and init): a
  // pipeline stage (models/gpt_stage.hpp) builds its share with these, so that it
  // starts from the parameters of the whole model.
  static void check_config(const char* op, const Mesh& mesh, const GPTConfig& c) {
    detail::check(c.vocab > 0 && c.seq > 0 && c.dim > 0 && c.heads > 0 && c.layers > 0 && c.dim % c.heads == 0, op,
                  mesh, "config vocab ", c.vocab, ", seq ", c.seq, ", dim ", c.dim, ", heads ", c.heads, ", layers ",
                  c.layers, ": all must be > 0 and dim a multiple of heads");
  }
  static Wte make_wte(const Mesh& mesh, const GPTConfig& c) { return Wte("wte", mesh, c.vocab, c.dim, seed_base(c) + 1); }
  static Wpe make_wpe(const Mesh& mesh, const GPTConfig& c) { return Wpe("wpe", mesh, c.seq, c.dim, seed_base(c) + 2); }
  static Block make_block(const Mesh& mesh, const GPTConfig& c, Extent layer, const Layers& layers = {}) {
    const BlockConfig bc{c.dim,     c.heads,    c.seq,        c.mlp_ratio, 0.02, 0.02 / std::sqrt(2.0 * double(c.layers)),
                         c.context, c.kv_heads, c.ffn,        c.rope_theta, c.bias, c.norm_eps};
    return Block(c.checkpoint, layers.template make_block<typename Block::Inner>(
                                   layer, "h." + std::to_string(layer), mesh, bc, seed_base(c) + 10 * std::uint64_t(layer + 1)));
  }
  static Norm make_ln_f(const Mesh& mesh, const GPTConfig& c) { return Norm("ln_f", mesh, c.dim, c.norm_eps); }
  static Head make_head(const Mesh& mesh, const GPTConfig& c) {
    return Head("lm_head", mesh, c.dim, c.vocab, seed_base(c) + 3, {.bias = false, .init_std = 0.02});
  }

  /// The global position of each of this rank's tokens in its sequence, laid out like the residual
  /// stream (nn/positions.hpp: under context parallelism with load balancing, the original index).
  static DTensor<Id, 2, Mesh, tokens<Mesh, between>> positions(const Mesh& mesh, const Ids& ids, const GPTConfig& c) {
    return nn::positions<tokens<Mesh, between>, Id>(
        mesh, ids.shape(), parallel::original_positions(mesh, ids.extent(1), c.context.load_balanced));
  }

  /// The residual stream's input: the token embedding, plus the position embedding where the
  /// model has a learned table (wpe unused otherwise). Saves what the embeddings' backward needs.
  /// Static, with the modules as arguments, so that a pipeline stage embeds as the model does.
  static X embed(const Mesh& mesh, const GPTConfig& c, const Wte& wte, const Wpe& wpe, const Ids& ids,
                 typename Wte::Saved& wte_saved, typename Wpe::Saved& wpe_saved) {
    auto [te, wte_s] = wte.forward(ids);
    wte_saved = std::move(wte_s);
    if constexpr (!learned_positions) return std::move(te);
    else {
      auto [pe, wpe_s] = wpe.forward(positions(mesh, ids, c));
      wpe_saved = std::move(wpe_s);
      return ops::add(te, pe);
    }
  }

  /// The mean loss over all B*T targets, as this rank's share (see LossFn), and the saved state.
  /// Collectives: the plan's.
  Fwd<Loss, Saved> forward(const Ids& ids, const Ids& targets) const {
    check_batch("nn::GPT::forward", ids, targets);
    Saved s;
    auto x = this->forward_unit(0, [&] { return embed(mesh_, c_, wte_, wpe_, ids, s.wte, s.wpe); });
    s.blocks.reserve(blocks_.size());
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      auto [y, bs] = this->forward_unit(l + 1, [&] { return blocks_[l].forward(x); });
      x = std::move(y);
      s.blocks.push_back(std::move(bs));
    }
    auto [ln_s, logits, head_s] = this->forward_unit(head_unit(), [&] {
      auto [normed, ln_saved] = ln_f_.forward(x);
      auto [out, head_saved] = head_.forward(normed);
      return std::tuple(std::move(ln_saved), std::move(out), std::move(head_saved));
    });
    auto [loss, loss_s] = loss_.forward(logits, targets);
    layers_.add_losses(loss, blocks_);
    s.ln_f = std::move(ln_s);
    s.head = std::move(head_s);
    s.loss = std::move(loss_s);
    return {std::move(loss), std::move(s)};
  }

  /// The loss alone (validation): the saved state is dropped at once.
  Loss evaluate(const Ids& ids, const Ids& targets) const { return forward(ids, targets).y; }

  /// The input gradients of dloss * loss through every module, last first; returns the weight
  /// context (no parameter gradient is touched yet). Collectives: the adjoints of the plan's.
  WeightCtx backward_input(Saved s, double dloss = 1.0) const {
    layers_.set_loss_scale(blocks_, dloss);
    WeightCtx w;
    auto [dx, pending] = backward_head(s, dloss);
    w.ln_f = std::move(pending.ln_f);
    w.head = std::move(pending.head);
    w.blocks.resize(blocks_.size());
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      // dx by an init-capture: clang before 16 cannot capture a structured binding.
      auto [d, bw] = this->backward_unit(l + 1, [&, &dx = dx] { return blocks_[l].backward_input(std::move(s.blocks[l]), dx); });
      dx = std::move(d);
      w.blocks[l] = std::move(bw);
    }
    backward_embed_input(std::move(s), dx, w);
    return w;
  }

  /// Adds every weight gradient (head, blocks last first, embed), announcing each unit.
  void backward_weight(WeightCtx w) {
    head_.backward_weight(std::move(w.head));
    ln_f_.backward_weight(std::move(w.ln_f));
    this->grads_ready(head_unit());
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      blocks_[l].backward_weight(std::move(w.blocks[l]));
      this->grads_ready(l + 1);
    }
    backward_embed_weight(std::move(w));
    this->grads_ready(0);
  }

  /// The whole backward, unit by unit: each unit's weight gradients right after its input
  /// gradient, so the grads-ready callback (DDP's bucket all-reduce) fires while the earlier
  /// units still compute. Collectives: the adjoints of the plan's.
  void backward(Saved s, double dloss = 1.0) {
    layers_.set_loss_scale(blocks_, dloss);
    auto [dx, pending] = backward_head(s, dloss);
    head_.backward_weight(std::move(pending.head));
    ln_f_.backward_weight(std::move(pending.ln_f));
    this->grads_ready(head_unit());
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      // dx by an init-capture: clang before 16 cannot capture a structured binding.
      auto [d, bw] = this->backward_unit(l + 1, [&, &dx = dx] { return blocks_[l].backward_input(std::move(s.blocks[l]), dx); });
      dx = std::move(d);
      blocks_[l].backward_weight(std::move(bw));
      this->grads_ready(l + 1);
    }
    WeightCtx w;
    backward_embed_input(std::move(s), dx, w);
    backward_embed_weight(std::move(w));
    this->grads_ready(0);
  }

  /// units() (nn::WithUnits): embed, h.0 .. h.{L-1}, head (on the model's mesh; the Layers may
  /// keep more, e.g. MoELayers::expert_units()).
  Layers& layers() noexcept { return layers_; }

  /// Activation checkpointing of block l (all blocks: cfg.checkpoint).
  void set_checkpoint(std::size_t l, bool on) { blocks_.at(l).set_enabled(on); }

  /// The parameters in order, grouped into the units: embed, one per block, head.
  auto children() { return nn::children(unit("embed", wte_, wpe_), blocks_, unit("head", ln_f_, head_)); }
  template <class List>
  void collect(List& out) { nn::collect_on<Mesh>(*this, out); }  // the parameters on the model's mesh

  const GPTConfig& config() const noexcept { return c_; }
  const Mesh& mesh() const noexcept { return mesh_; }
  std::vector<Block>& blocks() noexcept { return blocks_; }

 private:
  struct HeadCtx {
    typename Norm::WeightCtx ln_f;
    typename Head::WeightCtx head;
  };

  std::size_t head_unit() const noexcept { return this->units().size() - 1; }

  std::pair<X, HeadCtx> backward_head(Saved& s, double dloss) const {
    return this->backward_unit(head_unit(), [&] {
      auto dlogits = loss_.backward(std::move(s.loss), dloss);
      auto [dh, head_w] = head_.backward_input(std::move(s.head), dlogits);
      auto [dx, ln_w] = ln_f_.backward_input(std::move(s.ln_f), dh);
      return std::pair<X, HeadCtx>{std::move(dx), HeadCtx{std::move(ln_w), std::move(head_w)}};
    });
  }
  void backward_embed_input(Saved&& s, const X& dx, WeightCtx& w) const {
    this->backward_unit(0, [&] {
      w.wte = wte_.backward_input(std::move(s.wte), dx).weight;
      if constexpr (learned_positions) w.wpe = wpe_.backward_input(std::move(s.wpe), dx).weight;
    });
  }
  void backward_embed_weight(WeightCtx&& w) {
    wte_.backward_weight(std::move(w.wte));
    if constexpr (learned_positions) wpe_.backward_weight(std::move(w.wpe));
  }

  void check_batch(const char* op, const Ids& ids, const Ids& targets) const {
    detail::check(ids.shape() == targets.shape() && ids.extent(0) > 0 && ids.extent(1) > 0 && ids.extent(1) <= c_.seq,
                  op, mesh_, "ids ", to_string(ids.shape()), " and targets ", to_string(targets.shape()),
                  " must both be [batch, positions] with 1 to ", c_.seq, " positions");
  }

  static std::uint64_t seed_base(const GPTConfig& c) { return c.seed * 1000; }

  Mesh mesh_;
  GPTConfig c_;
  Layers layers_;
  Wte wte_;
  Wpe wpe_;
  std::vector<Block> blocks_;
  Norm ln_f_;
  Head head_;
  LossFn loss_;
};

}  // namespace dtensor::nn
