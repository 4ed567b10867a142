// dtensor/nn/gpt.hpp — a GPT language model: token + position embedding, pre-norm blocks, final
// norm, LM head, mean cross-entropy.
//
//   nn::GPTConfig cfg{.vocab = 96, .seq = 64, .dim = 128, .heads = 4, .layers = 2};
//   nn::GPT<float, Mesh> model(mesh, cfg);                              // no tensor parallelism
//   nn::GPT<float, Mesh, parallel::MegatronPlan<true>> tp(mesh, cfg);   // TP + SP (parallel/gpt_plan.hpp)
//   auto loss = model.forward(ids, targets);   // ids, targets: [B*T] int32, tokens<Mesh> (split on the data dims)
//   model.backward();                          // gradients into the parameters (Partial where pending)
//   nn::ParamList<float, 2> ps;  model.collect(ps);
//   double value = full_tensor(loss)[0];       // the global mean loss (an all-reduce on the data dims)
//
// The rows of ids are B sequences of T = cfg.seq tokens, one after the other; each data-parallel
// rank must get whole sequences (B divisible by the product of the data dimensions). The plan
// (nn::ReplicatedPlan, parallel::MegatronPlan<SP>) gives the style of every Linear, of the token
// embedding, the residual stream's placement on "tp" and the loss; the position embedding and
// the norms are replicated weights applied to the residual stream's tokens. The collectives are
// the plan's (see parallel/gpt_plan.hpp for the count per step).
//
// Initialisation (GPT-2): every weight N(0, 0.02), the blocks' output projections N(0, 0.02 /
// sqrt(2 * layers)), biases 0, norms 1 and 0; each drawn whole from cfg.seed and a per-module
// offset, so every plan and mesh starts from the same parameters.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "dtensor/nn/block.hpp"
#include "dtensor/nn/embedding.hpp"

namespace dtensor::nn {

struct GPTConfig {
  Extent vocab = 0;
  Extent seq = 0;      // T: the context length (and the rows of the position table)
  Extent dim = 0;      // C
  Extent heads = 1;
  Extent layers = 1;
  Extent mlp_ratio = 4;
  bool checkpoint = false;  // activation checkpointing of every block
  std::uint64_t seed = 1234;
};

template <kernels::host::FloatElement T, MeshType Mesh, class Plan = ReplicatedPlan, class Id = std::int32_t>
class GPT {
 public:
  using between = typename Plan::between;
  using Block = TransformerBlock<T, Mesh, Plan>;
  using X = typename Block::X;
  using Wte = Embedding<T, Mesh, typename Plan::wte, Id>;
  using Wpe = Embedding<T, Mesh, Replicated<between>, Id>;
  using Head = Linear<T, Mesh, typename Plan::head>;
  using LossFn = typename Plan::template loss<T, Mesh, typename Head::OutL>;
  using Ids = DTensor<Id, 1, Mesh, tokens<Mesh>>;
  using Loss = typename LossFn::Loss;
  static_assert(std::is_same_v<typename Wte::Out, X> && std::is_same_v<typename Wpe::Out, X> &&
                    std::is_same_v<typename Head::In, X>,
                "GPT: the plan's embedding and head styles must give and take the residual stream's layout");

  GPT(const Mesh& mesh, GPTConfig c) : mesh_(mesh), c_(c) {
    detail::check(c.vocab > 0 && c.seq > 0 && c.dim > 0 && c.heads > 0 && c.layers > 0 && c.dim % c.heads == 0,
                  "nn::GPT", mesh, "config vocab ", c.vocab, ", seq ", c.seq, ", dim ", c.dim, ", heads ", c.heads,
                  ", layers ", c.layers, ": all must be > 0 and dim a multiple of heads");
    const std::uint64_t s = c.seed * 1000;
    wte_ = Wte("wte", mesh, c.vocab, c.dim, s + 1);
    wpe_ = Wpe("wpe", mesh, c.seq, c.dim, s + 2);
    const BlockConfig bc{c.dim, c.heads, c.seq, c.mlp_ratio, 0.02, 0.02 / std::sqrt(2.0 * double(c.layers))};
    blocks_.reserve(std::size_t(c.layers));
    for (Extent l = 0; l < c.layers; ++l) {
      blocks_.emplace_back("h." + std::to_string(l), mesh, bc, s + 10 * std::uint64_t(l + 1));
      blocks_.back().set_checkpoint(c.checkpoint);
    }
    ln_f_ = LayerNorm<T, Mesh, between>("ln_f", mesh, c.dim);
    head_ = Head("lm_head", mesh, c.dim, c.vocab, s + 3, {.bias = false, .init_std = 0.02});
  }

  /// The mean loss over all B*T targets, as this rank's share (see LossFn). Collectives: the plan's.
  Loss forward(const Ids& ids, const Ids& targets) {
    check_batch("nn::GPT::forward", ids, targets);
    auto x = ops::add(wte_.forward(ids), wpe_.forward(positions(ids.extent(0))));
    for (auto& b : blocks_) x = b.forward(x);
    return loss_.forward(head_.forward(ln_f_.forward(x)), targets);
  }

  /// Gradients of dloss * loss into every parameter (input gradient, then weight gradient, per
  /// module). Collectives: the adjoints of the plan's.
  void backward(double dloss = 1.0) {
    auto dy = head_.backward_input(loss_.backward(dloss));
    head_.backward_weight();
    auto dx = ln_f_.backward(dy);
    for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) dx = b->backward(dx);
    wte_.backward(dx);
    wpe_.backward(dx);
  }

  /// The loss without keeping anything for a backward (validation).
  Loss evaluate(const Ids& ids, const Ids& targets) {
    auto loss = forward(ids, targets);
    release();
    return loss;
  }
  /// Frees every saved activation.
  void release() {
    for (auto& b : blocks_) b.release();
    ln_f_.release();
    head_.release();
    loss_.release();
  }

  template <class U>
  void collect(ParamList<U, Mesh::ndim>& out) {
    wte_.collect(out);
    wpe_.collect(out);
    for (auto& b : blocks_) b.collect(out);
    ln_f_.collect(out);
    head_.collect(out);
  }

  const GPTConfig& config() const noexcept { return c_; }
  const Mesh& mesh() const noexcept { return mesh_; }
  std::vector<Block>& blocks() noexcept { return blocks_; }

 private:
  void check_batch(const char* op, const Ids& ids, const Ids& targets) const {
    detail::check(ids.shape() == targets.shape() && ids.extent(0) % c_.seq == 0, op, mesh_, "ids ",
                  to_string(ids.shape()), " and targets ", to_string(targets.shape()),
                  " must be the same number of whole sequences of ", c_.seq, " tokens");
    const Extent b = ids.extent(0) / c_.seq;
    int data_ranks = 1;
    for (std::size_t i = 0; i < Mesh::ndim; ++i)
      if (i != Mesh::template index_of<"tp">()) data_ranks *= mesh_.size(i);
    detail::check(b % data_ranks == 0, op, mesh_, b, " sequences cannot be split evenly over ", data_ranks,
                  " data-parallel ranks (each needs whole sequences)");
  }

  /// The position of each of this rank's tokens in its sequence, laid out like the residual stream.
  DTensor<Id, 1, Mesh, tokens<Mesh, between>> positions(Extent n) const {
    using PL = tokens<Mesh, between>;
    const auto box = local_box(PL::desc, mesh_.shape(), mesh_.coordinate(), Shape<1>{n});
    Tensor<Id, 1> p(box.extent);
    for (Extent i = 0; i < box.extent[0]; ++i) p[i] = Id((box.offset[0] + i) % c_.seq);
    return from_local<PL>(mesh_, std::move(p), Shape<1>{n});
  }

  Mesh mesh_;
  GPTConfig c_;
  Wte wte_;
  Wpe wpe_;
  std::vector<Block> blocks_;
  LayerNorm<T, Mesh, between> ln_f_;
  Head head_;
  LossFn loss_;
};

}  // namespace dtensor::nn
