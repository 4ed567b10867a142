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

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], for i < count.
/// dst may alias any source: each block is accumulated in a local buffer before it is stored.
template <Element T, ReduceOp Op>
void reduce_typed(T* dst, const void* const* srcs, int n, std::size_t count) {
  if (n == 1) {  // one rank (a 1-rank run's gradient all-reduce): its buffer is the result, exactly
    if (dst != srcs[0]) std::memmove(dst, srcs[0], count * sizeof(T));
    return;
  }
  constexpr std::size_t block = 4096 / sizeof(T);  // stays in L1 while all sources stream by
  T acc[block];
  // `m` is a compile-time constant for full blocks, so that -O2 vectorizes their loops.
  auto one_block = [&](std::size_t base, auto m) {
    std::memcpy(acc, static_cast<const T*>(srcs[0]) + base, m * sizeof(T));
    for (int r = 1; r < n; ++r) {
      const T* s = static_cast<const T*>(srcs[r]) + base;
      for (std::size_t i = 0; i < m; ++i) acc[i] = reduce_pair(Op, acc[i], s[i]);
    }
    if constexpr (Op == ReduceOp::avg)
      for (std::size_t i = 0; i < m; ++i) acc[i] = divide_by(acc[i], n);
    std::memcpy(dst + base, acc, m * sizeof(T));
  };
  std::size_t base = 0;
  for (; base + block <= count; base += block) one_block(base, std::integral_constant<std::size_t, block>{});
  if (base < count) one_block(base, count - base);
}

template <Element T>
void reduce_as(ReduceOp op, void* dst, const void* const* srcs, int n, std::size_t count) {
  T* d = static_cast<T*>(dst);
  switch (op) {
    case ReduceOp::sum: return reduce_typed<T, ReduceOp::sum>(d, srcs, n, count);
    case ReduceOp::avg: return reduce_typed<T, ReduceOp::avg>(d, srcs, n, count);
    case ReduceOp::max: return reduce_typed<T, ReduceOp::max>(d, srcs, n, count);
    case ReduceOp::min: return reduce_typed<T, ReduceOp::min>(d, srcs, n, count);
  }
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
