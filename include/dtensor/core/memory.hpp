// dtensor/core/memory.hpp — memory spaces: where a tensor's elements live.
//
// A memory space is a type with static functions to allocate, free and copy bytes. Tensor and
// DTensor take it as a template argument (`Tensor<float, 2, host_space>`), so code written for
// one space compiles for another; the cuda space (dtensor/core/cuda_space.cuh) and the meta
// space (dtensor/core/meta_space.hpp) have the same members. The copies are plain and 2-D
// (pitched), the two shapes every box copy reduces to.
//
// host_space caches freed blocks by size (detail::HostBlockCache): a redistribution or an op
// that allocates its result anew every step gets last step's block back instead of fresh pages
// (a page fault per 4 KiB on first touch). Up to host_cache_limit() bytes stay cached;
// host_cache_trim() returns them to the system.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

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

namespace detail {

/// Freed host blocks kept by size for reuse. Thread-safe (ranks are threads and a tensor may be
/// freed by another thread than the one that made it). Blocks are found by their exact rounded
/// size: training repeats the same shapes every step, so exact sizes hit.
class HostBlockCache {
 public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t default_limit = std::size_t(1) << 30;  // 1 GiB

  static std::size_t rounded(std::size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }

  void* take(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        ++hits_;
        return p;
      }
      ++misses_;
    }
    return ::operator new(bytes, std::align_val_t{alignment});
  }
  void give(void* p, std::size_t bytes) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (cached_ + bytes <= limit_) {
        try {
          free_[bytes].push_back(p);
          cached_ += bytes;
          return;
        } catch (...) {  // no memory for the bookkeeping: free the block instead
        }
      }
    }
    ::operator delete(p, std::align_val_t{alignment});
  }
  void trim() noexcept {
    std::lock_guard lock(mutex_);
    for (auto& [bytes, blocks] : free_)
      for (void* p : blocks) ::operator delete(p, std::align_val_t{alignment});
    free_.clear();
    cached_ = 0;
  }
  void set_limit(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      limit_ = bytes;
    }
    if (bytes == 0) trim();
  }
  std::size_t limit() {
    std::lock_guard lock(mutex_);
    return limit_;
  }
  std::size_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_;
  }
  std::size_t hits() {
    std::lock_guard lock(mutex_);
    return hits_;
  }
  std::size_t misses() {
    std::lock_guard lock(mutex_);
    return misses_;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0, limit_ = default_limit, hits_ = 0, misses_ = 0;
};

/// The process's cache; never destroyed, so that tensors freed during static destruction still
/// find it (its blocks stay reachable from it: not leaks).
inline HostBlockCache& host_block_cache() {
  static HostBlockCache* cache = new HostBlockCache;
  return *cache;
}

}  // namespace detail

/// Bytes of freed host blocks kept for reuse at most (default 1 GiB; 0 turns caching off).
inline void set_host_cache_limit(std::size_t bytes) { detail::host_block_cache().set_limit(bytes); }
inline std::size_t host_cache_limit() { return detail::host_block_cache().limit(); }
/// Returns every cached host block to the system.
inline void host_cache_trim() { detail::host_block_cache().trim(); }
/// Bytes now cached (freed, kept for reuse).
inline std::size_t host_cache_bytes() { return detail::host_block_cache().cached_bytes(); }

/// Ordinary host memory, 64-byte aligned (a cache line; enough for every SIMD width), through
/// the block cache above.
struct host_space {
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
  static constexpr std::size_t alignment = detail::HostBlockCache::alignment;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return detail::host_block_cache().take(detail::HostBlockCache::rounded(bytes));
  }
  /// bytes: what was allocated (0 when unknown: the block is freed, not cached).
  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    if (bytes == 0) ::operator delete(p, std::align_val_t{alignment});
    else detail::host_block_cache().give(p, detail::HostBlockCache::rounded(bytes));
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
