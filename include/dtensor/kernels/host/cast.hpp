// dtensor/kernels/host/cast.hpp — element type conversion between two tensors of one extent.
//
//   cast_into(master_fp32, params_bf16);   // dst[i] = To(src[i]), through double
//
// What mixed precision needs (parallel/fully_shard.hpp: bf16 parameters from fp32 master values,
// fp32 gradient shards from bf16 gradients). Converting through double makes every pair of
// element types exact where the target can hold the value, and rounds once where it cannot.
#pragma once

#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::host {

template <Element To, Element From, std::size_t R>
void cast_into(HostTensor<To, R>& dst, const HostTensor<From, R>& src) {
  To* out = dst.data();
  const From* in = src.data();
  for (Extent i = 0, n = src.numel(); i < n; ++i) out[i] = static_cast<To>(static_cast<double>(in[i]));
}

}  // namespace dtensor::kernels::host
