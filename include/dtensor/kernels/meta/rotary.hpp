// dtensor/kernels/meta/rotary.hpp — the meta twin of kernels/host/rotary.hpp: rotary and
// rotary_backward count 6 FLOPs per element pair turned (4 multiplies, 2
// adds; the cos/sin tables, B*T*D/2 of each, are counted as 2 more per pair and position).
#pragma once

#include "dtensor/core/rope.hpp"
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

inline constexpr std::int64_t rotary_flops_per_element = 3;  // 6 per pair of elements

namespace detail {
template <class T, class Id>
MetaTensor<T, 4> rotate(const char* op, const MetaTensor<T, 4>& x, const MetaTensor<Id, 2>& positions, const Rope& /*rope*/) {
  const Extent tables = positions.numel() * (x.extent(3) / 2);
  cost(op, rotary_flops_per_element * x.numel() + 2 * tables, bytes<T>(x.numel()) + bytes<Id>(positions.numel()),
       bytes<T>(x.numel()));
  return result<T>(x.shape());
}
}  // namespace detail

template <FloatElement T, IndexElement Id>
MetaTensor<T, 4> rotary(const MetaTensor<T, 4>& x, const MetaTensor<Id, 2>& positions, const Rope& rope) {
  return detail::rotate("rotary", x, positions, rope);
}
template <FloatElement T, IndexElement Id>
MetaTensor<T, 4> rotary_backward(const MetaTensor<Id, 2>& positions, const MetaTensor<T, 4>& dy, const Rope& rope) {
  return detail::rotate("rotary_backward", dy, positions, rope);
}

}  // namespace dtensor::kernels::meta
