// dtensor/core/meta_space.hpp — the meta memory space: tensors with extents and no elements.
//
//   dtensor::Tensor<float, 2, dtensor::meta_space> w({50257, 768});   // allocates nothing
//   w.shape();  w.bytes();            // as for any tensor; w.data() is null
//   kernels::meta::CostLog cost;      // what the meta kernels would compute (kernels/meta)
//
// The real model code runs on meta tensors for a dry run: every op checks its operands' extents
// and returns results of the right extents, the meta kernels (kernels/meta) count the FLOPs and
// bytes each one would move, and the allocation ledger (core/memory_ledger.hpp) records the bytes
// each tensor would hold. Copies, zero and fill do nothing; element access does not compile
// (host_accessible is false), and a kernel of another space never receives a meta tensor (the
// kernels are chosen by the tensors' space).
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "dtensor/core/memory.hpp"

namespace dtensor {

struct meta_space {
  static constexpr std::string_view name = "meta";
  static constexpr bool host_accessible = false;
  /// No element is ever stored (what ops ask before reading values, e.g. ids to check).
  static constexpr bool holds_data = false;

  static void* allocate(std::size_t) noexcept { return nullptr; }
  static void deallocate(void*, std::size_t) noexcept {}
  static void copy(void*, const void*, std::size_t) noexcept {}
  static void copy_2d(void*, std::size_t, const void*, std::size_t, std::size_t, std::size_t) noexcept {}
  static void zero(void*, std::size_t) noexcept {}
  template <class T>
  static void fill(T*, std::size_t, T) noexcept {}
};

static_assert(MemorySpace<meta_space>);

/// Whether tensors of space S hold their elements (every space but meta).
template <class S>
inline constexpr bool holds_data_v = !std::is_same_v<S, meta_space>;

}  // namespace dtensor
