// dtensor/kernels/host/rotary.hpp — rotary position embeddings (RoPE) of [B, T, H, D] pieces.
//
//   auto y  = rotary(x, positions, 500000.0);            // x [B, T, H, D], positions [B, T] (global indices)
//   auto dx = rotary_backward(positions, dy, 500000.0);  // the adjoint: the rotation by minus the angle
//
// Pairs (i, i + D/2) of each head's features (GPT-NeoX / Hugging Face "rotate half" layout) turn
// by the angle position * theta^(-2i/D), i in [0, D/2): y_i = x_i cos - x_{i+D/2} sin,
// y_{i+D/2} = x_{i+D/2} cos + x_i sin. The positions are inputs, not the local row index, so a
// piece of the sequence (sequence or context parallelism, load-balanced order) turns by its
// global positions. The angle is computed in double from the integer position, so every rank
// (and the CUDA twin) turns a position by the same angle wherever the position lies. The third
// argument is a Rope (core/rope.hpp): a base theta (a double converts) and optionally Llama 3.1's
// frequency remap (rope_type "llama3"), applied to theta^(-2i/D) as that header says.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "dtensor/core/rope.hpp"
#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::host {

namespace detail {

/// The angle per position of feature pair `pair` (of half_dim): theta^(-pair/half_dim), remapped
/// by llama3 scaling when it is on (core/rope.hpp gives the formula, transformers' own).
DTENSOR_HOST_DEVICE inline double rotary_inv_freq(const Rope& rope, Extent pair, Extent half_dim) {
  const double f = ::pow(rope.theta, -double(pair) / double(half_dim));
  const RopeScaling& s = rope.scaling;
  if (s.factor == 0) return f;  // scaling off
  const double wavelen = 2 * 3.14159265358979323846 / f;
  if (wavelen < s.original_max_position / s.high_freq_factor) return f;
  if (wavelen > s.original_max_position / s.low_freq_factor) return f / s.factor;
  const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * f / s.factor + smooth * f;
}

/// The angle of feature pair `pair` (of half_dim) at `position`.
DTENSOR_HOST_DEVICE inline double rotary_angle(double position, Extent pair, Extent half_dim, const Rope& rope) {
  return position * rotary_inv_freq(rope, pair, half_dim);
}

/// y = x turned by sign * angle (sign -1: the adjoint).
template <class T, class Id>
HostTensor<T, 4> rotate(const HostTensor<T, 4>& x, const HostTensor<Id, 2>& positions, const Rope& rope, double sign) {
  using C = compute_t<T>;
  const Extent batch = x.extent(0), len = x.extent(1), heads = x.extent(2), half = x.extent(3) / 2;
  auto y = HostTensor<T, 4>::uninitialized(x.shape());
  std::vector<C> cos_table(static_cast<std::size_t>(half)), sin_table(static_cast<std::size_t>(half));
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (Extent i = 0; i < half; ++i) inv_freq[std::size_t(i)] = rotary_inv_freq(rope, i, half);
  for (Extent b = 0; b < batch; ++b)
    for (Extent t = 0; t < len; ++t) {
      const double position = double(positions(b, t));
      for (Extent i = 0; i < half; ++i) {
        const double angle = sign * position * inv_freq[std::size_t(i)];
        cos_table[std::size_t(i)] = C(std::cos(angle));
        sin_table[std::size_t(i)] = C(std::sin(angle));
      }
      for (Extent h = 0; h < heads; ++h) {
        const T* in = &x(b, t, h, 0);
        T* out = &y(b, t, h, 0);
        for (Extent i = 0; i < half; ++i) {
          const C lo = C(in[i]), hi = C(in[i + half]), c = cos_table[std::size_t(i)], s = sin_table[std::size_t(i)];
          out[i] = T(lo * c - hi * s);
          out[i + half] = T(hi * c + lo * s);
        }
      }
    }
  return y;
}

}  // namespace detail

template <FloatElement T, IndexElement Id>
HostTensor<T, 4> rotary(const HostTensor<T, 4>& x, const HostTensor<Id, 2>& positions, const Rope& rope) {
  return detail::rotate(x, positions, rope, 1.0);
}

/// dx of rotary given dy: the transpose of a rotation is the rotation by the opposite angle.
template <FloatElement T, IndexElement Id>
HostTensor<T, 4> rotary_backward(const HostTensor<Id, 2>& positions, const HostTensor<T, 4>& dy, const Rope& rope) {
  return detail::rotate(dy, positions, rope, -1.0);
}

}  // namespace dtensor::kernels::host
