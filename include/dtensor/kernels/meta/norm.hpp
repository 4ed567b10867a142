// dtensor/kernels/meta/norm.hpp — the meta twin of kernels/host/norm.hpp: layer_norm, rms_norm and
// their backwards. FLOPs per element: layer_norm 7 forward (mean, centre, square, sum, scale,
// weight, bias) and 9 backward; rms_norm 4 forward and 7 backward.
#pragma once

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

inline constexpr std::int64_t layer_norm_flops_per_element = 7, layer_norm_backward_flops_per_element = 9;
inline constexpr std::int64_t rms_norm_flops_per_element = 4, rms_norm_backward_flops_per_element = 7;

template <class T, std::size_t R>
struct NormForward {
  MetaTensor<T, R> y;
  MetaTensor<Stat, 1> mean;  // [rows]; empty for RMSNorm
  MetaTensor<Stat, 1> rstd;  // [rows]
};

template <class T, std::size_t R>
struct NormBackward {
  MetaTensor<T, R> dx;
  MetaTensor<T, 1> dweight;
  MetaTensor<T, 1> dbias;  // empty for RMSNorm
};

namespace detail {

template <class T, std::size_t R>
NormForward<T, R> norm_forward(const char* op, const MetaTensor<T, R>& x, const MetaTensor<T, 1>& /*w*/,
                               const MetaTensor<T, 1>* b, std::int64_t flops_per_element) {
  const Extent rows = leading_rows(x.shape()), n = x.extent(R - 1);
  cost(op, flops_per_element * x.numel(), bytes<T>(x.numel() + (b ? 2 : 1) * n),
       bytes<T>(x.numel()) + (b ? 2 : 1) * bytes<Stat>(rows));
  return {result<T>(x.shape()), b ? result<Stat>(Shape<1>{rows}) : MetaTensor<Stat, 1>{},
          result<Stat>(Shape<1>{rows})};
}
template <class T, std::size_t R>
NormBackward<T, R> norm_backward(const char* op, const MetaTensor<T, R>& x, const MetaTensor<T, 1>& /*w*/,
                                 const MetaTensor<Stat, 1>* mean, const MetaTensor<Stat, 1>& /*rstd*/,
                                 const MetaTensor<T, R>& /*dy*/, std::int64_t flops_per_element) {
  const Extent rows = leading_rows(x.shape()), n = x.extent(R - 1);
  cost(op, flops_per_element * x.numel(), bytes<T>(2 * x.numel() + n) + (mean ? 2 : 1) * bytes<Stat>(rows),
       bytes<T>(x.numel() + (mean ? 2 : 1) * n));
  return {result<T>(x.shape()), result<T>(Shape<1>{n}), mean ? result<T>(Shape<1>{n}) : MetaTensor<T, 1>{}};
}
}  // namespace detail

template <FloatElement T, std::size_t R>
NormForward<T, R> layer_norm(const MetaTensor<T, R>& x, const MetaTensor<T, 1>& weight, const MetaTensor<T, 1>& bias,
                             double = 1e-5) {
  return detail::norm_forward("layer_norm", x, weight, &bias, layer_norm_flops_per_element);
}
template <FloatElement T, std::size_t R>
NormBackward<T, R> layer_norm_backward(const MetaTensor<T, R>& x, const MetaTensor<T, 1>& weight,
                                       const MetaTensor<Stat, 1>& mean, const MetaTensor<Stat, 1>& rstd,
                                       const MetaTensor<T, R>& dy) {
  return detail::norm_backward("layer_norm_backward", x, weight, &mean, rstd, dy, layer_norm_backward_flops_per_element);
}
template <FloatElement T, std::size_t R>
NormForward<T, R> rms_norm(const MetaTensor<T, R>& x, const MetaTensor<T, 1>& weight, double = 1e-6) {
  return detail::norm_forward<T, R>("rms_norm", x, weight, nullptr, rms_norm_flops_per_element);
}
template <FloatElement T, std::size_t R>
NormBackward<T, R> rms_norm_backward(const MetaTensor<T, R>& x, const MetaTensor<T, 1>& weight,
                                     const MetaTensor<Stat, 1>& rstd, const MetaTensor<T, R>& dy) {
  return detail::norm_backward<T, R>("rms_norm_backward", x, weight, nullptr, rstd, dy,
                                     rms_norm_backward_flops_per_element);
}

}  // namespace dtensor::kernels::meta
