// dtensor/core/memory.hpp — memory spaces: where a tensor's elements live.
//
// A memory space is a type with static functions to allocate, free and copy bytes. Tensor and
// DTensor take it as a template argument (`Tensor<float, 2, host_space>`), so code written for
// one space compiles for another; the cuda space (dtensor/core/cuda_space.cuh) has the same
// members. The copies are plain and 2-D (pitched), the two shapes every box copy reduces to.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

namespace dtensor {

template <class S>
concept MemorySpace = requires(void* p, const void* cp, std::size_t n) {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::host_accessible } -> std::convertible_to<bool>;
  { S::allocate(n) } -> std::same_as<void*>;
  S::deallocate(p, n);
  S::copy(p, cp, n);
  S::copy_2d(p, n, cp, n, n, n);
  S::zero(p, n);
};

/// Ordinary host memory, 64-byte aligned (a cache line; enough for every SIMD width).
struct host_space {
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
  static constexpr std::size_t alignment = 64;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return ::operator new(bytes, std::align_val_t{alignment});
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) ::operator delete(p, std::align_val_t{alignment});
  }
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memmove(dst, src, bytes);
  }
  /// height rows of width bytes; rows start every dst_pitch / src_pitch bytes.
  static void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t width, std::size_t height) {
    auto* d = static_cast<char*>(dst);
    auto* s = static_cast<const char*>(src);
    for (std::size_t r = 0; r < height; ++r) std::memcpy(d + r * dst_pitch, s + r * src_pitch, width);
  }
  static void zero(void* dst, std::size_t bytes) {
    if (bytes) std::memset(dst, 0, bytes);
  }
  template <class T>
  static void fill(T* dst, std::size_t n, T value) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = value;
  }
};

static_assert(MemorySpace<host_space>);

}  // namespace dtensor
