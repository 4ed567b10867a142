// dtensor/ops/common.hpp — what every op shares: the DTensor concepts, the compile-time rule
// check with its diagnostic, run-time argument checks, and building the output DTensor.
//
//   template <FloatDTensor X> auto gelu(const X& x);       // a DTensor of floats in any memory space
//   detail::require_rule<"matmul", rules::Matmul{...}, Mesh, LA, LB>();   // no rule: compile error
//   detail::check(ok, "matmul", x.mesh(), "a ", to_string(a.shape()), ...);  // dtensor::Error with the rank
//   detail::make<T, R, L>(x.mesh(), global, std::move(local));            // the output DTensor
//
// No op communicates: an op is its rule (ops/rules.hpp) and local kernels on this rank's piece.
// Ops are generic over the memory space of their operands: each calls kernels::name(...), and
// the tensors' space picks kernels/host, kernels/cuda or kernels/meta (kernels/dispatch.hpp).
// Operands of one op must share their space: otherwise mixed_memory_spaces<A, B> names both in
// the compiler's diagnostic. Reductions that need a global statistic (loss-parallel cross-entropy, the
// max of a split softmax row) are not ops but parallel/ building blocks.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dtensor/core/error.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/mesh/fixed_string.hpp"
#include "dtensor/ops/rules.hpp"

namespace dtensor::ops {

/// A DTensor in any memory space.
template <class X>
concept AnyDTensor = is_dtensor_v<X>;

/// A DTensor whose pieces live in host memory.
template <class X>
concept HostDTensor = is_dtensor_v<X> && std::is_same_v<typename X::space, host_space>;

/// A DTensor of a floating-point element type (float, double, bfloat16), in any memory space.
template <class X>
concept FloatDTensor = AnyDTensor<X> && kernels::host::FloatElement<typename X::value_type>;

/// A DTensor of integer ids (int32, int64): embedding ids, cross-entropy targets.
template <class X>
concept IndexDTensor = AnyDTensor<X> && kernels::host::IndexElement<typename X::value_type>;

/// The DTensor of element T, rank R and layout L on X's mesh, in X's memory space.
template <class X, LayoutType L, std::size_t R = X::rank, class T = typename X::value_type>
using dtensor_t = DTensor<T, R, typename X::mesh_type, L, typename X::space>;

namespace detail {

using kernels::host::detail::leading_rows;

// ---------------------------------------------------------------- the compile-time diagnostic

/// A compile-time message, printed by the compiler as the template argument of
/// no_sharding_rule<...> (a static_assert message must be a literal in C++20).
struct Msg {
  char text[320]{};
  std::size_t size = 0;
  constexpr Msg& operator<<(std::string_view s) {
    for (char c : s)
      if (size + 1 < sizeof(text)) text[size++] = c;
    return *this;
  }
  constexpr Msg& operator<<(int v) {
    char buf[12]{};
    int n = 0;
    const bool neg = v < 0;
    unsigned u = neg ? unsigned(-v) : unsigned(v);
    do buf[n++] = char('0' + u % 10), u /= 10;
    while (u);
    if (neg) *this << "-";
    while (n) *this << std::string_view(&buf[--n], 1);
    return *this;
  }
};

constexpr Msg& operator<<(Msg& m, const PlacementDesc& p) {
  switch (p.kind) {
    case PlacementKind::replicate: return m << "Replicate";
    case PlacementKind::shard: return m << "Shard<" << p.dim << ">";
    case PlacementKind::partial: return m << "Partial<" << name_of(p.op) << ">";
  }
  return m;
}

template <class T>
inline constexpr bool dependent_false = false;

/// Instantiated only when an op has no rule for its operands' layouts; the compiler prints M.
template <Msg M>
struct no_sharding_rule {
  static_assert(dependent_false<decltype(M)>,
                "this op has no sharding rule for its operands' layouts: the message in no_sharding_rule<...> above "
                "names the op, the placements and the mesh dimension");
  static constexpr bool value = false;
};

template <class Mesh>
constexpr std::string_view mesh_dim_name(std::size_t i) {
  if constexpr (requires { Mesh::names; }) return Mesh::names[i];
  else return "?";
}

template <fixed_string Op, fixed_string Hint, class Mesh, std::size_t N, std::size_t K>
constexpr Msg rule_message(const rules::Outcome<N>& o, const std::array<LayoutDesc<N>, K>& in) {
  Msg m;
  const int i = o.ok ? o.order_dim : o.failed_dim;
  m << Op.view();
  if (!o.ok) {
    m << " has no rule for (";
    for (std::size_t j = 0; j < K; ++j) {
      if (j) m << ", ";
      m << in[j].placements[std::size_t(i)];
    }
    m << ")";
  } else {
    m << ": the operands split a tensor dimension in different orders (Layout<...>::ordered)";
  }
  m << " on mesh dimension " << i << " (" << mesh_dim_name<Mesh>(std::size_t(i)) << "): " << Hint.view();
  return m;
}

/// Compiles only when Rule has a rule for layouts L... on every mesh dimension of Mesh.
template <fixed_string Op, auto Rule, class Mesh, LayoutType... L>
constexpr bool require_rule() {
  static_assert(((L::mesh_ndim == Mesh::ndim) && ...), "every operand needs one placement per mesh dimension");
  constexpr auto o = rules::outcome<Rule, L...>;
  if constexpr (!o.ok || !o.order_ok) {
    constexpr std::array<LayoutDesc<Mesh::ndim>, sizeof...(L)> in{L::desc...};
    if constexpr (!o.ok)
      return no_sharding_rule<rule_message<Op, "redistribute one operand first", Mesh>(o, in)>::value;
    else
      return no_sharding_rule<rule_message<Op, "redistribute one of them first", Mesh>(o, in)>::value;
  }
  return true;
}

/// As require_rule, with an op-specific hint ("softmax reduces over the last dimension ...").
template <fixed_string Op, fixed_string Hint, auto Rule, class Mesh, LayoutType... L>
constexpr bool require_rule_hint() {
  constexpr auto o = rules::outcome<Rule, L...>;
  if constexpr (!o.ok || !o.order_ok) {
    constexpr std::array<LayoutDesc<Mesh::ndim>, sizeof...(L)> in{L::desc...};
    return no_sharding_rule<rule_message<Op, Hint, Mesh>(o, in)>::value;
  }
  return true;
}

/// Instantiated only when two operands of one op live in different memory spaces; the compiler
/// prints both (e.g. mixed_memory_spaces<dtensor::host_space, dtensor::meta_space>).
template <class SpaceA, class SpaceB>
struct mixed_memory_spaces {
  static_assert(dependent_false<SpaceA>,
                "the operands of an op live in different memory spaces (named in mixed_memory_spaces<...> above): "
                "copy one with to_space first");
  static constexpr bool value = false;
};

/// Instantiates mixed_memory_spaces only for an operand whose space differs from X's.
template <class X, class... Y>
constexpr bool require_same_space() {
  return (std::conditional_t<std::is_same_v<typename X::space, typename Y::space>, std::true_type,
                             mixed_memory_spaces<typename X::space, typename Y::space>>::value &&
          ...);
}

/// Operands of one op must live on one mesh (type and, at run time, shape and coordinate) and in
/// one memory space.
template <class X, class... Y>
constexpr void require_same_mesh_type() {
  static_assert((std::is_same_v<typename X::mesh_type, typename Y::mesh_type> && ...),
                "the operands of an op must live on the same mesh type: move one across first (distributed/transfer.hpp)");
  require_same_space<X, Y...>();
}

// ---------------------------------------------------------------- run-time checks

/// detail::check(ok, op, mesh, parts...): dtensor::Error naming the op and this mesh's rank
/// (core/error.hpp).
using dtensor::detail::check;

/// The meshes of an op's operands (x's and `others`) agree. On the mesh type only: one body for
/// every list of operand types (check_same_mesh below is a call).
template <class Mesh>
void check_meshes_agree(const char* op, const Mesh& x, std::initializer_list<const Mesh*> others) {
  bool same = true;
  for (const Mesh* y : others) same = same && x.shape() == y->shape() && x.coordinate() == y->coordinate();
  check(same, op, x, "operands live on different meshes (shapes ", to_string(x.shape()), " ...)");
}

template <class X, class... Y>
void check_same_mesh(const char* op, const X& x, const Y&... y) {
  check_meshes_agree(op, x.mesh(), {&y.mesh()...});
}

/// The output DTensor; its constructor checks the piece against the layout (an internal
/// consistency check of the rule and the local computation).
template <class T, std::size_t R, LayoutType L, class Mesh, class Space>
DTensor<T, R, Mesh, L, Space> make(const Mesh& mesh, const Shape<R>& global, Tensor<T, R, Space> local) {
  return DTensor<T, R, Mesh, L, Space>(mesh, global, std::move(local));
}

/// A tensor of space S filled with value (a device space fills on the device; meta does nothing).
template <class T, std::size_t R, class S>
Tensor<T, R, S> filled(const Shape<R>& shape, T value) {
  auto t = Tensor<T, R, S>::uninitialized(shape);
  S::fill(t.data(), std::size_t(t.numel()), value);
  return t;
}

/// The elements of t where the host can read them: t itself on host, a copy from a device, and
/// nothing (std::nullopt) on meta, which has no values to check.
template <class T, std::size_t R, class S>
auto readable(const Tensor<T, R, S>& t) {
  if constexpr (std::is_same_v<S, host_space>) return std::optional<std::reference_wrapper<const Tensor<T, R>>>(t);
  else if constexpr (!holds_data_v<S>) return std::optional<Tensor<T, R>>();
  else return std::optional<Tensor<T, R>>(to_space<host_space>(t));
}

/// Whether mesh dimension i of layout L shards any tensor dimension in `dims` (a bit mask).
template <LayoutType L>
constexpr bool shards_any(unsigned dims) {
  for (const auto& p : L::desc.placements)
    if (p.is_shard() && (dims >> unsigned(p.dim)) & 1u) return true;
  return false;
}

}  // namespace detail
}  // namespace dtensor::ops
