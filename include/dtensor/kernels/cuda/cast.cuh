// dtensor/kernels/cuda/cast.cuh — the twin of kernels/host/cast.hpp on CudaTensor (through
// double, as the host does, so both give the same values).
#pragma once

#include "dtensor/kernels/cuda/common.cuh"

namespace dtensor::kernels::cuda {

namespace detail {
template <class To, class From>
__global__ void cast_kernel(To* out, const From* in, Extent n) {
  for (Extent i = gidx(); i < n; i += gstride()) out[i] = static_cast<To>(static_cast<double>(in[i]));
}
}  // namespace detail

template <Element To, Element From, std::size_t R>
void cast_into(CudaTensor<To, R>& dst, const CudaTensor<From, R>& src) {
  if (src.numel() == 0) return;
  detail::cast_kernel<<<detail::grid_for(src.numel()), detail::block, 0, detail::stream()>>>(dst.data(), src.data(),
                                                                                             src.numel());
  detail::launched("cast_kernel");
}

}  // namespace dtensor::kernels::cuda
