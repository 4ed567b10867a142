// dtensor/nn/stack.hpp — a model as ordered parts (prologue, blocks, epilogue and loss), and the
// one forward / backward loop over any contiguous run of them: a whole model (models::GPT) or one
// pipeline stage (parallel/pipeline/split.hpp) runs the same code.
//
//   struct MyModel {                                   // the parts protocol (nn::LayeredModel)
//     using Target = Labels;                           // what the loss compares the logits with
//     const Mesh& mesh() const;
//     Extent block_count() const;                      // how many blocks
//     Embed make_prologue() const;                     // Input -> X        (In, Out, Saved, WeightCtx)
//     Block make_block(Extent i) const;                // X -> X            (every block the same type)
//     Head make_epilogue() const;                      // X -> Logits
//     LossFn make_loss() const;                        // forward(logits, target) -> {Loss, Saved}; backward(saved, dloss) -> dlogits
//     Shape<3> activation_shape(const Input&) const;   // X's extents for this input (what a pipeline stage receives)
//     // optional: Policy& layers();  see "The blocks' policy" below
//   };
//   nn::Stack<MyModel> whole(model, nn::Stack<MyModel>::all(model));      // every part
//   auto [out, saved] = whole.forward(std::nullopt, x, labels);           // out.loss: the loss
//   whole.backward(std::move(saved), std::nullopt, 1.0);                  // gradients into the parameters
//
// A Stack holds a part range: the prologue (or not), blocks [first, end), the epilogue and loss
// (or not). forward takes the model's input when it holds the prologue, else `x` (the previous
// part's activation), and returns the activation after its last block — or, holding the
// epilogue, the loss (the output's y then empty). backward_input goes the other way, from
// dloss * loss or from `dy`, and returns the gradient of the stack's input activation (none when
// it holds the prologue: a model's input has no gradient here) and the weight context;
// backward_weight adds the weight gradients (epilogue, blocks last first, prologue); backward does
// both unit by unit, so grads_ready fires as each unit is finished (DDP's overlap).
//
// Units (nn/units.hpp): the prologue, each block and the epilogue are one unit each (named by
// their name(): a GPT's "embed", "h.l", "head"), fired like nn::Sequential's: pre_forward /
// post_forward around a part's forward, pre_backward before its input gradient (the loss's
// backward runs inside the epilogue's), grads_ready after its weight gradients. A part without
// parameters on the model's mesh forms no unit and fires nothing.
//
// Parameters on other meshes (nn/param_groups.hpp): the model (or its blocks' policy, layers())
// declares the other meshes its parameters live on, parameter_meshes() -> a tuple of
// nn::on_mesh(name, mesh); the stack makes one unit per part with parameters there
// ("<part>.<name>"), whatever members hold them, and parameter_groups() gives every group with
// its mesh: what pipeline FSDP, the optimizer, clip and checkpoints take. A part with a
// parameter on a mesh neither the model's nor declared is an error at construction.
//
// Auxiliary losses (nn/aux_losses.hpp): what the parts add during a forward
// (nn::add_auxiliary_loss: MoE load balancing, any module's) is collected per forward: a stack
// with the epilogue adds it to its loss, one without returns it in Output::auxiliary; backward
// weights their gradients like the loss's (nn::auxiliary_loss_scale() = dloss). The model has
// no code for it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/nn/activation_offload.hpp"
#include "dtensor/nn/aux_losses.hpp"
#include "dtensor/nn/param_groups.hpp"
#include "dtensor/nn/units.hpp"

namespace dtensor::nn {

/// What nn::Stack (and pipeline::split) need of a model: its parts, built one at a time.
template <class M>
concept LayeredModel = requires { typename M::Target; } && requires(const M& m, Extent i) {
  m.mesh();
  { m.block_count() } -> std::convertible_to<Extent>;
  m.make_prologue();
  m.make_block(i);
  m.make_epilogue();
  m.make_loss();
};

/// Checked one member at a time, so that the error names what a model lacks.
template <class M>
constexpr bool require_layered_model() {
  static_assert(requires { typename M::Target; }, "a layered model needs `Target`: the type its loss compares with");
  static_assert(requires(const M& m) { m.mesh(); }, "a layered model needs `mesh()` const");
  static_assert(requires(const M& m) { { m.block_count() } -> std::convertible_to<Extent>; },
                "a layered model needs `block_count()` const: how many blocks it has");
  static_assert(requires(const M& m) { m.make_prologue(); },
                "a layered model needs `make_prologue()` const: the module from its input to the blocks' activation");
  static_assert(requires(const M& m, Extent i) { m.make_block(i); },
                "a layered model needs `make_block(Extent i)` const: block i, activation to activation");
  static_assert(requires(const M& m) { m.make_epilogue(); },
                "a layered model needs `make_epilogue()` const: the module from the activation to the logits");
  static_assert(requires(const M& m) { m.make_loss(); },
                "a layered model needs `make_loss()` const: forward(logits, target) -> {loss, saved}, backward(saved, dloss)");
  return LayeredModel<M>;
}

namespace detail {
template <class M>
using prologue_t = decltype(std::declval<const M&>().make_prologue());
template <class M>
using block_t = decltype(std::declval<const M&>().make_block(Extent{}));
template <class M>
using epilogue_t = decltype(std::declval<const M&>().make_epilogue());
template <class M>
using loss_fn_t = decltype(std::declval<const M&>().make_loss());
template <class M>
using stack_x_t = typename prologue_t<M>::Out;

/// The other meshes a model's parameters live on: model.parameter_meshes(), else its blocks'
/// policy's (layers().parameter_meshes()), else none.
template <class M>
auto declared_meshes(M& m) {
  if constexpr (requires { m.parameter_meshes(); }) return m.parameter_meshes();
  else if constexpr (requires { m.layers().parameter_meshes(); }) return m.layers().parameter_meshes();
  else return std::tuple<>{};
}

/// Adds `extra` to a loss's local value (this rank's share), on the host or through it.
template <class Loss>
void add_to_loss(Loss& loss, double extra) {
  auto& value = loss.local();
  using Space = typename std::remove_cvref_t<decltype(value)>::space;
  if constexpr (Space::host_accessible) {
    value.data()[0] += extra;
  } else {  // a device: the one element goes through the host
    auto host = to_space<host_space>(value);
    host.data()[0] += extra;
    value = to_space<Space>(host);
  }
}
}  // namespace detail

template <class M>
class Stack : public WithUnits<typename detail::stack_x_t<M>::value_type, typename detail::stack_x_t<M>::mesh_type> {
  static_assert(require_layered_model<M>());
  using Base = WithUnits<typename detail::stack_x_t<M>::value_type, typename detail::stack_x_t<M>::mesh_type>;

 public:
  using Model = M;
  using Prologue = detail::prologue_t<M>;
  using Block = detail::block_t<M>;
  using Epilogue = detail::epilogue_t<M>;
  using LossFn = detail::loss_fn_t<M>;
  using Input = typename Prologue::In;
  using X = typename Prologue::Out;
  using Logits = typename Epilogue::Out;
  using Target = typename M::Target;
  using Loss = typename LossFn::Loss;
  using Mesh = typename X::mesh_type;
  static_assert(std::is_same_v<typename Block::In, X> && std::is_same_v<typename Block::Out, X>,
                "a layered model's blocks must take and give the prologue's output type (the activation X)");
  static_assert(std::is_same_v<typename Epilogue::In, X>,
                "a layered model's epilogue must take the blocks' activation X");
  /// Whether a part may add auxiliary losses (nn::has_auxiliary_losses): a pipeline then sums
  /// them over its stages.
  static constexpr bool has_auxiliary_loss =
      has_auxiliary_losses<Prologue> || has_auxiliary_losses<Block> || has_auxiliary_losses<Epilogue>;

  /// Which parts a stack holds.
  struct Range {
    bool prologue = true;
    Extent first = 0, end = 0;  // blocks [first, end)
    bool epilogue = true;
  };
  static Range all(const M& model) { return {true, 0, model.block_count(), true}; }

  struct Saved {
    std::optional<typename Prologue::Saved> prologue;
    std::vector<typename Block::Saved> blocks;
    std::optional<typename Epilogue::Saved> epilogue;
    std::optional<typename LossFn::Saved> loss;
    std::vector<ActivationOffload::Ticket> offloaded;  // per block: its saved state on the offload tier (or null)
  };
  struct WeightCtx {
    std::optional<typename Prologue::WeightCtx> prologue;
    std::vector<typename Block::WeightCtx> blocks;  // in block order
    std::optional<typename Epilogue::WeightCtx> epilogue;
  };
  /// What forward gives: the activation (no epilogue) or the loss (epilogue), and the blocks'
  /// auxiliary losses of a stack without the epilogue (this rank's shares; the loss holds the others').
  struct Output {
    std::optional<X> y;
    std::optional<Loss> loss;
    double auxiliary = 0;
  };

  /// Builds the parts of `range` with the model's factories (the same names, seeds and
  /// initialisation whatever the range, so stages together start from the whole model).
  Stack(M model, Range range) : model_(std::move(model)), range_(range) {
    if (range.first < 0 || range.first > range.end || range.end > model_.block_count())
      model_.mesh().comm().fail("nn::Stack", dtensor::detail::cat("blocks [", range.first, ", ", range.end,
                                                                   ") are not a range of the model's ", model_.block_count()));
    if (range.prologue) prologue_.emplace(model_.make_prologue());
    blocks_.reserve(std::size_t(range.end - range.first));
    for (Extent l = range.first; l < range.end; ++l) blocks_.push_back(model_.make_block(l));
    if (range.epilogue) {
      epilogue_.emplace(model_.make_epilogue());
      loss_.emplace(model_.make_loss());
    }
    const auto parts = nn::detail::unit_parts(*this);
    unit_of_ = this->make_units_from(parts);
    make_groups(parts);
  }
  Stack(Stack&&) = default;
  Stack& operator=(Stack&&) = default;

  bool has_prologue() const noexcept { return prologue_.has_value(); }
  bool has_epilogue() const noexcept { return epilogue_.has_value(); }
  Extent first_block() const noexcept { return range_.first; }

  /// From the model's input (with the prologue) or from x (without): the activation after the
  /// last block, or the loss (with the epilogue; `target` is read then only).
  Fwd<Output, Saved> forward(std::optional<X> x, const Input& input, const Target& target) const {
    Saved s;
    Output out;
    CollectAuxLosses aux;  // what the parts add (nn/aux_losses.hpp)
    if (prologue_) {
      auto [y, ps] = this->forward_unit(prologue_unit(), [&] { return prologue_->forward(input); });
      x = std::move(y);
      s.prologue = std::move(ps);
    }
    s.blocks.reserve(blocks_.size());
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      auto [y, bs] = this->forward_unit(block_unit(l), [&] { return blocks_[l].forward(*x); });
      x = std::move(y);
      s.blocks.push_back(std::move(bs));
      if (offload_ && offload_block_[l]) {
        s.offloaded.resize(blocks_.size());
        s.offloaded[l] = offload_->put_tensors(block_tensors_(s.blocks.back()));
      }
    }
    if (epilogue_) {
      auto [logits, es] = this->forward_unit(epilogue_unit(), [&] { return epilogue_->forward(*x); });
      auto [loss, ls] = loss_->forward(logits, target);
      if (aux.total() != 0) detail::add_to_loss(loss, aux.total());  // none also on meta (no scores)
      s.epilogue = std::move(es);
      s.loss = std::move(ls);
      out.loss = std::move(loss);
    } else {
      out.auxiliary = aux.total();
      out.y = std::move(x);
    }
    return {std::move(out), std::move(s)};
  }

  /// The input gradients of dloss * loss (with the epilogue) or of dy (without), last part
  /// first; returns the input activation's gradient (none with the prologue) and the weight
  /// context. No parameter gradient is touched.
  Bwd<std::optional<X>, WeightCtx> backward_input(Saved s, std::optional<X> dy, double dloss) const {
    AuxLossScale scale(dloss);  // the auxiliary losses' gradients weighted like the loss
    WeightCtx w;
    prefetch_before(s, blocks_.size());
    dy = backward_epilogue(s, std::move(dy), dloss, w);
    w.blocks.resize(blocks_.size());
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      bring_back(s, l);
      auto [dx, bw] = this->backward_unit(block_unit(l), [&] { return blocks_[l].backward_input(std::move(s.blocks[l]), *dy); });
      dy = std::move(dx);
      w.blocks[l] = std::move(bw);
    }
    if (prologue_) {
      backward_prologue_input(s, *dy, w);
      dy.reset();
    }
    return {std::move(dy), std::move(w)};
  }

  /// Adds the weight gradients: epilogue, blocks last first, prologue, each unit announced.
  void backward_weight(WeightCtx w) {
    if (epilogue_) weight_of(*epilogue_, std::move(*w.epilogue), epilogue_unit());
    for (std::size_t l = blocks_.size(); l-- > 0;) weight_of(blocks_[l], std::move(w.blocks[l]), block_unit(l));
    if (prologue_) weight_of(*prologue_, std::move(*w.prologue), prologue_unit());
  }

  /// The whole backward unit by unit: each unit's weight gradients right after its input
  /// gradient (grads_ready while the earlier units still compute). Returns as backward_input.
  std::optional<X> backward(Saved s, std::optional<X> dy, double dloss) {
    AuxLossScale scale(dloss);  // the auxiliary losses' gradients weighted like the loss
    WeightCtx w;
    prefetch_before(s, blocks_.size());
    dy = backward_epilogue(s, std::move(dy), dloss, w);
    if (epilogue_) weight_of(*epilogue_, std::move(*w.epilogue), epilogue_unit());
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      bring_back(s, l);
      auto [dx, bw] = this->backward_unit(block_unit(l), [&] { return blocks_[l].backward_input(std::move(s.blocks[l]), *dy); });
      dy = std::move(dx);
      weight_of(blocks_[l], std::move(bw), block_unit(l));
    }
    if (prologue_) {
      backward_prologue_input(s, *dy, w);
      weight_of(*prologue_, std::move(*w.prologue), prologue_unit());
      dy.reset();
    }
    return dy;
  }

  /// Activation offload (nn/activation_offload.hpp): the saved state of every block for which
  /// `which(l)` holds (l: the model's block index; no `which`: every block) goes to `offload`'s
  /// tier after the block's forward and comes back before its backward, the next block's read
  /// ahead. Null: none (the default). Several stacks (a rank's pipeline stages) may share one.
  void set_activation_offload(std::shared_ptr<ActivationOffload> offload, const std::function<bool(Extent)>& which = {}) {
    offload_ = std::move(offload);
    block_tensors_ = [](typename Block::Saved& saved) { return saved_tensors(saved); };
    offload_block_.assign(blocks_.size(), 0);
    for (std::size_t l = 0; l < blocks_.size(); ++l)
      offload_block_[l] = offload_ && (!which || which(range_.first + Extent(l))) ? 1 : 0;
  }
  const std::shared_ptr<ActivationOffload>& activation_offload() const noexcept { return offload_; }

  /// The parts, in order: each one unit (nn/units.hpp); absent ones form none.
  auto children() { return nn::children(prologue_, blocks_, epilogue_); }

  const Mesh& mesh() const noexcept { return model_.mesh(); }
  const M& model() const noexcept { return model_; }

  /// Every parameter group (nn/param_groups.hpp): units() on mesh(), then one per declared mesh.
  auto parameter_groups() {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      using Own = ParamGroup<typename Base::Unit, Mesh>;
      return std::tuple<Own, ParamGroup<unit_on<std::tuple_element_t<I, Declared>>,
                                        typename std::tuple_element_t<I, Declared>::mesh_type>...>{
          Own{&detail::own_group_name(), &mesh(), &this->units()},
          {&std::get<I>(declared_).name, &std::get<I>(declared_).mesh, &std::get<I>(other_units_)}...};
    }(std::make_index_sequence<std::tuple_size_v<Declared>>{});
  }
  /// The blocks' policy (the model's layers(), e.g. MoE's routing statistics).
  decltype(auto) layers() noexcept
    requires requires(M& m) { m.layers(); }
  {
    return model_.layers();
  }
  std::vector<Block>& blocks() noexcept { return blocks_; }
  const std::vector<Block>& blocks() const noexcept { return blocks_; }
  Prologue& prologue() { return prologue_.value(); }
  Epilogue& epilogue() { return epilogue_.value(); }

 private:
  using T = typename X::value_type;
  using Declared = decltype(detail::declared_meshes(std::declval<M&>()));
  template <class Decl>
  using unit_on = ParamUnit<T, Decl::mesh_type::ndim, mesh_space_t<typename Decl::mesh_type>>;
  template <class Tuple>
  struct units_of;
  template <class... D>
  struct units_of<std::tuple<D...>> {
    using type = std::tuple<std::vector<unit_on<D>>...>;
  };

  /// The units of the declared meshes (one per part with parameters there), and the check that
  /// every parameter is on the model's mesh or a declared one.
  void make_groups(const std::vector<nn::detail::UnitPart>& parts) {
    declared_ = detail::declared_meshes(model_);
    for (const auto& part : parts) {
      const std::size_t all = nn::detail::count_defined(part.params, nullptr);
      std::size_t placed = nn::detail::count_defined(part.params, nn::detail::mesh_key<Mesh>());
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (add_group_unit<I>(part, placed), ...);
      }(std::make_index_sequence<std::tuple_size_v<Declared>>{});
      if (placed != all)
        model_.mesh().comm().fail(
            "nn::Stack", dtensor::detail::cat("part ", part.name, " has ", all - placed,
                                              " parameters on a mesh that is neither the model's nor one it "
                                              "declares: list it in parameter_meshes() (nn/param_groups.hpp)"));
    }
  }
  template <std::size_t I>
  void add_group_unit(const nn::detail::UnitPart& part, std::size_t& placed) {
    using E = typename std::tuple_element_t<I, Declared>::mesh_type;
    static_assert(!std::is_same_v<E, Mesh>, "nn::Stack: parameter_meshes() lists the model's own mesh type");
    const std::size_t count = nn::detail::count_defined(part.params, nn::detail::mesh_key<E>());
    if (count == 0) return;
    placed += count;
    add_unit<T, E>(std::get<I>(other_units_), part.name + "." + std::get<I>(declared_).name, part.params);
  }

  /// Starts reading back the last offloaded block before block `end` (what the backward needs next).
  void prefetch_before(const Saved& s, std::size_t end) const {
    for (std::size_t k = std::min(end, s.offloaded.size()); k-- > 0;)
      if (s.offloaded[k]) return offload_->prefetch(s.offloaded[k]);
  }
  /// Block l's saved state back from the offload tier (if it went), and the next one's read started.
  void bring_back(Saved& s, std::size_t l) const {
    if (l >= s.offloaded.size()) return;
    if (s.offloaded[l]) offload_->get_tensors(s.offloaded[l], block_tensors_(s.blocks[l]));
    prefetch_before(s, l);
  }

  std::size_t part_unit(std::size_t part) const noexcept { return unit_of_[part]; }
  std::size_t prologue_unit() const noexcept { return part_unit(0); }
  std::size_t block_unit(std::size_t l) const noexcept { return part_unit(l + (prologue_ ? 1 : 0)); }
  std::size_t epilogue_unit() const noexcept { return part_unit(unit_of_.size() - 1); }

  template <class Part, class W>
  void weight_of(Part& part, W&& w, std::size_t unit) {
    part.backward_weight(std::forward<W>(w));
    this->grads_ready(unit);
  }

  /// The loss's and the epilogue's input gradients (with the epilogue), else dy as given.
  std::optional<X> backward_epilogue(Saved& s, std::optional<X> dy, double dloss, WeightCtx& w) const {
    if (!epilogue_) return dy;
    return this->backward_unit(epilogue_unit(), [&] {
      auto dlogits = loss_->backward(std::move(*s.loss), dloss);
      auto [dx, ew] = epilogue_->backward_input(std::move(*s.epilogue), dlogits);
      w.epilogue = std::move(ew);
      return std::optional<X>(std::move(dx));
    });
  }
  void backward_prologue_input(Saved& s, const X& dx, WeightCtx& w) const {
    this->backward_unit(prologue_unit(), [&] { w.prologue = prologue_->backward_input(std::move(*s.prologue), dx).weight; });
  }

  mutable M model_;
  Range range_;
  std::optional<Prologue> prologue_;
  std::vector<Block> blocks_;
  std::optional<Epilogue> epilogue_;
  std::optional<LossFn> loss_;
  std::vector<std::size_t> unit_of_;  // part -> unit index (WithUnits::no_unit: no parameters)
  std::shared_ptr<ActivationOffload> offload_;  // activation offload (none: null)
  std::vector<char> offload_block_;              // per block: offloaded
  // A block's saved tensors (nn::saved_tensors), set with the offload: the walk over a block's
  // saved state is then compiled only by programs that offload (it was 6 % of a GPT program's
  // compile memory, docs/benchmarks.md), and the offload's own code is reached through its vtable.
  std::vector<detail::SavedTensorRef> (*block_tensors_)(typename Block::Saved&) = nullptr;
  Declared declared_{};                                // the other meshes, named
  typename units_of<Declared>::type other_units_{};    // their units, one vector per declared mesh
};

}  // namespace dtensor::nn
