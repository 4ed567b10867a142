// dtensor/kernels/cuda/column_sums.cuh — sums down the columns of a [rows, n] matrix, parallel
// over rows as well as columns, in double and deterministic.
//
// A bias gradient or a norm's weight gradient sums a [B*T, n] activation over its rows. One
// thread per column (n of them: 3 blocks for n = 768) left the GPU idle: on an H200 the GPT-2-sized
// step spent ~2 ms in each such call. Here pass 1 cuts the rows into runs, a thread summing one
// column over one run in row order (a grid of column blocks x runs); pass 2 adds the runs' sums,
// a warp per column in a fixed order. The run length depends only on the shape, so the order of
// the additions, and the result, are the same run to run.
#pragma once

#include <algorithm>
#include <cstddef>

#include "dtensor/kernels/cuda/common.cuh"

namespace dtensor::kernels::cuda::detail {

/// K sums of one column.
template <int K>
struct ColumnSums {
  Stat v[K];
};

template <int K, class Term>
__global__ void column_runs_kernel(Stat* partial, Extent rows, Extent n, Extent run, Term term) {
  const Extent j = Extent(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const Extent r0 = Extent(blockIdx.y) * run, r1 = r0 + run < rows ? r0 + run : rows;
  Stat acc[K] = {};
  for (Extent r = r0; r < r1; ++r) {
    const ColumnSums<K> t = term(r, j);
    for (int k = 0; k < K; ++k) acc[k] += t.v[k];
  }
  for (int k = 0; k < K; ++k) partial[(Extent(blockIdx.y) * K + k) * n + j] = acc[k];
}

/// Pass 2: a warp per column, lane l adding runs l, l + 32, ... in order, then the lanes' sums
/// by a fixed butterfly (deterministic: the order depends on the shape only). One thread per
/// column adding ~340 runs in a row took ~100 us per GPT-2-sized norm gradient on an H200.
inline constexpr int finish_lanes = 32;
template <int K, class Finish>
__global__ void column_finish_kernel(const Stat* partial, Extent runs, Extent n, Finish finish) {
  const int lane = int(threadIdx.x % finish_lanes);
  const Extent j = (Extent(blockIdx.x) * blockDim.x + threadIdx.x) / finish_lanes;
  if (j >= n) return;  // the whole warp: its lanes share j
  ColumnSums<K> s{};
  for (Extent c = lane; c < runs; c += finish_lanes)
    for (int k = 0; k < K; ++k) s.v[k] += partial[(c * K + k) * n + j];
  for (int k = 0; k < K; ++k)
    for (int o = finish_lanes / 2; o > 0; o /= 2) s.v[k] += __shfl_xor_sync(0xffffffffu, s.v[k], o);
  if (lane == 0) finish(j, s);
}

/// For each column j < n: finish(j, sums), where sums.v[k] = sum over r < rows of term(r, j).v[k].
/// Term and Finish are device-callable function objects (structs with a __device__ operator()).
template <int K, class Term, class Finish>
void column_sums(Extent rows, Extent n, Term term, Finish finish, const char* kernel) {
  if (n == 0) return;
  const Extent column_blocks = (n + Extent(block) - 1) / Extent(block);
  // About 1024 blocks in pass 1, runs of at least 32 rows (fewer, longer runs for narrow matrices).
  const Extent want = std::max<Extent>(1, std::min<Extent>(1024 / column_blocks, (rows + 31) / 32));
  const Extent run = rows == 0 ? 1 : (rows + want - 1) / want;
  const Extent runs = rows == 0 ? 1 : std::min<Extent>((rows + run - 1) / run, 65535);
  const Extent run_len = rows == 0 ? 0 : (rows + runs - 1) / runs;
  auto partial = CudaTensor<Stat, 1>::uninitialized(Shape<1>{runs * K * n});
  column_runs_kernel<K><<<dim3(unsigned(column_blocks), unsigned(runs)), block, 0, stream()>>>(partial.data(), rows, n,
                                                                                              run_len, term);
  launched(kernel);
  column_finish_kernel<K><<<unsigned((n * finish_lanes + Extent(block) - 1) / Extent(block)), block, 0, stream()>>>(
      partial.data(), runs, n, finish);
  launched(kernel);
}

}  // namespace dtensor::kernels::cuda::detail
