// dtensor/checkpoint/checksum.hpp — the checksum of a checkpoint's pieces and manifest.
//
//   std::uint64_t h = checkpoint::fnv1a64(bytes.data(), bytes.size());
//   checkpoint::to_hex(h) == "cbf29ce484222325" for no bytes
//
// FNV-1a, 64 bits (Fowler, Noll, Vo): small enough to implement here (no new dependency), and
// every flipped, dropped or reordered byte changes it. It guards against storage faults and
// truncation, not against tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtensor::checkpoint {

inline constexpr std::uint64_t fnv1a64_offset_basis = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t fnv1a64_prime = 0x100000001b3ull;

/// Continues the hash `h` over n more bytes (start from fnv1a64_offset_basis).
inline std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = fnv1a64_offset_basis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= fnv1a64_prime;
  }
  return h;
}

/// Sixteen lower-case hex digits.
inline std::string to_hex(std::uint64_t h) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[std::size_t(i)] = digits[h & 15];
  return s;
}

}  // namespace dtensor::checkpoint
