// dtensor/core/tensor.hpp — a dense, row-major local tensor of static rank.
//
//   Tensor<float, 2> a({3, 4});             // zero-filled 3x4 in host memory
//   a(1, 2) = 5.f;                          // element access (host-accessible spaces)
//   Tensor<float, 2> b = a;                 // deep copy (value semantics, like std::vector)
//   auto rows = a.slice(0, 1, 2);           // rows 1..2, a copy
//
// A Tensor owns its elements. Its storage may be larger than its extents (capacity >= numel):
// a gather receives padded chunks into one buffer and then only trims the extents, no copy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

#include "dtensor/core/box.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/checked.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor {

namespace detail {
/// Uninitialized storage of n elements in a memory space: owned (allocated here, freed on
/// destruction, reported to the allocation ledger, core/memory_ledger.hpp, under the tag current
/// when it was made), or borrowed from memory that someone else owns (a view into a flat buffer).
template <class T, MemorySpace Space>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t n)
      : data_(static_cast<T*>(Space::allocate(n * sizeof(T)))), size_(n), tag_(current_memory_tag()) {
    ledger_record<Space>(tag_, std::int64_t(n * sizeof(T)));
  }
  /// Storage over n elements at p that the caller keeps alive; never freed here.
  static Buffer borrow(T* p, std::size_t n) noexcept {
    Buffer b;
    b.data_ = p;
    b.size_ = n;
    b.owned_ = false;
    return b;
  }
  Buffer(Buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        owned_(std::exchange(o.owned_, true)),
        tag_(o.tag_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      owned_ = std::exchange(o.owned_, true);
      tag_ = o.tag_;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool owned() const noexcept { return owned_; }

 private:
  void release() noexcept {
    if (owned_) {
      if (size_) ledger_record<Space>(tag_, -std::int64_t(size_ * sizeof(T)));
      Space::deallocate(data_, size_ * sizeof(T));
    }
    data_ = nullptr;
    size_ = 0;
    owned_ = true;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  bool owned_ = true;
  MemoryTag tag_ = MemoryTag::other;
};

// The errors of Tensor's members, built on the extents' rank only: one copy per rank, not one
// per element type, rank and memory space.
template <std::size_t R>
[[noreturn]] void throw_capacity_below_numel(Extent capacity, const Shape<R>& shape) {
  throw Error("Tensor", cat("capacity ", capacity, " < numel of ", to_string(shape)));
}
template <std::size_t R>
[[noreturn]] void throw_cannot_allocate(Extent capacity, std::size_t element_bytes, const Shape<R>& shape) {
  throw Error("Tensor",
              cat("cannot allocate ", capacity, " elements of ", element_bytes, " bytes for ", to_string(shape)));
}
template <std::size_t R, std::size_t R2>
[[noreturn]] void throw_cannot_reshape(const Shape<R>& from, const Shape<R2>& to) {
  throw Error("Tensor::reshape", cat("cannot view ", to_string(from), " as ", to_string(to)));
}
template <std::size_t R>
[[noreturn]] void throw_view_extents(const Shape<R>& assigned, const Shape<R>& view) {
  throw Error("Tensor::operator=",
              cat("assigning ", to_string(assigned), " to a view of ", to_string(view), ": a view keeps its extents"));
}
template <std::size_t R>
[[noreturn]] void throw_box_out_of_bounds(const Shape<R>& ext, const Shape<R>& src_off, const Shape<R>& src,
                                          const Shape<R>& dst_off, const Shape<R>& dst) {
  throw Error("copy_box", cat("box ", to_string(ext), " at ", to_string(src_off), " of ", to_string(src), " -> at ",
                              to_string(dst_off), " of ", to_string(dst), " is out of bounds"));
}
}  // namespace detail

template <Element T, std::size_t R, MemorySpace Space = host_space>
class Tensor {
  static_assert(R >= 1 && R <= 8, "Tensor rank must be between 1 and 8");

 public:
  using value_type = T;
  using space = Space;
  static constexpr std::size_t rank = R;

  Tensor() = default;
  /// Zero-filled tensor of the given extents.
  explicit Tensor(const Shape<R>& shape) : Tensor(uninitialized(shape)) { Space::zero(data(), bytes()); }

  /// A tensor whose elements are not initialized (every element is written before it is read).
  static Tensor uninitialized(const Shape<R>& shape) {
    check_shape("Tensor", shape);  // before numel: an overflowing product is undefined behaviour
    return with_capacity(shape, dtensor::numel(shape));
  }

  /// A tensor with room for `capacity` >= numel(shape) elements; see `resize_within`.
  static Tensor with_capacity(const Shape<R>& shape, Extent capacity) {
    check_shape("Tensor", shape);
    if (capacity < dtensor::numel(shape)) detail::throw_capacity_below_numel(capacity, shape);
    (void)checked_bytes(capacity, sizeof(T), "Tensor");
    Tensor t;
    t.shape_ = shape;
    try {
      t.storage_ = detail::Buffer<T, Space>(std::size_t(capacity));
    } catch (const std::bad_alloc&) {
      detail::throw_cannot_allocate(capacity, sizeof(T), shape);
    }
    return t;
  }

  /// A tensor over n >= numel(shape) elements at `data` that it does not own (a parameter's
  /// window into its group's flat buffer, nn/flat_params.hpp). The memory must outlive it.
  /// Copies of a view own their elements; assigning to a view writes through it (same extents).
  static Tensor view(T* data, const Shape<R>& shape) {
    check_shape("Tensor::view", shape);
    Tensor t;
    t.shape_ = shape;
    t.storage_ = detail::Buffer<T, Space>::borrow(data, std::size_t(dtensor::numel(shape)));
    return t;
  }
  bool is_view() const noexcept { return !storage_.owned(); }

  Tensor(const Tensor& o) : Tensor(uninitialized(o.shape_)) { Space::copy(data(), o.data(), bytes()); }
  Tensor& operator=(const Tensor& o) {
    if (this == &o) return *this;
    if (is_view()) return write_through(o);
    return *this = Tensor(o);
  }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&& o) {
    if (this == &o) return *this;
    if (is_view()) return write_through(o);
    shape_ = o.shape_;
    storage_ = std::move(o.storage_);
    return *this;
  }

  const Shape<R>& shape() const noexcept { return shape_; }
  Extent extent(std::size_t d) const noexcept { return shape_[d]; }
  Extent numel() const noexcept { return dtensor::numel(shape_); }
  std::size_t bytes() const noexcept { return std::size_t(numel()) * sizeof(T); }
  Extent capacity() const noexcept { return Extent(storage_.size()); }
  Shape<R> strides() const noexcept { return row_major_strides(shape_); }

  T* data() noexcept { return storage_.data(); }
  const T* data() const noexcept { return storage_.data(); }
  std::span<T> span() noexcept { return {data(), std::size_t(numel())}; }
  std::span<const T> span() const noexcept { return {data(), std::size_t(numel())}; }

  /// Changes the extents without moving elements; the new size must fit the capacity.
  void resize_within(const Shape<R>& shape) {
    check_shape("Tensor::resize_within", shape);
    if (dtensor::numel(shape) > capacity())
      throw Error("Tensor::resize_within",
                  detail::cat(to_string(shape), " needs ", dtensor::numel(shape), " elements, capacity is ", capacity()));
    shape_ = shape;
  }

  /// The same elements with other extents of equal count (row-major order is kept).
  template <std::size_t R2>
  Tensor<T, R2, Space> reshape(const Shape<R2>& shape) && {
    check_shape("Tensor::reshape", shape);
    if (dtensor::numel(shape) != numel()) detail::throw_cannot_reshape(shape_, shape);
    auto t = Tensor<T, R2, Space>::adopt(std::move(storage_), shape);
    shape_ = {};
    return t;
  }
  template <std::size_t R2>
  Tensor<T, R2, Space> reshape(const Shape<R2>& shape) const& {
    return Tensor(*this).template reshape<R2>(shape);
  }

  // ---- element access (host-accessible spaces only) ----
  template <class... I>
    requires(sizeof...(I) == R && (std::is_integral_v<I> && ...) && Space::host_accessible)
  T& operator()(I... idx) noexcept { return data()[offset_of(idx...)]; }
  template <class... I>
    requires(sizeof...(I) == R && (std::is_integral_v<I> && ...) && Space::host_accessible)
  const T& operator()(I... idx) const noexcept { return data()[offset_of(idx...)]; }
  T& operator[](Extent flat) noexcept requires(Space::host_accessible) { return data()[flat]; }
  const T& operator[](Extent flat) const noexcept requires(Space::host_accessible) { return data()[flat]; }
  // On a device space these exist only to say why they cannot be used.
  template <class... I>
    requires(!Space::host_accessible)
  T& operator()(I...) const {
    static_assert(sizeof...(I) < 0, "element access needs a host-accessible memory space: copy the tensor "
                                    "with to_space<host_space>(t), or use a device kernel");
  }
  template <class I>
    requires(!Space::host_accessible)
  T& operator[](I) const {
    static_assert(sizeof(I) < 0, "element access needs a host-accessible memory space: copy the tensor "
                                 "with to_space<host_space>(t), or use a device kernel");
  }

  /// Elements [start, start + length) along dimension `dim`, as a new tensor.
  Tensor slice(std::size_t dim, Extent start, Extent length) const;

  // Internal: a tensor over existing storage (reshape, conversion between ranks).
  static Tensor adopt(detail::Buffer<T, Space>&& storage, const Shape<R>& shape) {
    Tensor t;
    t.shape_ = shape;
    t.storage_ = std::move(storage);
    return t;
  }

 private:
  template <class... I>
  Extent offset_of(I... idx) const noexcept {
    const Extent ix[] = {Extent(idx)...};
    Extent off = 0;
    for (std::size_t d = 0; d < R; ++d) off = off * shape_[d] + ix[d];
    return off;
  }
  Tensor& write_through(const Tensor& o) {
    if (o.shape_ != shape_) detail::throw_view_extents(o.shape_, shape_);
    Space::copy(data(), o.data(), bytes());
    return *this;
  }
  /// No negative extent, and an element count that does not overflow.
  template <std::size_t R2>
  static void check_shape(const char* op, const Shape<R2>& s) {
    (void)checked_numel(s, op);
  }

  Shape<R> shape_{};
  detail::Buffer<T, Space> storage_;
};

/// Copies the box of extents `ext` at `src_off` in src to `dst_off` in dst.
template <Element T, std::size_t R, MemorySpace Space>
void copy_box(const Tensor<T, R, Space>& src, const Shape<R>& src_off, Tensor<T, R, Space>& dst,
              const Shape<R>& dst_off, const Shape<R>& ext) {
  for (std::size_t i = 0; i < R; ++i)
    if (src_off[i] < 0 || dst_off[i] < 0 || ext[i] < 0 || src_off[i] + ext[i] > src.extent(i) ||
        dst_off[i] + ext[i] > dst.extent(i))
      detail::throw_box_out_of_bounds(ext, src_off, src.shape(), dst_off, dst.shape());
  detail::copy_box_raw<Space>(src.data(), src.shape(), src_off, dst.data(), dst.shape(), dst_off, ext, sizeof(T));
}

/// A view (no copy) of numel(shape) elements of t from element `offset` on, read row-major as
/// `shape`: a window into t's storage (one expert's rows or weight). Writing through it writes t,
/// also when t is const: the caller decides. A meta tensor's null stays null.
template <std::size_t R2, Element T, std::size_t R, MemorySpace Space>
Tensor<T, R2, Space> view_of(const Tensor<T, R, Space>& t, Extent offset, const Shape<R2>& shape) {
  if (offset < 0 || offset + numel(shape) > t.numel())
    throw Error("view_of", detail::cat(to_string(shape), " at element ", offset, " of ", to_string(t.shape()),
                                       " is out of bounds"));
  T* base = const_cast<T*>(t.data());
  return Tensor<T, R2, Space>::view(base ? base + offset : nullptr, shape);
}

/// The same tensor in memory space To (a copy, also when To is the tensor's own space).
/// Between two spaces the bytes move through the one that is not host-accessible: a device
/// space's copy takes host pointers on either side (cuda_space does, through unified addressing).
template <MemorySpace To, Element T, std::size_t R, MemorySpace From>
Tensor<T, R, To> to_space(const Tensor<T, R, From>& t) {
  static_assert(To::host_accessible || From::host_accessible || std::is_same_v<To, From>,
                "to_space: copies between two different device spaces are not supported; go through host_space");
  using Mover = std::conditional_t<!To::host_accessible, To, From>;
  auto out = Tensor<T, R, To>::uninitialized(t.shape());
  Mover::copy(out.data(), t.data(), t.bytes());
  return out;
}

/// t itself when it is already in space To, else its copy there (to_space).
template <MemorySpace To, Element T, std::size_t R, MemorySpace From>
Tensor<T, R, To> into_space(Tensor<T, R, From>&& t) {
  if constexpr (std::is_same_v<To, From>) return std::move(t);
  else return to_space<To>(t);
}

}  // namespace dtensor

template <dtensor::Element T, std::size_t R, dtensor::MemorySpace Space>
dtensor::Tensor<T, R, Space> dtensor::Tensor<T, R, Space>::slice(std::size_t dim, Extent start, Extent length) const {
  if (dim >= R || start < 0 || length < 0 || start + length > shape_[dim])
    throw Error("Tensor::slice", detail::cat("dimension ", dim, " range [", start, ", ", start + length,
                                             ") out of ", to_string(shape_)));
  Shape<R> ext = shape_;
  ext[dim] = length;
  Shape<R> from{};
  from[dim] = start;
  auto out = Tensor::uninitialized(ext);
  copy_box(*this, from, out, Shape<R>{}, ext);
  return out;
}
