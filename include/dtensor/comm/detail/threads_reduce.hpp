// dtensor/comm/detail/threads_reduce.hpp — the one reduction loop of the threads backend.
//
//   const void* srcs[] = {a, b, c};
//   reduce(DType::float32, ReduceOp::avg, dst, srcs, 3, count);   // dst = (a + b + c) / 3
//
// reduce_scatter and all_reduce both end up here. Sources are combined strictly in rank order
// (reduce_pair(op, reduce_pair(op, s0, s1), s2)...) so every rank, and every run, computes
// bit-identical results, and a single-device oracle written with reduce_pair matches them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "dtensor/core/dtype.hpp"

namespace dtensor::threads::detail {

/// avg is a sum followed by one division by the group size (integer division for integers).
template <Element T>
constexpr T divide_by(T v, int n) {
  return T(v / T(n));
}

/// The elements of the block [base, base + m): accumulated in `acc`, then stored to dst (which may
/// alias any source). `op` and `m` are compile-time constants in full blocks, so that -O2
/// vectorizes their loops; the last, partial block takes both at run time: one loop per element
/// type for it, not one per type and operation.
template <Element T, class Op, class M>
void reduce_block(T* acc, T* dst, const void* const* srcs, int n, std::size_t base, Op op, M m) {
  std::memcpy(acc, static_cast<const T*>(srcs[0]) + base, m * sizeof(T));
  for (int r = 1; r < n; ++r) {
    const T* s = static_cast<const T*>(srcs[r]) + base;
    for (std::size_t i = 0; i < m; ++i) acc[i] = reduce_pair(ReduceOp(op), acc[i], s[i]);
  }
  if (ReduceOp(op) == ReduceOp::avg)
    for (std::size_t i = 0; i < m; ++i) acc[i] = divide_by(acc[i], n);
  std::memcpy(dst + base, acc, m * sizeof(T));
}

/// Elements per block: a block stays in L1 while all sources stream by.
template <Element T>
inline constexpr std::size_t reduce_block_size = 4096 / sizeof(T);

template <Element T, ReduceOp Op>
void reduce_full_blocks(T* acc, T* dst, const void* const* srcs, int n, std::size_t end) {
  constexpr std::size_t block = reduce_block_size<T>;
  for (std::size_t base = 0; base < end; base += block)
    reduce_block(acc, dst, srcs, n, base, std::integral_constant<ReduceOp, Op>{},
                 std::integral_constant<std::size_t, block>{});
}

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], for i < count.
/// dst may alias any source: each block is accumulated in a local buffer before it is stored.
template <Element T>
void reduce_as(ReduceOp op, void* dst, const void* const* srcs, int n, std::size_t count) {
  T* d = static_cast<T*>(dst);
  if (n == 1) {  // one rank (a 1-rank run's gradient all-reduce): its buffer is the result, exactly
    if (d != srcs[0]) std::memmove(d, srcs[0], count * sizeof(T));
    return;
  }
  constexpr std::size_t block = reduce_block_size<T>;
  T acc[block];
  const std::size_t full = count / block * block;
  switch (op) {
    case ReduceOp::sum:
      reduce_full_blocks<T, ReduceOp::sum>(acc, d, srcs, n, full);
      break;
    case ReduceOp::avg:
      reduce_full_blocks<T, ReduceOp::avg>(acc, d, srcs, n, full);
      break;
    case ReduceOp::max:
      reduce_full_blocks<T, ReduceOp::max>(acc, d, srcs, n, full);
      break;
    case ReduceOp::min:
      reduce_full_blocks<T, ReduceOp::min>(acc, d, srcs, n, full);
      break;
  }
  if (full < count) reduce_block(acc, d, srcs, n, full, op, count - full);
}

/// Untyped entry point: the communicator only knows the DType at run time.
inline void reduce(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, std::size_t count) {
  switch (t) {
    case DType::float32: return reduce_as<float>(op, dst, srcs, n, count);
    case DType::float64: return reduce_as<double>(op, dst, srcs, n, count);
    case DType::bfloat16: return reduce_as<bfloat16>(op, dst, srcs, n, count);
    case DType::int32: return reduce_as<std::int32_t>(op, dst, srcs, n, count);
    case DType::int64: return reduce_as<std::int64_t>(op, dst, srcs, n, count);
    case DType::uint8: return reduce_as<std::uint8_t>(op, dst, srcs, n, count);
  }
}

}  // namespace dtensor::threads::detail
