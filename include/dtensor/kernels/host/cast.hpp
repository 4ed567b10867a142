// dtensor/kernels/host/cast.hpp — element type conversion between two tensors of one extent.
//
//   cast_into(master_fp32, params_bf16);   // dst[i] = To(src[i]), through double
//
// What mixed precision needs (parallel/fully_shard.hpp: bf16 parameters from fp32 master values,
// fp32 gradient shards from bf16 gradients). Converting through double makes every pair of
// element types exact where the target can hold the value, and rounds once where it cannot.
// float <-> bfloat16, the pair of a bf16 step (7 % of it as a plain loop through double), runs
// vectorized (simd.hpp) without the double: float -> double is exact, so the values are the same.
#pragma once

#include <type_traits>

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/simd.hpp"

namespace dtensor::kernels::host {

template <Element To, Element From, std::size_t R>
void cast_into(HostTensor<To, R>& dst, const HostTensor<From, R>& src) {
  To* out = dst.data();
  const From* in = src.data();
  const Extent n = src.numel();
  if constexpr (detail::float_rows<To> && detail::float_rows<From> && !std::is_same_v<To, From>) {
    detail::with_isa([&](auto) DTENSOR_SIMD_BODY {
      for (Extent i = 0; i < n; ++i) out[i] = To(float(in[i]));
    });
  } else {
    for (Extent i = 0; i < n; ++i) out[i] = static_cast<To>(static_cast<double>(in[i]));
  }
}

}  // namespace dtensor::kernels::host
