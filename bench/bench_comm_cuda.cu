// bench_comm_cuda — redistribution on GPUs against the raw data movement, same sizes, same run.
//
//   bench_comm_cuda                       one GPU, 4 ranks as threads (cuda_threads):
//     gather/dtensor     redistribute Shard<0> -> Replicate of a [rows, 1024] float tensor
//     gather/memcpy      the same bytes with cudaMemcpyAsync (device to device), per rank
//   mpirun -n 2 bench_comm_cuda           with NCCL (built with dtensor::nccl), one GPU per rank:
//     nccl/dtensor       the same redistribution over the NCCL communicator
//     nccl/raw           ncclAllGather of the same blocks
// bytes_per_second counts the gathered tensor's bytes per rank. Manual time; ranks run the same
// fixed iterations. Without a GPU it prints the skip line and exits 0.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "dtensor/comm/cuda_threads.cuh"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#if defined(DTENSOR_HAS_NCCL)
#include "dtensor/comm/mpi.hpp"
#include "dtensor/comm/nccl.cuh"
#endif

namespace {
using namespace dtensor;
using Clock = std::chrono::steady_clock;
constexpr int ranks = 4, inner = 20;
constexpr Extent cols = 1024;

using Mesh = DeviceMesh<"x">;
using Sharded = Layout<Shard<0>>;
using Replicated = Layout<Replicate>;

/// One benchmark iteration = `inner` operations on every rank; rank 0's time per operation.
template <class Op>
double per_op(CommPtr world, Op op) {
  op();  // warm-up
  world->barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < inner; ++i) op();
  DTENSOR_CUDA_CHECK(cudaStreamSynchronize(dtensor::cuda::current_stream()));
  world->barrier();
  return std::chrono::duration<double>(Clock::now() - t0).count() / inner;
}

void BM_gather_dtensor(benchmark::State& st) {
  const Extent rows = st.range(0);
  for (auto _ : st) {
    std::atomic<double> t{0};
    cuda_threads::run(ranks, [&](CommPtr world) {
      Mesh mesh(world, {ranks});
      Tensor<float, 2, cuda_space> full(Shape<2>{rows, cols});
      auto x = distribute_replicated<Sharded>(mesh, full);
      const double s = per_op(world, [&] { benchmark::DoNotOptimize(redistribute<Replicated>(x)); });
      if (world->rank() == 0) t = s;
    });
    st.SetIterationTime(t);
  }
  st.SetBytesProcessed(st.iterations() * rows * cols * Extent(sizeof(float)));
}

void BM_gather_memcpy(benchmark::State& st) {
  const Extent rows = st.range(0);
  for (auto _ : st) {
    std::atomic<double> t{0};
    cuda_threads::run(ranks, [&](CommPtr world) {
      Tensor<float, 2, cuda_space> src(Shape<2>{rows, cols}), dst(Shape<2>{rows, cols});
      const double s = per_op(world, [&] {
        DTENSOR_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.bytes(), cudaMemcpyDeviceToDevice,
                                           dtensor::cuda::current_stream()));
      });
      if (world->rank() == 0) t = s;
    });
    st.SetIterationTime(t);
  }
  st.SetBytesProcessed(st.iterations() * rows * cols * Extent(sizeof(float)));
}

BENCHMARK(BM_gather_dtensor)->Name("gather/dtensor")->RangeMultiplier(4)->Range(64, 16384)->UseManualTime();
BENCHMARK(BM_gather_memcpy)->Name("gather/memcpy")->RangeMultiplier(4)->Range(64, 16384)->UseManualTime();

#if defined(DTENSOR_HAS_NCCL)
CommPtr& nccl_world() {
  static CommPtr w;
  return w;
}

void BM_nccl_dtensor(benchmark::State& st) {
  auto world = nccl_world();
  const Extent rows = st.range(0);
  Mesh mesh(world, {world->size()});
  Tensor<float, 2, cuda_space> full(Shape<2>{rows, cols});
  auto x = distribute_replicated<Sharded>(mesh, full);
  for (auto _ : st) st.SetIterationTime(per_op(world, [&] { benchmark::DoNotOptimize(redistribute<Replicated>(x)); }));
  st.SetBytesProcessed(st.iterations() * rows * cols * Extent(sizeof(float)));
}

void BM_nccl_raw(benchmark::State& st) {
  auto world = nccl_world();
  auto& nc = static_cast<nccl::NcclCommunicator&>(*world);
  const Extent rows = st.range(0), block = (rows + world->size() - 1) / world->size() * cols;
  Tensor<float, 1, cuda_space> send(Shape<1>{block}), recv(Shape<1>{block * world->size()});
  for (auto _ : st)
    st.SetIterationTime(per_op(world, [&] {
      const ncclResult_t r = ncclAllGather(send.data(), recv.data(), std::size_t(block), ncclFloat32, nc.native(),
                                           dtensor::cuda::current_stream());
      if (r != ncclSuccess && r != ncclInProgress) throw Error("ncclAllGather", ncclGetErrorString(r));
    }));
  st.SetBytesProcessed(st.iterations() * rows * cols * Extent(sizeof(float)));
}

BENCHMARK(BM_nccl_dtensor)->Name("nccl/dtensor")->RangeMultiplier(4)->Range(64, 16384)->UseManualTime()->Iterations(10);
BENCHMARK(BM_nccl_raw)->Name("nccl/raw")->RangeMultiplier(4)->Range(64, 16384)->UseManualTime()->Iterations(10);
#endif
}  // namespace

int main(int argc, char** argv) {
#if defined(DTENSOR_HAS_NCCL)
  dtensor::mpi::Environment env(argc, argv);
#endif
  if (dtensor::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
#if defined(DTENSOR_HAS_NCCL)
  nccl_world() = nccl::world();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) benchmark::AddCustomContext("rank", std::to_string(rank));
#endif
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
#if defined(DTENSOR_HAS_NCCL)
  nccl_world().reset();
#endif
  return 0;
}
