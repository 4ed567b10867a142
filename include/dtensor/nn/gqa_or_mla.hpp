// dtensor/nn/gqa_or_mla.hpp — the Llama blocks' attention: grouped-query attention
// (nn::SelfAttention) or DeepSeek's multi-head latent attention (nn::MultiHeadLatentAttention),
// chosen at construction by the configuration (mla.kv_lora_rank > 0: MLA).
//
//   nn::GqaOrMla<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> a("attn", mesh, cfg, 7);
//   a.is_mla();  a.gqa();  a.mla();      // which one, and the module itself
//
// One block type for both, so that models::Llama and models::LlamaMoE (and every trainer, pipeline
// and dry run built on them) take either attention from their configuration without another
// instantiation. Forward, backward, recomputation and the KV cache are the chosen module's, its
// collectives too; the saved state and weight context are a variant of the two modules'.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/latent_attention.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, class QkvStyle = Replicated<>, class OutStyle = Replicated<>,
          AttentionCore Core = LocalAttention>
class GqaOrMla {
 public:
  using Gqa = SelfAttention<T, Mesh, QkvStyle, OutStyle, Core>;
  using Mla = MultiHeadLatentAttention<T, Mesh, QkvStyle, OutStyle, Core>;
  using In = typename Gqa::In;
  using Out = typename Gqa::Out;
  static_assert(std::is_same_v<typename Mla::In, In> && std::is_same_v<typename Mla::Out, Out>,
                "nn::GqaOrMla: both attentions take and give the residual stream's layout");
  using Saved = std::variant<typename Gqa::Saved, typename Mla::Saved>;
  using WeightCtx = std::variant<typename Gqa::WeightCtx, typename Mla::WeightCtx>;
  /// GQA's cache (its k, v, split, length: what code written for nn::SelfAttention reads), and
  /// MLA's beside it; the module not chosen leaves its part empty.
  struct KvCache : Gqa::KvCache {
    typename Mla::KvCache mla;
  };
  /// GQA's (an MLA under context parallelism refuses forward_cached with an Error).
  static constexpr bool kv_cacheable = Gqa::kv_cacheable;

  GqaOrMla() = default;
  GqaOrMla(std::string name, const Mesh& mesh, AttentionConfig c, std::uint64_t seed, double init_std = 0.02,
           double out_std = 0.02) {
    if (c.mla.enabled()) mla_.emplace_back(std::move(name), mesh, c, seed, init_std, out_std);
    else gqa_.emplace_back(std::move(name), mesh, c, seed, init_std, out_std);
  }

  bool is_mla() const noexcept { return !mla_.empty(); }
  Gqa& gqa() { return gqa_.at(0); }
  Mla& mla() { return mla_.at(0); }
  /// GQA's fused qkv and out projections (an MLA has neither: std::out_of_range).
  typename Gqa::Qkv& qkv() { return gqa().qkv(); }
  typename Gqa::Proj& proj() { return gqa().proj(); }

  Fwd<Out, Saved> forward(const In& x) const { return forward_impl(x); }
  Fwd<Out, Saved> forward(In&& x) const { return forward_impl(std::move(x)); }

  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    if (is_mla()) {
      auto [dx, w] = mla_[0].backward_input(std::get<1>(std::move(s)), dy);
      return {std::move(dx), WeightCtx(std::in_place_index<1>, std::move(w))};
    }
    auto [dx, w] = gqa_.at(0).backward_input(std::get<0>(std::move(s)), dy);
    return {std::move(dx), WeightCtx(std::in_place_index<0>, std::move(w))};
  }
  void backward_weight(WeightCtx w) {
    if (is_mla()) mla_[0].backward_weight(std::get<1>(std::move(w)));
    else gqa_.at(0).backward_weight(std::get<0>(std::move(w)));
  }

  Out forward_cached(const In& x, KvCache& cache) const {
    if (is_mla()) return mla_[0].forward_cached(x, cache.mla);
    if constexpr (Gqa::kv_cacheable) return gqa_.at(0).forward_cached(x, static_cast<typename Gqa::KvCache&>(cache));
    else throw Error("nn::GqaOrMla::forward_cached", "this core keeps no KV cache", x.mesh().rank());
  }

  void set_recompute_core(bool on) {
    for (auto& a : gqa_) a.set_recompute_core(on);
    for (auto& a : mla_) a.set_recompute_core(on);
  }
  bool recompute_core() const { return is_mla() ? mla_[0].recompute_core() : gqa_.at(0).recompute_core(); }
  /// The chosen module's saved input (nn/block.hpp's norm recomputation).
  static In& saved_input(Saved& s) noexcept {
    return s.index() == 1 ? Mla::saved_input(std::get<1>(s)) : Gqa::saved_input(std::get<0>(s));
  }

  auto children() { return std::tie(gqa_, mla_); }  // one of them holds the module

 private:
  template <class X>
  Fwd<Out, Saved> forward_impl(X&& x) const {
    if (is_mla()) {
      auto [y, s] = mla_[0].forward(std::forward<X>(x));
      return {std::move(y), Saved(std::in_place_index<1>, std::move(s))};
    }
    auto [y, s] = gqa_.at(0).forward(std::forward<X>(x));
    return {std::move(y), Saved(std::in_place_index<0>, std::move(s))};
  }

  std::vector<Gqa> gqa_;  // 0 or 1 each: ranges, so the parameter walks see whichever there is
  std::vector<Mla> mla_;
};

}  // namespace dtensor::nn
