// dtensor/core/cuda_space.cuh — the cuda memory space: tensors in GPU memory.
//
//   dtensor::Tensor<float, 2, dtensor::cuda_space> a({1024, 1024});   // zero-filled, on the GPU
//   auto h = dtensor::to_space<dtensor::host_space>(a);                 // copy back (synchronous)
//   auto d = dtensor::to_space<dtensor::cuda_space>(h);                 // and there again
//
//   cudaStream_t s = dtensor::cuda::current_stream();   // this thread's stream (default: per-thread)
//   dtensor::cuda::StreamScope scope(my_stream);         // another one until the scope ends
//
// Everything a cuda_space function does is ordered on the calling thread's current stream:
// allocation and free are stream-ordered (cudaMallocAsync / cudaFreeAsync, the device's default
// memory pool), device-to-device copies, zero and fill are enqueued and return at once. A copy
// that reads or writes host memory returns only when it is complete, so that host code may read
// or reuse the host buffer right after it (what host_space's copy promises too).
//
// Why a thread-local current stream: ranks of the one-GPU communicator (comm/cuda_threads.cuh)
// are threads, each on its own stream; tensors created by a rank live on its stream without the
// user passing streams around. The stream-ordered allocator's rule applies: memory used on
// another stream must be synchronized with the current one before the tensor is destroyed.
//
// Element access (operator(), operator[]) and compare/equal are host-only: Tensor requires
// Space::host_accessible, and cuda_space says false, so `a(0, 0)` does not compile on a device
// tensor. Every CUDA call is checked (core/cuda_check.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dtensor/core/cuda_check.cuh"
#include "dtensor/core/memory.hpp"
#include "dtensor/core/tensor.hpp"

namespace dtensor {

namespace cuda {

namespace detail {
inline cudaStream_t& current_stream_slot() noexcept {
  thread_local cudaStream_t s = cudaStreamPerThread;  // no implicit sync with other threads' work
  return s;
}
}  // namespace detail

/// The stream this thread's cuda_space operations and kernels are issued on.
inline cudaStream_t current_stream() noexcept { return detail::current_stream_slot(); }
/// Sets this thread's current stream (the caller keeps the stream alive while it is current).
inline void set_current_stream(cudaStream_t s) noexcept { detail::current_stream_slot() = s; }

/// Makes `s` the current stream until the end of the scope.
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t s) noexcept : saved_(current_stream()) { set_current_stream(s); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;
  ~StreamScope() { set_current_stream(saved_); }

 private:
  cudaStream_t saved_;
};

/// The number of CUDA devices, 0 when there is none or no driver (never throws).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the (non-sticky) error for later calls
    return 0;
  }
  return n;
}

/// Waits until everything issued on the current stream has finished.
inline void synchronize() { DTENSOR_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

/// Whether the GPU can address p directly (device or managed memory); false for host memory,
/// pinned or not (NCCL and the device kernels need device memory).
inline bool is_device_pointer(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  DTENSOR_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/// Whether p is plain device memory (not host, not managed): copies between two such pointers
/// need not wait for the host.
inline bool is_device_only(const void* p) {
  if (!p) return true;
  cudaPointerAttributes a{};
  DTENSOR_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  return a.type == cudaMemoryTypeDevice;
}

namespace detail {

/// Every word of a box of slabs (core/box.hpp), one thread per word in a grid-stride loop; W is
/// the widest word that every address, run, pitch and stride is a multiple of.
template <class W, std::size_t R>
__global__ void slab_copy_kernel(char* dst, const char* src, dtensor::detail::BoxSlabs<R> b, std::size_t run_words,
                                 std::size_t total) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::size_t rest = i / run_words;
    const std::size_t word = i - rest * run_words;
    const std::size_t row = rest % b.rows;
    rest /= b.rows;
    std::size_t so = row * b.src_pitch + word * sizeof(W), dof = row * b.dst_pitch + word * sizeof(W);
    for (std::size_t k = b.outer; k-- > 0;) {
      const std::size_t e = std::size_t(b.ext[k]), at = rest % e;
      rest /= e;
      so += at * std::size_t(b.src_stride[k]);
      dof += at * std::size_t(b.dst_stride[k]);
    }
    *reinterpret_cast<W*>(dst + dof) = *reinterpret_cast<const W*>(src + so);
  }
}

template <class W, std::size_t R>
void launch_slab_copy(void* dst, const void* src, const dtensor::detail::BoxSlabs<R>& b) {
  std::size_t slabs = 1;
  for (std::size_t k = 0; k < b.outer; ++k) slabs *= std::size_t(b.ext[k]);
  const std::size_t run_words = b.run_bytes / sizeof(W), total = slabs * b.rows * run_words;
  if (total == 0) return;
  const std::size_t blocks = std::min<std::size_t>((total + 255) / 256, 65535);
  slab_copy_kernel<W, R><<<unsigned(blocks), 256, 0, current_stream()>>>(static_cast<char*>(dst),
                                                                        static_cast<const char*>(src), b, run_words,
                                                                        total);
  DTENSOR_CUDA_CHECK_LAUNCH("cuda_space::copy_slabs (slab_copy_kernel launch)");
}

template <class T>
__global__ void fill_kernel(T* dst, std::size_t n, T value) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

/// A grid that covers n elements with grid-stride loops (capped: more blocks do not help).
inline unsigned grid_for(std::size_t n, unsigned block = 256) {
  const std::size_t blocks = (n + block - 1) / block;
  return unsigned(blocks < 65535 ? (blocks ? blocks : 1) : 65535);
}

/// Lets the device's stream-ordered pool keep freed memory for reuse. With the default release
/// threshold (0) the pool hands its free memory back to the driver at every synchronization, and
/// the next cudaMallocAsync maps it again: on an H100 that made ops::matmul, which allocates its
/// output, up to a third slower than cuBLAS alone at n = 4096 (bench_gemm_cuda). PyTorch's caching
/// allocator keeps memory for the same reason. Set once per thread and device. It never throws:
/// without a usable device the allocation that follows fails and names itself (cudaMallocAsync).
inline void retain_pool_memory() noexcept {
  thread_local int done_for = -1;
  int device = 0;
  cudaMemPool_t pool = nullptr;
  std::uint64_t keep = ~std::uint64_t(0);
  if (cudaGetDevice(&device) != cudaSuccess || device == done_for) return;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess &&
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess)
    done_for = device;
  else
    (void)cudaGetLastError();  // not sticky: leave no error behind for the next call to report
}
}  // namespace detail

}  // namespace cuda

/// GPU memory on the current device, used through the current stream (see the synopsis).
struct cuda_space {
  static constexpr std::string_view name = "cuda";
  static constexpr bool host_accessible = false;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    cuda::detail::retain_pool_memory();
    DTENSOR_CUDA_CHECK(cudaMallocAsync(&p, bytes, cuda::current_stream()));
    return p;
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) detail::cuda_report(cudaFreeAsync(p, cuda::current_stream()), "cudaFreeAsync");
  }
  /// Any direction (the pointers say which: unified addressing). Synchronous when host memory
  /// is involved, stream-ordered between device buffers.
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return;
    const cudaStream_t s = cuda::current_stream();
    DTENSOR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    settle_if_host(dst, src, s);
  }
  /// height rows of width bytes; rows start every dst_pitch / src_pitch bytes.
  static void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                      std::size_t height) {
    if (width == 0 || height == 0) return;
    const cudaStream_t s = cuda::current_stream();
    DTENSOR_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDefault, s));
    settle_if_host(dst, src, s);
  }
  /// A box of slabs (core/box.hpp) between device buffers: one kernel launch in place of a
  /// cudaMemcpy2DAsync per slab. False (the caller copies slab by slab) where a pointer is host
  /// memory.
  template <std::size_t R>
  static bool copy_slabs(void* dst, const void* src, const detail::BoxSlabs<R>& b) {
    if (!cuda::is_device_only(dst) || !cuda::is_device_only(src)) return false;
    std::size_t align = reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | b.run_bytes |
                        b.src_pitch | b.dst_pitch;
    for (std::size_t k = 0; k < b.outer; ++k) align |= std::size_t(b.src_stride[k]) | std::size_t(b.dst_stride[k]);
    if (align % 16 == 0) cuda::detail::launch_slab_copy<uint4>(dst, src, b);
    else if (align % 8 == 0) cuda::detail::launch_slab_copy<std::uint64_t>(dst, src, b);
    else if (align % 4 == 0) cuda::detail::launch_slab_copy<std::uint32_t>(dst, src, b);
    else if (align % 2 == 0) cuda::detail::launch_slab_copy<std::uint16_t>(dst, src, b);
    else cuda::detail::launch_slab_copy<std::uint8_t>(dst, src, b);
    return true;
  }
  static void zero(void* dst, std::size_t bytes) {
    if (bytes) DTENSOR_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cuda::current_stream()));
  }
  template <class T>
  static void fill(T* dst, std::size_t n, T value) {
    if (n == 0) return;
    cuda::detail::fill_kernel<T><<<cuda::detail::grid_for(n), 256, 0, cuda::current_stream()>>>(dst, n, value);
    DTENSOR_CUDA_CHECK_LAUNCH("cuda_space::fill (fill_kernel launch)");
  }

 private:
  static void settle_if_host(void* dst, const void* src, cudaStream_t s) {
    if (!cuda::is_device_only(dst) || !cuda::is_device_only(src)) DTENSOR_CUDA_CHECK(cudaStreamSynchronize(s));
  }
};

static_assert(MemorySpace<cuda_space>);
static_assert(detail::SlabCopySpace<cuda_space, 4>, "cuda_space copies boxes of slabs in one launch (core/box.hpp)");

}  // namespace dtensor
