// dtensor/core/box.hpp — copying an n-dimensional box between row-major buffers.
//
// The machinery behind copy_box (core/tensor.hpp). Every pack and unpack of the redistribution executor is such a box copy. The box is reduced
// to the fewest dimensions (contiguous trailing dimensions merge into one run) and each 2-D
// slab goes to the memory space's pitched copy, so the host runs memcpy per row. A space that
// copies a whole box of slabs at once (Space::copy_slabs, a SlabCopySpace: the cuda space, one
// kernel launch) is given the box instead when it has more than one slab: a head-sliced box of a
// [B, T, H, D] activation is B x T slabs, and the cuda space issued one cudaMemcpy2DAsync per slab
// (2.4 million calls, 11 s of a GPT-2-sized run's host time on an H200, before this).
#pragma once

#include <concepts>
#include <cstddef>

#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor {


namespace detail {

/// A box as slabs: `outer` loop dimensions (outermost first; extents, and strides in bytes), each
/// slab `rows` rows of `run_bytes` bytes that start every src_pitch / dst_pitch bytes.
template <std::size_t R>
struct BoxSlabs {
  std::size_t outer = 0;
  Extent ext[R] = {}, src_stride[R] = {}, dst_stride[R] = {};
  std::size_t rows = 0, run_bytes = 0, src_pitch = 0, dst_pitch = 0;
};

/// A memory space that copies a box of slabs in one call; it returns false where it cannot (the
/// cuda space: when a pointer is host memory), and the slabs are then copied one by one.
template <class Space, std::size_t R>
concept SlabCopySpace = requires(void* dst, const void* src, const BoxSlabs<R>& box) {
  { Space::copy_slabs(dst, src, box) } -> std::same_as<bool>;
};

template <class Space, std::size_t R>
void copy_box_raw(const void* src, const Shape<R>& src_shape, const Shape<R>& src_off, void* dst,
                  const Shape<R>& dst_shape, const Shape<R>& dst_off, const Shape<R>& ext,
                  std::size_t elem_bytes) {
  for (Extent e : ext)
    if (e == 0) return;
  const Shape<R> ss = row_major_strides(src_shape), ds = row_major_strides(dst_shape);
  // Merge trailing dimensions while the box spans them fully in both tensors.
  std::size_t inner_dim = R - 1;  // first dimension of the contiguous run
  Extent run = ext[R - 1];
  while (inner_dim > 0 && ext[inner_dim] == src_shape[inner_dim] && ext[inner_dim] == dst_shape[inner_dim]) {
    --inner_dim;
    run *= ext[inner_dim];
  }
  const std::size_t run_bytes = std::size_t(run) * elem_bytes;
  auto* s0 = static_cast<const char*>(src);
  auto* d0 = static_cast<char*>(dst);
  Extent s_base = 0, d_base = 0;
  for (std::size_t i = 0; i < R; ++i) {
    s_base += src_off[i] * ss[i];
    d_base += dst_off[i] * ds[i];
  }
  if (inner_dim == 0) {
    Space::copy(d0 + d_base * elem_bytes, s0 + s_base * elem_bytes, run_bytes);
    return;
  }
  // Dimension inner_dim-1 becomes the rows of a pitched copy; the dimensions before it loop.
  const std::size_t row_dim = inner_dim - 1;
  const std::size_t rows = std::size_t(ext[row_dim]);
  const std::size_t s_pitch = std::size_t(ss[row_dim]) * elem_bytes, d_pitch = std::size_t(ds[row_dim]) * elem_bytes;
  if constexpr (SlabCopySpace<Space, R>) {
    if (row_dim > 0) {
      BoxSlabs<R> box;
      box.outer = row_dim;
      for (std::size_t i = 0; i < row_dim; ++i) {
        box.ext[i] = ext[i];
        box.src_stride[i] = ss[i] * Extent(elem_bytes);
        box.dst_stride[i] = ds[i] * Extent(elem_bytes);
      }
      box.rows = rows;
      box.run_bytes = run_bytes;
      box.src_pitch = s_pitch;
      box.dst_pitch = d_pitch;
      if (Space::copy_slabs(d0 + d_base * elem_bytes, s0 + s_base * elem_bytes, box)) return;
    }
  }
  Shape<R> idx{};
  for (;;) {
    Extent s = s_base, d = d_base;
    for (std::size_t i = 0; i < row_dim; ++i) {
      s += idx[i] * ss[i];
      d += idx[i] * ds[i];
    }
    Space::copy_2d(d0 + d * elem_bytes, d_pitch, s0 + s * elem_bytes, s_pitch, run_bytes, rows);
    std::size_t i = row_dim;
    while (i > 0) {
      --i;
      if (++idx[i] < ext[i]) break;
      idx[i] = 0;
      if (i == 0) return;
    }
    if (row_dim == 0) return;
  }
}

}  // namespace detail

}  // namespace dtensor
