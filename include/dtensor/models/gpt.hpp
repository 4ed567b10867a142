// dtensor/models/gpt.hpp — a GPT language model: token + position embedding, pre-norm blocks, final
// norm, LM head, mean cross-entropy.
//
//   models::GPTConfig cfg{.vocab = 96, .seq = 64, .dim = 128, .heads = 4, .layers = 2};
//   models::GPT<float, Mesh> model(mesh, cfg);                              // no tensor parallelism
//   models::GPT<float, Mesh, parallel::MegatronPlan<true>> tp(mesh, cfg);   // TP + SP (parallel/gpt_plan.hpp)
//   auto [loss, saved] = model.forward(ids, targets);   // ids, targets: [B, T] int32, batch split on the data dims
//   model.backward(std::move(saved));                   // gradients into the parameters (Partial where pending)
//   // or, split: auto wctx = model.backward_input(std::move(saved)); model.backward_weight(std::move(wctx));
//   double value = full_tensor(loss)[0];                // the global mean loss (an all-reduce on the data dims)
//
// The model is its parts (models::GptParts, an nn::LayeredModel: the prologue GptEmbedding "embed" =
// wte + wpe, the blocks "h.0", ..., the epilogue GptHead "head" = ln_f + lm_head, the plan's
// loss), run by nn::Stack (nn/stack.hpp), the one forward/backward loop that a pipeline stage
// cut from the same parts runs too (parallel/pipeline/split.hpp: pipeline::split(GptParts(...),
// layout, rank)). The parameters live in flat groups, one per part (FSDP's units; what DDP
// reduces as soon as backward has finished them); the Stack fires the unit hooks around each:
// pre_forward / post_forward around its forward, pre_backward before its backward, grads_ready
// as soon as its gradients are complete (head first, embed last). The split backward
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
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/nn/block.hpp"
#include "dtensor/nn/checkpoint.hpp"
#include "dtensor/nn/embedding.hpp"
#include "dtensor/nn/expert_ffn.hpp"
#include "dtensor/nn/positions.hpp"
#include "dtensor/nn/stack.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/parallel/context_layout.hpp"
#include "dtensor/parallel/context_parallel.hpp"

namespace dtensor::models {

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
  // Architecture variants (models::GPT uses the defaults; models::Llama, models/llama.hpp, sets them).
  Extent kv_heads = 0;     // KV heads of grouped-query attention (0: heads)
  Extent ffn = 0;          // feed-forward width (0: mlp_ratio * dim)
  double rope_theta = 0;   // > 0: rotary positions in attention with this base (Llama 3: 500000)
  bool bias = true;        // biases in the attention projections
  double norm_eps = 1e-5;  // the norms' epsilon
  // Per-module activation recomputation of every block (nn/recompute.hpp); full = checkpoint.
  nn::Recompute recompute{};
  // With rope_theta > 0: Llama 3.1's RoPE frequency remap (Hugging Face rope_type "llama3",
  // core/rope.hpp) when rope_scaling.factor > 0; models/hf_checkpoint.hpp reads and writes it.
  RopeScaling rope_scaling{};
  // DeepSeek's multi-head latent attention in the Llama blocks when mla.kv_lora_rank > 0
  // (nn/latent_attention.hpp; models::Llama, models::LlamaMoE); GPT's blocks refuse it.
  nn::LatentAttentionConfig mla{};
};

/// The blocks of models::GPT (its Layers parameter): each a TransformerBlock with the plan's MLP.
/// A Layers type names the block type, builds block `layer`, declares the meshes of parameters
/// not on the model's (parameter_meshes(), nn/param_groups.hpp: none here); auxiliary losses
/// are the modules' own (nn/aux_losses.hpp).
/// models/moe_gpt.hpp's MoELayers puts a mixture of experts in some blocks.
struct DenseLayers {
  template <class T, class Mesh, class Plan>
  using block =
      nn::TransformerBlock<T, Mesh, Plan, nn::MLP<T, Mesh, typename Plan::fc1, typename Plan::fc2>,
                           nn::LayerNorm<T, Mesh, typename Plan::between>, parallel::PlanAttention<T, Mesh, Plan>>;
  template <class Block, class Mesh>
  Block make_block(Extent /*layer*/, std::string name, const Mesh& mesh, const nn::BlockConfig& c,
                   std::uint64_t seed) const {
    return Block(std::move(name), mesh, c, seed);
  }
};

namespace detail {
/// What a Layers policy may say about the rest of the model: the residual stream's norm
/// (`template <class T, class Mesh, class P> using norm = ...`; default LayerNorm) and whether
/// the model has a learned position table (`static constexpr bool learned_positions`; default
/// true; models::Llama's rotary positions live in attention instead).
template <class Layers, class T, class Mesh, class P>
struct layers_norm {
  using type = nn::LayerNorm<T, Mesh, P>;
};
template <class Layers, class T, class Mesh, class P>
  requires requires { typename Layers::template norm<T, Mesh, P>; }
struct layers_norm<Layers, T, Mesh, P> {
  using type = typename Layers::template norm<T, Mesh, P>;
};
/// The attention a Layers policy's blocks take (`template <class T, class Mesh, class Plan> using
/// attention = ...`; default nn::SelfAttention with the plan's projections: parallel::PlanAttention;
/// models::LlamaLayers: nn::GqaOrMla).
template <class Layers, class T, class Mesh, class Plan>
struct layers_attention {
  using type = parallel::PlanAttention<T, Mesh, Plan>;
};
template <class Layers, class T, class Mesh, class Plan>
  requires requires { typename Layers::template attention<T, Mesh, Plan>; }
struct layers_attention<Layers, T, Mesh, Plan> {
  using type = typename Layers::template attention<T, Mesh, Plan>;
};
template <class Layers>
constexpr bool layers_learned_positions() {
  if constexpr (requires { Layers::learned_positions; }) return Layers::learned_positions;
  else return true;
}
/// The feed-forward a Layers policy's experts take (`static constexpr nn::ExpertFfn expert_ffn`;
/// default GPT's GELU MLP; models::LlamaLayers: SwiGLU).
template <class Layers>
constexpr nn::ExpertFfn layers_expert_ffn() {
  if constexpr (requires { Layers::expert_ffn; }) return Layers::expert_ffn;
  else return nn::ExpertFfn::gelu_mlp;
}
/// The block configuration a Layers policy builds its blocks with (`static nn::BlockConfig
/// block_config(nn::BlockConfig)`; default as given; models::LlamaLayers: no biases, its rope base).
template <class Layers>
nn::BlockConfig layers_block_config(const nn::BlockConfig& c) {
  if constexpr (requires { Layers::block_config(c); }) return Layers::block_config(c);
  else return c;
}
}  // namespace detail

/// The token embedding plus, where the model has a learned table, the position embedding: the
/// GPT's prologue (one unit, "embed").
template <class T, MeshType Mesh, class Plan, class Id, bool LearnedPositions>
class GptEmbedding {
 public:
  using between = typename Plan::between;
  using Wte = nn::Embedding<T, Mesh, typename Plan::wte, Id>;
  using Wpe = nn::Embedding<T, Mesh, nn::Replicated<between>, Id>;
  using In = DTensor<Id, 2, Mesh, nn::tokens<Mesh>>;
  using Out = typename Wte::Out;
  static_assert(std::is_same_v<typename Wpe::Out, Out>, "GPT: the plan's embedding must give the residual stream's layout");
  struct Saved {
    typename Wte::Saved wte;
    typename Wpe::Saved wpe;
  };
  using WeightCtx = std::tuple<typename Wte::WeightCtx, typename Wpe::WeightCtx>;  // children() order

  GptEmbedding(const Mesh& mesh, const GPTConfig& c, std::uint64_t seed_base) : mesh_(mesh), c_(c) {
    wte_ = Wte("wte", mesh, c.vocab, c.dim, seed_base + 1);
    if constexpr (LearnedPositions) wpe_ = Wpe("wpe", mesh, c.seq, c.dim, seed_base + 2);
  }

  nn::Fwd<Out, Saved> forward(const In& ids) const {
    Saved s;
    auto [te, wte_s] = wte_.forward(ids);
    s.wte = std::move(wte_s);
    if constexpr (!LearnedPositions) return {std::move(te), std::move(s)};
    else {
      auto [pe, wpe_s] = wpe_.forward(positions(ids));
      s.wpe = std::move(wpe_s);
      return {ops::add(te, pe), std::move(s)};
    }
  }
  /// Inference: the embeddings of ids whose first position is `first` (a KV-cached decode step,
  /// models/generate.hpp). Nothing is saved. first == 0 is a prefill, whose ids lie as forward's
  /// do (under context parallelism with load balancing in the stored order: the positions are
  /// forward's); after it, positions first, first + 1, ... in the order given (one at a time
  /// under generate).
  Out forward_at(const In& ids, Extent first) const {
    auto te = wte_.forward(ids).y;
    if constexpr (!LearnedPositions) return te;
    else {
      if (first == 0) return ops::add(te, wpe_.forward(positions(ids)).y);
      std::vector<Extent> at(std::size_t(ids.extent(1)));
      for (std::size_t i = 0; i < at.size(); ++i) at[i] = first + Extent(i);
      return ops::add(te, wpe_.forward(nn::positions<nn::tokens<Mesh, between>, Id>(mesh_, ids.shape(), at)).y);
    }
  }

  nn::Bwd<nn::Nothing, WeightCtx> backward_input(Saved s, const Out& dx) const {
    WeightCtx w;
    std::get<0>(w) = wte_.backward_input(std::move(s.wte), dx).weight;
    if constexpr (LearnedPositions) std::get<1>(w) = wpe_.backward_input(std::move(s.wpe), dx).weight;
    return {nn::Nothing{}, std::move(w)};
  }
  void backward_weight(WeightCtx w) {  // wte, then wpe
    wte_.backward_weight(std::move(std::get<0>(w)));
    if constexpr (LearnedPositions) wpe_.backward_weight(std::move(std::get<1>(w)));
  }

  auto children() { return std::tie(wte_, wpe_); }
  std::string name() const { return "embed"; }

 private:
  /// The global position of each of this rank's tokens in its sequence, laid out like the residual
  /// stream (nn/positions.hpp: under context parallelism with load balancing, the original index).
  DTensor<Id, 2, Mesh, nn::tokens<Mesh, between>> positions(const In& ids) const {
    return nn::positions<nn::tokens<Mesh, between>, Id>(
        mesh_, ids.shape(), parallel::original_positions(mesh_, ids.extent(1), c_.context.load_balanced));
  }

  Mesh mesh_;
  GPTConfig c_;
  Wte wte_;
  Wpe wpe_;  // an empty table without learned positions (no parameter, no unit member)
};

/// The final norm and the LM head: the GPT's epilogue (one unit, "head").
template <class Norm, class Head>
class GptHead {
 public:
  using In = typename Norm::X;
  using Out = typename Head::Out;
  static_assert(std::is_same_v<typename Head::In, In>, "GPT: the plan's head must take the residual stream's layout");
  struct Saved {
    typename Norm::Saved ln_f;
    typename Head::Saved head;
  };
  using WeightCtx = std::tuple<typename Norm::WeightCtx, typename Head::WeightCtx>;  // children() order

  GptHead(Norm ln_f, Head head) : ln_f_(std::move(ln_f)), head_(std::move(head)) {}

  nn::Fwd<Out, Saved> forward(const In& x) const {
    auto [normed, ln_s] = ln_f_.forward(x);
    auto [logits, head_s] = head_.forward(normed);
    return {std::move(logits), Saved{std::move(ln_s), std::move(head_s)}};
  }
  nn::Bwd<In, WeightCtx> backward_input(Saved s, const Out& dlogits) const {
    auto [dh, head_w] = head_.backward_input(std::move(s.head), dlogits);
    auto [dx, ln_w] = ln_f_.backward_input(std::move(s.ln_f), dh);
    return {std::move(dx), WeightCtx{std::move(ln_w), std::move(head_w)}};
  }
  void backward_weight(WeightCtx w) { nn::backward_weight_children(*this, std::move(w)); }  // head, then ln_f

  auto children() { return std::tie(ln_f_, head_); }
  std::string name() const { return "head"; }

 private:
  Norm ln_f_;
  Head head_;
};

/// A GPT as ordered parts (nn/stack.hpp's LayeredModel): embedding, blocks, final norm and head,
/// cross-entropy. models::GPT is all of them; a pipeline stage (parallel/pipeline/split.hpp) a run.
template <kernels::host::FloatElement T, MeshType Mesh, class Plan = nn::ReplicatedPlan, class Id = std::int32_t,
          class Layers = DenseLayers>
class GptParts {
  static_assert(nn::require_dense_roles<"models::GPT", Mesh>());

 public:
  using between = typename Plan::between;
  using Ids = DTensor<Id, 2, Mesh, nn::tokens<Mesh>>;
  using Target = Ids;
  using Block = nn::Checkpointed<typename Layers::template block<T, Mesh, Plan>>;
  using Norm = typename detail::layers_norm<Layers, T, Mesh, between>::type;
  using Head = nn::Linear<T, Mesh, typename Plan::head>;
  using Embed = GptEmbedding<T, Mesh, Plan, Id, detail::layers_learned_positions<Layers>()>;
  using LossFn = typename Plan::template loss<T, Mesh, typename Head::OutL>;

  GptParts(const Mesh& mesh, GPTConfig c, Layers layers = {}) : mesh_(mesh), c_(c), layers_(std::move(layers)) {
    dtensor::detail::check(c.vocab > 0 && c.seq > 0 && c.dim > 0 && c.heads > 0 && c.layers > 0 && c.dim % c.heads == 0,
                           "models::GPT", mesh, "config vocab ", c.vocab, ", seq ", c.seq, ", dim ", c.dim, ", heads ",
                           c.heads, ", layers ", c.layers, ": all must be > 0 and dim a multiple of heads");
  }

  const Mesh& mesh() const noexcept { return mesh_; }
  const GPTConfig& config() const noexcept { return c_; }
  Layers& layers() noexcept { return layers_; }
  const Layers& layers() const noexcept { return layers_; }
  Extent block_count() const noexcept { return c_.layers; }

  // Each part built whole from cfg.seed and its own offset, so any range of them starts from the
  // parameters of the whole model.
  Embed make_prologue() const { return Embed(mesh_, c_, seed_base()); }
  Block make_block(Extent layer) const {
    nn::BlockConfig bc{
        c_.dim,     c_.heads,    c_.seq, c_.mlp_ratio,  0.02,    0.02 / std::sqrt(2.0 * double(c_.layers)),
        c_.context, c_.kv_heads, c_.ffn, c_.rope_theta, c_.bias, c_.norm_eps};
    bc.recompute = c_.recompute;
    bc.rope_scaling = c_.rope_scaling;
    bc.mla = c_.mla;
    return Block(c_.checkpoint || c_.recompute.full, layers_.template make_block<typename Block::Inner>(
                                    layer, "h." + std::to_string(layer), mesh_, bc, seed_base() + 10 * std::uint64_t(layer + 1)));
  }
  GptHead<Norm, Head> make_epilogue() const {
    return {Norm("ln_f", mesh_, c_.dim, c_.norm_eps),
            Head("lm_head", mesh_, c_.dim, c_.vocab, seed_base() + 3, {.bias = false, .init_std = 0.02})};
  }
  LossFn make_loss() const { return LossFn{}; }
  /// The residual stream [B, T, C] of a micro-batch of these ids (what crosses pipeline stages).
  Shape<3> activation_shape(const Ids& ids) const { return {ids.extent(0), ids.extent(1), c_.dim}; }

 private:
  std::uint64_t seed_base() const { return c_.seed * 1000; }

  Mesh mesh_;
  GPTConfig c_;
  Layers layers_;
};

template <kernels::host::FloatElement T, MeshType Mesh, class Plan = nn::ReplicatedPlan, class Id = std::int32_t,
          class Layers = DenseLayers>
class GPT : public nn::Stack<GptParts<T, Mesh, Plan, Id, Layers>> {
  using Base = nn::Stack<GptParts<T, Mesh, Plan, Id, Layers>>;

 public:
  using Parts = GptParts<T, Mesh, Plan, Id, Layers>;
  using Block = typename Parts::Block;
  using X = typename Base::X;
  using Ids = typename Parts::Ids;
  using Loss = typename Base::Loss;
  using Saved = typename Base::Saved;
  using WeightCtx = typename Base::WeightCtx;
  using Unit = typename nn::WithUnits<T, Mesh>::Unit;

  GPT(const Mesh& mesh, GPTConfig c, Layers layers = {})
      : Base(Parts(mesh, c, std::move(layers)), {true, 0, c.layers, true}) {}
  GPT(GPT&&) = default;
  GPT& operator=(GPT&&) = default;

  /// The mean loss over all B*T targets, as this rank's share (see LossFn), and the saved state.
  /// Collectives: the plan's.
  nn::Fwd<Loss, Saved> forward(const Ids& ids, const Ids& targets) const {
    check_batch("models::GPT::forward", ids, targets);
    auto [out, s] = Base::forward(std::nullopt, ids, targets);
    return {std::move(*out.loss), std::move(s)};
  }

  /// The loss alone (validation): the saved state is dropped at once.
  Loss evaluate(const Ids& ids, const Ids& targets) const { return forward(ids, targets).y; }

  /// The input gradients of dloss * loss through every module, last first; returns the weight
  /// context (no parameter gradient is touched yet; backward_weight adds them: head, blocks
  /// last first, embed). Collectives: the adjoints of the plan's.
  WeightCtx backward_input(Saved s, double dloss = 1.0) const {
    return Base::backward_input(std::move(s), std::nullopt, dloss).weight;
  }

  /// The whole backward, unit by unit: each unit's weight gradients right after its input
  /// gradient, so the grads-ready callback (DDP's bucket all-reduce) fires while the earlier
  /// units still compute. Collectives: the adjoints of the plan's.
  void backward(Saved s, double dloss = 1.0) { Base::backward(std::move(s), std::nullopt, dloss); }

  /// Activation checkpointing of block l (all blocks: cfg.checkpoint).
  void set_checkpoint(std::size_t l, bool on) { this->blocks().at(l).set_enabled(on); }

  template <class List>
  void collect(List& out) { nn::collect_on<Mesh>(*this, out); }  // the parameters on the model's mesh

  const GPTConfig& config() const noexcept { return this->model().config(); }

 private:
  void check_batch(const char* op, const Ids& ids, const Ids& targets) const {
    const Extent seq = config().seq;
    dtensor::detail::check(
        ids.shape() == targets.shape() && ids.extent(0) > 0 && ids.extent(1) > 0 && ids.extent(1) <= seq, op,
        this->mesh(), "ids ", to_string(ids.shape()), " and targets ", to_string(targets.shape()),
        " must both be [batch, positions] with 1 to ", seq, " positions");
  }
};

}  // namespace dtensor::models

// The names these models had before models/ became their namespace (nn::GPT and so on): kept,
// so that code written against them compiles as before.
namespace dtensor::nn {
using models::DenseLayers;
using models::GPT;
using models::GPTConfig;
using models::GptEmbedding;
using models::GptHead;
using models::GptParts;
}  // namespace dtensor::nn
