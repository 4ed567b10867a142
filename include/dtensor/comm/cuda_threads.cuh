// dtensor/comm/cuda_threads.cuh — several ranks on one GPU: ranks are threads, each with its
// own CUDA stream, and collectives are device-to-device copies.
//
//   dtensor::cuda_threads::run(4, [](dtensor::CommPtr world) {
//     DeviceMesh<"dp", "tp"> mesh(world, {2, 2});
//     Tensor<float, 2, cuda_space> x({8, 8});                 // on this rank's stream
//     auto d = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, x);
//     auto full = full_tensor(d);                              // all-gathers on the GPU
//   });
//
// What it is for: running and testing multi-rank code (tensor, sequence, pipeline parallel
// layouts) on a machine with one GPU, with the data on the device and the same numbers as a
// real multi-GPU run. It is the threads backend (comm/threads.hpp) with a CUDA MemOps: the
// rendezvous, the argument checks, timeouts and abort on a failed rank are the threads
// backend's; only the bytes move differently:
//   - each rank thread gets a non-blocking stream, made its current stream
//     (cuda::current_stream), so its tensors and kernels are on it;
//   - copies are cudaMemcpyAsync (cudaMemcpyDefault: host buffers work too, e.g. the
//     fingerprints of set_check_collectives and the extents that distribute broadcasts);
//   - reductions are one kernel per call that combines the ranks' buffers in rank order with
//     reduce_pair, so results are bit-identical on every rank, in every run, and equal to the
//     host backend's (and the single-device oracle's);
//   - before a rank publishes its buffers it synchronizes its stream (its data is complete),
//     and before it leaves a collective it synchronizes again (its reads of peers are done).
// A collective therefore returns with its result complete, like the host backends.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>

#include "dtensor/comm/threads.hpp"
#include "dtensor/core/cuda_space.cuh"

namespace dtensor::cuda_threads {

namespace detail {

/// The sources of one reduction, passed by value to the kernel (no device-side array).
inline constexpr int max_ranks = 256;
struct Sources {
  const void* p[max_ranks];
};

template <class T, ReduceOp Op>
__global__ void reduce_ranks(T* dst, Sources srcs, int n, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    T acc = static_cast<const T*>(srcs.p[0])[i];
    for (int r = 1; r < n; ++r) acc = reduce_pair(Op, acc, static_cast<const T*>(srcs.p[r])[i]);
    if constexpr (Op == ReduceOp::avg) acc = threads::detail::divide_by(acc, n);
    dst[i] = acc;
  }
}

template <class T>
void launch_reduce(ReduceOp op, void* dst, const Sources& s, int n, std::size_t count, cudaStream_t st) {
  const unsigned grid = cuda::detail::grid_for(count);
  T* d = static_cast<T*>(dst);
  switch (op) {
    case ReduceOp::sum: reduce_ranks<T, ReduceOp::sum><<<grid, 256, 0, st>>>(d, s, n, count); break;
    case ReduceOp::avg: reduce_ranks<T, ReduceOp::avg><<<grid, 256, 0, st>>>(d, s, n, count); break;
    case ReduceOp::max: reduce_ranks<T, ReduceOp::max><<<grid, 256, 0, st>>>(d, s, n, count); break;
    case ReduceOp::min: reduce_ranks<T, ReduceOp::min><<<grid, 256, 0, st>>>(d, s, n, count); break;
  }
  DTENSOR_CUDA_CHECK_LAUNCH("cuda_threads reduce (reduce_ranks launch)");
}

/// One rank's stream and device; the MemOps of the threads rendezvous.
class CudaMemOps final : public threads::detail::MemOps {
 public:
  CudaMemOps(int device, int rank) : device_(device), rank_(rank) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  CudaMemOps(const CudaMemOps&) = delete;
  CudaMemOps& operator=(const CudaMemOps&) = delete;
  ~CudaMemOps() override {
    // Pending frees and copies finish before the stream goes.
    dtensor::detail::cuda_report(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (cuda_threads rank stream)");
    dtensor::detail::cuda_report(cudaStreamDestroy(stream_), "cudaStreamDestroy (cuda_threads rank stream)");
  }

  cudaStream_t stream() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

  std::string_view backend() const override { return "cuda_threads"; }

  void copy(void* dst, const void* src, std::size_t bytes) const override {
    here();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }

  void reduce(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, std::size_t count) const override {
    if (count == 0) return;
    // Host buffers (a user's all-reduce of a std::vector) reduce on the host, after the copies
    // that may have produced them.
    bool device = cuda::is_device_pointer(dst);
    for (int r = 0; device && r < n; ++r) device = cuda::is_device_pointer(srcs[r]);
    if (!device) {
      fence();
      threads::detail::reduce(t, op, dst, srcs, n, count);
      return;
    }
    if (n > max_ranks)
      throw Error("cuda_threads reduce", dtensor::detail::cat("groups of more than ", max_ranks, " ranks (got ", n,
                                                              ") are not supported"), rank_);
    here();
    Sources s{};
    for (int r = 0; r < n; ++r) s.p[r] = srcs[r];
    switch (t) {
      case DType::float32: return launch_reduce<float>(op, dst, s, n, count, stream_);
      case DType::float64: return launch_reduce<double>(op, dst, s, n, count, stream_);
      case DType::bfloat16: return launch_reduce<bfloat16>(op, dst, s, n, count, stream_);
      case DType::int32: return launch_reduce<std::int32_t>(op, dst, s, n, count, stream_);
      case DType::int64: return launch_reduce<std::int64_t>(op, dst, s, n, count, stream_);
      case DType::uint8: return launch_reduce<std::uint8_t>(op, dst, s, n, count, stream_);
    }
  }

  std::shared_ptr<std::byte> allocate(std::size_t bytes, const void* like) const override {
    if (!cuda::is_device_pointer(like))
      return std::shared_ptr<std::byte>(new std::byte[bytes], std::default_delete<std::byte[]>());
    here();
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes, stream_), "cudaMallocAsync");
    const cudaStream_t s = stream_;
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [s](std::byte* q) {
      dtensor::detail::cuda_report(cudaFreeAsync(q, s), "cudaFreeAsync (cuda_threads scratch)");
    });
  }

  void fence() const override {
    here();
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  /// Asynchronous operations run on pool threads, whose current device may be another.
  void here() const { check(cudaSetDevice(device_), "cudaSetDevice"); }
  void check(cudaError_t e, const char* call) const {
    if (e != cudaSuccess) [[unlikely]]
      dtensor::detail::throw_cuda(e, call, __FILE__, __LINE__, rank_);
  }

  int device_, rank_;
  cudaStream_t stream_ = nullptr;
};

/// Rank r's communicator: made on r's thread, which it leaves with r's stream current.
struct MakeCudaComm {
  int device;
  CommPtr operator()(const std::shared_ptr<threads::detail::Group>& g, int r) const {
    auto ops = std::make_shared<CudaMemOps>(device, r);
    cuda::set_current_stream(ops->stream());
    return std::make_shared<threads::ThreadsCommunicator>(g, r, std::move(ops));
  }
};

}  // namespace detail

/// This rank's stream (the current stream of its thread); for kernels launched by hand.
inline cudaStream_t rank_stream() noexcept { return cuda::current_stream(); }

/// Runs fn(world) on n threads sharing GPU `device`. If a rank threw, throws (after joining
/// all of them) a dtensor::Error with the number and message of the rank that failed first.
template <class F>
void run(int n, F&& fn, int device = 0) {
  if (cuda::device_count() <= device)
    throw Error("cuda_threads::run", dtensor::detail::cat("no CUDA device ", device, " (", cuda::device_count(),
                                                          " visible)"));
  threads::detail::rethrow_first(threads::detail::run_ranks(n, fn, detail::MakeCudaComm{device}), "cuda_threads::run");
}

/// Runs fn(world) on n threads sharing GPU `device` and returns each rank's exception.
template <class F>
std::vector<std::exception_ptr> run_collect(int n, F&& fn, int device = 0) {
  return threads::detail::run_ranks(n, fn, detail::MakeCudaComm{device}).errors;
}

}  // namespace dtensor::cuda_threads
