// dtensor/parallel/detail/convert.hpp — element-wise copies between element types and memory
// spaces, for the parallel wrappers' flat buffers: FSDP's mixed precision (bf16 parameters
// from fp32 master values, parallel/fsdp/) and CPU offload (master values on the host, the model
// on a GPU), DiLoCo's bf16 wire (parallel/sync/diloco.hpp).
#pragma once

#include <span>
#include <type_traits>

#include "dtensor/core/memory.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/kernels/cast.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::parallel::detail {

/// dst = src element by element in memory space Space (converted when the types differ).
template <MemorySpace Space, class To, class From>
void convert_into(std::span<To> dst, std::span<const From> src) {
  if constexpr (std::is_same_v<To, From>) {
    Space::copy(dst.data(), src.data(), src.size_bytes());
  } else {
    auto out = nn::detail::flat_view<Space>(dst);
    kernels::cast_into(out, nn::detail::flat_view<Space>(src));
  }
}

/// dst = src from memory space From into memory space To (converted when the types differ). The
/// conversion runs on the host side: a device's values are copied out first, or converted on the
/// host and then copied in (CPU offload: the master values live on the host, the model on the GPU).
template <MemorySpace To, MemorySpace From, class ToE, class FromE>
void convert_across(std::span<ToE> dst, std::span<const FromE> src) {
  if constexpr (std::is_same_v<To, From>) {
    convert_into<To>(dst, src);
  } else if constexpr (!holds_data_v<From>) {
    To::zero(dst.data(), dst.size_bytes());  // a dry run's meta values: none to copy
  } else if constexpr (std::is_same_v<ToE, FromE>) {
    using Mover = std::conditional_t<!To::host_accessible, To, From>;  // a device space's copy takes host pointers
    Mover::copy(dst.data(), src.data(), src.size_bytes());
  } else if constexpr (To::host_accessible) {
    const auto staged = to_space<To>(nn::detail::flat_view<From>(src));
    convert_into<To>(dst, std::span<const FromE>(staged.span()));
  } else {
    static_assert(From::host_accessible, "convert_across: one of the two spaces must be the host's");
    auto staged = Tensor<ToE, 1, From>::uninitialized(Shape<1>{Extent(dst.size())});
    convert_into<From>(staged.span(), src);
    To::copy(dst.data(), staged.data(), staged.bytes());
  }
}

/// dst += src element by element in memory space Space.
template <MemorySpace Space, class E>
void add_into(std::span<E> dst, std::span<const E> src) {
  auto out = nn::detail::flat_view<Space>(dst);
  kernels::add_(out, nn::detail::flat_view<Space>(src));
}

}  // namespace dtensor::parallel::detail
