// dtensor/kernels/dispatch.hpp — how a kernel name reaches the kernel of the tensors' memory
// space, after the checks every space shares.
//
//   namespace dtensor::kernels { DTENSOR_KERNEL_CHECKED(softmax_backward) }   // kernels/softmax.hpp
//   kernels::softmax_backward(y, dy);
//     1. generic::check_softmax_backward(y, dy)   shapes and settings (kernels/generic/): one
//                                                  place for every space, one error message
//     2. the space's kernel by overload resolution on the arguments' types:
//        host_space -> host::softmax_backward, meta_space -> meta::softmax_backward,
//        cuda_space -> cuda::softmax_backward (when nvcc compiles the translation unit),
//        any other space -> the function of that name in the space type's own namespace,
//        found by argument-dependent lookup (Tensor<T, R, my::space> makes `my` an associated
//        namespace).
//
// This is Thrust's split (thrust/system/detail/generic/ holds what every system shares,
// a system supplies only its own algorithms, and the system is chosen at compile time from the
// argument types): a kernel in kernels::host, kernels::cuda or kernels::meta holds only its
// computation (meta: the result's extents and its cost record) and trusts its arguments. A new
// memory space is therefore one header declaring the space type plus its kernels, in the space's
// own namespace; nothing here or in the family headers changes (docs/design.md, "Adding a memory
// space"; tests/support/counting_space.hpp, run in tests/unit/test_ops_spaces.cpp). Operands of
// different spaces match no kernel; the ops say so first with a diagnostic naming both spaces
// (ops/common.hpp, mixed_memory_spaces).
//
// The lookup of step 2 also sees functions of namespace dtensor (the namespace of the built-in
// space types): a function there of a kernel's name must not accept local Tensors, or the call
// becomes ambiguous (none does: the ops live in dtensor::ops, which the lookup does not search).
//
// DTENSOR_KERNEL(name) is the same front for a kernel that has nothing to check (any extents
// are valid: gelu, scale, ...). Calling kernels::host::name directly skips the checks: the
// space namespaces are the implementations, kernels::name is the API.
#pragma once

#include <concepts>
#include <utility>

#include "dtensor/kernels/generic/checks.hpp"

#if defined(__CUDACC__)
#define DTENSOR_KERNEL_BUILTIN_SPACES(name) \
  using host::name;                         \
  using meta::name;                         \
  using cuda::name;
#else
#define DTENSOR_KERNEL_BUILTIN_SPACES(name) \
  using host::name;                         \
  using meta::name;
#endif

/// kernels::select::name##_fn calls the space's kernel: the using-declarations of the built-in
/// spaces hide the front below (no recursion) and the unqualified call adds, by
/// argument-dependent lookup, the kernels of a space declared elsewhere.
#define DTENSOR_KERNEL_SELECT(name)                                                                  \
  namespace select {                                                                                 \
  DTENSOR_KERNEL_BUILTIN_SPACES(name)                                                                \
  struct name##_fn {                                                                                 \
    template <class... A>                                                                            \
    auto operator()(A&&... a) const -> decltype(name(std::forward<A>(a)...)) {                       \
      return name(std::forward<A>(a)...);                                                            \
    }                                                                                                \
  };                                                                                                 \
  }

/// The front of a kernel whose arguments generic::check_##name validates first.
#define DTENSOR_KERNEL_CHECKED(name)                    \
  DTENSOR_KERNEL_SELECT(name)                           \
  template <class... A>                                 \
    requires std::invocable<select::name##_fn, A...>    \
  decltype(auto) name(A&&... a) {                       \
    generic::check_##name(std::as_const(a)...);         \
    return select::name##_fn{}(std::forward<A>(a)...);  \
  }

/// The front of a kernel that accepts any extents (nothing to check).
#define DTENSOR_KERNEL(name)                           \
  DTENSOR_KERNEL_SELECT(name)                          \
  template <class... A>                                \
    requires std::invocable<select::name##_fn, A...>   \
  decltype(auto) name(A&&... a) {                      \
    return select::name##_fn{}(std::forward<A>(a)...); \
  }
