// dtensor/kernels/meta/cast.hpp — the meta twin of kernels/host/cast.hpp: counts the bytes read and
// written (no FLOPs); kernels::cast_into checked the extents (kernels/generic/cast.hpp).
#pragma once

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

template <Element To, Element From, std::size_t R>
void cast_into(MetaTensor<To, R>& dst, const MetaTensor<From, R>& src) {
  detail::cost("cast_into", 0, detail::bytes<From>(src.numel()), detail::bytes<To>(dst.numel()));
}

}  // namespace dtensor::kernels::meta
