// dtensor/ops/common.hpp — what every op shares: the DTensor concepts, the compile-time rule
// check with its diagnostic, run-time argument checks, and building the output DTensor.
//
//   template <HostDTensor X> auto gelu(const X& x);        // a DTensor in host memory
//   detail::require_rule<"matmul", rules::Matmul{...}, Mesh, LA, LB>();   // no rule: compile error
//   detail::check(ok, "matmul", x.mesh(), "a ", to_string(a.shape()), ...);  // dtensor::Error with the rank
//   detail::make<T, R, L>(x.mesh(), global, std::move(local));            // the output DTensor
//
// No op communicates: an op is its rule (ops/rules.hpp) and local kernels (kernels/host) on
// this rank's piece. Reductions that need a global statistic (loss-parallel cross-entropy, the
// max of a split softmax row) are not ops but parallel/ building blocks.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dtensor/core/error.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/mesh/fixed_string.hpp"
#include "dtensor/ops/rules.hpp"

namespace dtensor::ops {

/// A DTensor whose pieces live in host memory (the ops run the host kernels on them).
template <class X>
concept HostDTensor = is_dtensor_v<X> && std::is_same_v<typename X::space, host_space>;

/// A host DTensor of a floating-point element type (float, double, bfloat16).
template <class X>
concept FloatDTensor = HostDTensor<X> && kernels::host::FloatElement<typename X::value_type>;

/// A host DTensor of integer ids (int32, int64): embedding ids, cross-entropy targets.
template <class X>
concept IndexDTensor = HostDTensor<X> && kernels::host::IndexElement<typename X::value_type>;

/// The DTensor of element T, rank R and layout L on X's mesh.
template <class X, LayoutType L, std::size_t R = X::rank, class T = typename X::value_type>
using dtensor_t = DTensor<T, R, typename X::mesh_type, L, host_space>;

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

/// Operands of one op must live on one mesh (type and, at run time, shape and coordinate).
template <class X, class... Y>
constexpr void require_same_mesh_type() {
  static_assert((std::is_same_v<typename X::mesh_type, typename Y::mesh_type> && ...),
                "the operands of an op must live on the same mesh type: move one across first (distributed/transfer.hpp)");
}

// ---------------------------------------------------------------- run-time checks

/// detail::check(ok, op, mesh, parts...): dtensor::Error naming the op and this mesh's rank
/// (core/error.hpp).
using dtensor::detail::check;

template <class X, class... Y>
void check_same_mesh(const char* op, const X& x, const Y&... y) {
  const bool same = ((x.mesh().shape() == y.mesh().shape() && x.mesh().coordinate() == y.mesh().coordinate()) && ...);
  check(same, op, x.mesh(), "operands live on different meshes (shapes ", to_string(x.mesh().shape()), " ...)");
}

/// The output DTensor; its constructor checks the piece against the layout (an internal
/// consistency check of the rule and the local computation).
template <class T, std::size_t R, LayoutType L, class Mesh>
DTensor<T, R, Mesh, L, host_space> make(const Mesh& mesh, const Shape<R>& global, Tensor<T, R, host_space> local) {
  return DTensor<T, R, Mesh, L, host_space>(mesh, global, std::move(local));
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
