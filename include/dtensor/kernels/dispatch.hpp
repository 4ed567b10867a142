// dtensor/kernels/dispatch.hpp — how a kernel name reaches the kernel of the tensors' memory space.
//
//   namespace dtensor::kernels { DTENSOR_KERNELS_USE(gelu) }   // in kernels/activations.hpp
//   kernels::gelu(x);   // x: Tensor<T, R, host_space> -> host::gelu, meta_space -> meta::gelu,
//                       //    cuda_space -> cuda::gelu (when compiled by nvcc)
//
// Every kernel exists under one name in kernels::host, kernels::meta and kernels::cuda, each
// taking tensors of its own space. The family headers (kernels/activations.hpp, ...) bring the
// three into namespace kernels with using-declarations, so that overload resolution on the
// arguments' types picks the space, as Thrust selects a system from its iterators
// (thrust/system/detail/generic/select_system.h) — at compile time, no run-time dispatch. The
// cuda kernels are .cuh headers reachable only when nvcc compiles the translation unit
// (__CUDACC__); elsewhere a cuda tensor has no kernels and an op on it does not compile.
// Operands of different spaces match no overload; the ops state that first with a
// diagnostic naming both spaces (ops/common.hpp, mixed_memory_spaces).
#pragma once

#if defined(__CUDACC__)
#define DTENSOR_KERNELS_USE(name) \
  using host::name;               \
  using meta::name;               \
  using cuda::name;
#else
#define DTENSOR_KERNELS_USE(name) \
  using host::name;               \
  using meta::name;
#endif
