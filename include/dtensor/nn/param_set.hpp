// dtensor/nn/param_set.hpp — every parameter of a model, whatever mesh each lives on: one list
// per mesh, each with its mesh, as one object.
//
//   nn::ParamList<float, 2> dense;  model.collect(dense);                   // on the model's mesh
//   auto all = nn::param_set(nn::on(mesh, dense), nn::on(emesh, experts));  // or nn::parameter_set(model): nn/param_groups.hpp
//   auto opt = optim::make_adamw(all, {...});          // one optimizer (optim/param_set.hpp)
//   optim::clip_grad_norm(all, 1.0);                   // one norm over every list
//   all.zero_grad();
//
// A ParamList holds parameters of one mesh rank (their placements are LayoutDesc<N>); a model
// over two meshes (an MoE: the dense parameters on (dp, tp), the experts on (edp, ep, tp)) has
// two. A ParamSet keeps them side by side with their meshes, so that an optimizer, a clip, a
// gradient sync or a checkpoint takes "all the parameters" and needs no case for the second
// mesh. The lists are held by value (ParamRefs are views: copying a list copies no parameter).
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/nn/parameter.hpp"

namespace dtensor::nn {

namespace detail {
template <class Ref>
struct param_rank;
template <class T, std::size_t N, class Space>
struct param_rank<ParamRef<T, N, Space>> : std::integral_constant<std::size_t, N> {};
}  // namespace detail

/// One parameter list and the mesh its parameters live on.
template <class List, MeshType Mesh>
struct MeshParams {
  static_assert(std::is_same_v<typename List::value_type::space, mesh_space_t<Mesh>> &&
                    detail::param_rank<typename List::value_type>::value == Mesh::ndim,
                "nn::MeshParams: the list's parameters must live on the mesh (same memory space and rank)");
  using list_type = List;
  using mesh_type = Mesh;
  Mesh mesh;
  List params;
};

template <MeshType Mesh, class List>
MeshParams<std::remove_cvref_t<List>, Mesh> on(const Mesh& mesh, List&& params) {
  return {mesh, std::forward<List>(params)};
}

/// Parameter lists on several meshes, as one (see the top of this file).
template <class... Parts>
class ParamSet {
 public:
  static constexpr std::size_t lists = sizeof...(Parts);

  ParamSet() = default;
  explicit ParamSet(Parts... parts) : parts_(std::move(parts)...) {}

  /// f(list, mesh) for each list, in order.
  template <class F>
  void for_each(F&& f) {
    std::apply([&](auto&... p) { (f(p.params, p.mesh), ...); }, parts_);
  }
  template <class F>
  void for_each(F&& f) const {
    std::apply([&](const auto&... p) { (f(p.params, p.mesh), ...); }, parts_);
  }

  template <std::size_t I>
  auto& list() noexcept {
    return std::get<I>(parts_).params;
  }
  template <std::size_t I>
  const auto& mesh() const noexcept {
    return std::get<I>(parts_).mesh;
  }
  /// How many parameters, over every list.
  std::size_t size() const {
    std::size_t n = 0;
    for_each([&](const auto& l, const auto&) { n += l.size(); });
    return n;
  }
  /// Zeroes every gradient, nothing pending.
  void zero_grad() {
    for_each([](auto& l, const auto&) {
      for (auto& p : l) p.zero_grad();
    });
  }

 private:
  std::tuple<Parts...> parts_;
};

template <class... Parts>
ParamSet<Parts...> param_set(Parts... parts) {
  return ParamSet<Parts...>(std::move(parts)...);
}

}  // namespace dtensor::nn
