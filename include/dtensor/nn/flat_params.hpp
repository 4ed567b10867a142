// dtensor/nn/flat_params.hpp — the parameters of a module group in one flat buffer.
//
//   auto group = nn::flatten<float, Mesh::ndim>("h.0", block);   // block's parameters now live in group
//   group->values()                 // every local piece, one after the other (registration order; a
//                                   // piece smaller than the room its entry reserves, FlatEntry::slot,
//                                   // is followed by zeros)
//   group->grads()                  // their gradients, the same structure
//   for (auto& e : group->entries())  e.name, e.global_shape, e.layout, e.local_offset, e.offset, e.numel
//
// A parameter (nn::Parameter) is a view into a group: its value is a window of values(), its
// gradient the same window of grads(), its gradient state (the placements still pending, e.g.
// Partial on the data dimensions until DDP has reduced them) is its entry's grad_state. A
// parameter made alone gets a group of its own; flatten() moves the parameters of a module
// group (a transformer block, the embeddings, the head: FSDP's units) into one new group and
// re-points their views, so that
//   - DDP reduces a group's gradients in place, one contiguous span per bucket (no copy);
//   - optimizers keep their state as flat buffers of the same structure;
//   - FSDP shards a group's flat buffer, and a checkpoint enumerates it by name and box.
// Groups are shared (std::shared_ptr) by their parameters, so modules may be moved freely.
// The buffers live in the mesh's memory space (host, cuda or meta: a meta group holds no
// elements but reports its bytes to the allocation ledger, tagged parameters and gradients);
// the entries' metadata is the same for every space. Spans of a non-host group point into that
// space (device pointers, or null on meta) and are never read on the host: code above the
// kernels turns them into tensors of the space (flat_view) and calls the space's kernels.
//
// Deferred initialisation (nn::DeferredInit, a scope on the calling thread): a parameter made
// from an nn::Init inside the scope allocates nothing; its entry keeps the Init (seed, mean,
// standard deviation), and a group whose every entry has one is `deferred()`: no values, no
// gradients. Whoever takes the group over materialises only what it keeps: FSDP
// (parallel/fsdp/unit_state.hpp) fills its shard [lo, hi) of the flat buffer straight from
// the Inits (initial_values), the same values bit for bit as the eager path draws whole and
// cuts (core/factories.hpp: detail::NormalStream); anything else that touches the values
// (Parameter::value, collect, the gradients, nn::flatten of a mixed module) materialises the
// whole group first (ensure_materialized), as if it had been built eagerly. A parameter made
// from a value (not an Init) is always built eagerly, and so is the group it is flattened into.
//
// FSDP (parallel/fully_shard.hpp) frees a unit's full buffers while the unit is sharded:
// release_values() / release_grads() drop the storage, materialize_values(capacity) /
// materialize_grads(capacity) allocate it again with room for `capacity` >= size() elements
// (the padded all-gather / reduce-scatter size, so the collectives run in place); on a resident
// buffer with less room they grow it and keep its elements. The storage may move: parameters
// re-point their views on their next value() (nn/parameter.hpp), and a ParamRef taken before a
// release dangles. value(i) / grad(i) throw while released.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/placement/layout.hpp"

namespace dtensor::nn {

/// How a parameter's values start. The full tensor is drawn from the seed on every rank and
/// then split (no communication), so every layout and mesh starts from the same values; on a
/// cuda mesh it is drawn on the host and copied, on a meta mesh nothing is drawn. Under
/// nn::DeferredInit only the elements a rank keeps are drawn (initial_values below).
struct Init {
  enum class Kind { zeros, ones, normal };
  Kind kind = Kind::zeros;
  std::uint64_t seed = 0;
  double mean = 0, stddev = 1;

  static constexpr Init zeros() { return {}; }
  static constexpr Init ones() { return {Kind::ones}; }
  static constexpr Init normal(std::uint64_t seed, double mean, double stddev) {
    return {Kind::normal, seed, mean, stddev};
  }
};

namespace detail {
inline bool& deferred_init_flag() noexcept {
  thread_local bool on = false;
  return on;
}
}  // namespace detail

/// While alive, parameters made from an nn::Init on this thread are deferred (see the top of
/// this file). Nests; restores the previous setting.
class DeferredInit {
 public:
  explicit DeferredInit(bool on = true) noexcept : saved_(detail::deferred_init_flag()) { detail::deferred_init_flag() = on; }
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
  ~DeferredInit() { detail::deferred_init_flag() = saved_; }
  static bool active() noexcept { return detail::deferred_init_flag(); }

 private:
  bool saved_;
};

/// One parameter's place in a group and what it is.
template <std::size_t N>
struct FlatEntry {
  std::string name;
  std::vector<Extent> global_shape;  // the logical tensor's extents
  std::vector<Extent> local_offset;  // where this rank's piece sits in it
  std::vector<Extent> local_extent;  // the piece's extents
  LayoutDesc<N> layout;              // the parameter's placements
  LayoutDesc<N> grad_state;          // the gradient's placements now (Partial = reduction pending)
  bool has_grad = false;             // a gradient was added since the last zero_grad
  bool decay = true;                 // weight decay applies (not to biases and norm weights)
  std::size_t offset = 0;            // first element in values() / grads()
  std::size_t numel = 0;             // elements of the local piece
  // The mesh the piece was cut on and this rank's place in it (nn::Parameter sets them; left
  // at 0, the entry reserves its own piece): what the group needs to work out `slot`.
  std::array<int, N> mesh_shape{};
  std::array<int, N> mesh_coordinate{};
  // Elements reserved for the piece in the flat buffer, set by the group (FlatParams, from
  // detail::reserved_slot): the largest piece of the parameter over the ranks that must agree on
  // the group's offsets, which are those differing from this one only along the mesh dimensions
  // where some entry of the group is not Shard. Along such a dimension ranks exchange or align
  // flat ranges: FSDP cuts the same ranges of the buffer on every rank of its shard group (a
  // Replicate dimension), and a parameter replicated there whose gradient is reduced over it
  // (a norm under sequence parallelism, Partial on "tp") needs the same segments on every rank
  // of it, so the parameters before it must take the same room everywhere: a vocabulary of 27
  // over 2 tensor-parallel ranks (14 and 13 rows) in a group with such a norm leaves a gap of
  // zeros after the 13. Along a dimension where every entry of the group is Shard the ranks hold
  // disjoint data and never exchange flat ranges (experts over "ep": 5 over 2 are 3 and 2, each
  // reduced over "edp" only), so each rank reserves its own piece there and the buffer's size
  // may differ between them.
  std::size_t slot = 0;
  // Deferred initialisation: how the values start, while they are not materialised (reset
  // once they are: an entry with an Init has no values anywhere yet).
  std::optional<Init> init{};
  std::size_t reserved() const noexcept { return slot > numel ? slot : numel; }
};

namespace detail {
/// A span of a flat buffer of memory space Space as a 1-D tensor view (no copy), for the kernels.
template <MemorySpace Space, class T>
Tensor<std::remove_const_t<T>, 1, Space> flat_view(std::span<T> s) {
  using U = std::remove_const_t<T>;
  return Tensor<U, 1, Space>::view(const_cast<U*>(s.data()), Shape<1>{Extent(s.size())});
}
/// The mesh dimensions along which a group's entries must take the same room on every rank:
/// those where some entry is not Shard (see FlatEntry::slot).
template <std::size_t N>
std::array<bool, N> aligned_dims(const std::vector<FlatEntry<N>>& entries) {
  std::array<bool, N> aligned{};
  for (const auto& e : entries)
    for (std::size_t d = 0; d < N; ++d) aligned[d] = aligned[d] || !e.layout.placements[d].is_shard();
  return aligned;
}

/// The elements entry e reserves in a group whose aligned dimensions are `aligned`: its largest
/// piece over the coordinates that differ from its own only along aligned dimensions it is
/// Shard on (the others do not change the piece). Every such coordinate is tried: nested splits
/// of one tensor dimension need not put the largest piece at coordinate 0 of the outer one once
/// the inner coordinate is the rank's own. An entry without its mesh (mesh_shape unset) reserves
/// its own piece.
template <std::size_t N>
std::size_t reserved_slot(const FlatEntry<N>& e, const std::array<bool, N>& aligned) {
  std::array<int, N> c = e.mesh_coordinate;
  std::vector<std::size_t> varying;
  for (std::size_t d = 0; d < N; ++d) {
    if (e.mesh_shape[d] < 1) return e.numel;
    if (aligned[d] && e.layout.placements[d].is_shard() && e.mesh_shape[d] > 1) {
      varying.push_back(d);
      c[d] = 0;
    }
  }
  std::size_t largest = e.numel;
  for (;;) {
    std::size_t piece = 1;
    for (std::size_t t = 0; t < e.global_shape.size(); ++t)
      piece *= std::size_t(dtensor::local_range(e.layout, e.mesh_shape, c, int(t), e.global_shape[t]).size());
    largest = std::max(largest, piece);
    std::size_t k = varying.size();  // the next coordinate, the last varying dimension fastest
    while (k > 0 && ++c[varying[k - 1]] == e.mesh_shape[varying[k - 1]]) c[varying[--k]] = 0;
    if (k == 0) return largest;
  }
}

/// Elements [lo, lo + out.size()) of a flat buffer whose entries all have an Init, into host
/// memory: each entry's local piece as Init would draw the whole parameter and cut it (the
/// piece's elements in row-major order, mapped to their flat index in the global tensor), zero
/// in the gaps after short pieces and in the padding past the last entry.
template <class T, std::size_t N>
void initial_values(const std::vector<FlatEntry<N>>& entries, std::size_t lo, std::span<T> out) {
  std::fill(out.begin(), out.end(), T(0));
  const std::size_t hi = lo + out.size();
  for (const auto& e : entries) {
    if (!e.init) throw Error("nn::initial_values", dtensor::detail::cat(e.name, ": no Init to draw the values from"));
    const std::size_t b = std::max(lo, e.offset), en = std::min(hi, e.offset + e.numel);
    if (b >= en || e.init->kind == Init::Kind::zeros) continue;
    T* dst = out.data() + (b - lo);
    if (e.init->kind == Init::Kind::ones) {
      std::fill(dst, dst + (en - b), T(1));
      continue;
    }
    const std::size_t rank = e.global_shape.size();
    std::vector<std::uint64_t> idx(rank);  // the local multi-index of element b - e.offset
    std::size_t k = b - e.offset;
    for (std::size_t d = rank; d-- > 0;) {
      idx[d] = std::uint64_t(k % std::size_t(e.local_extent[d]));
      k /= std::size_t(e.local_extent[d]);
    }
    dtensor::detail::NormalStream normal(e.init->seed, e.init->mean, e.init->stddev);
    for (std::size_t i = b; i < en; ++i) {
      std::uint64_t g = 0;  // its flat index in the global tensor
      for (std::size_t d = 0; d < rank; ++d) g = g * std::uint64_t(e.global_shape[d]) + std::uint64_t(e.local_offset[d]) + idx[d];
      *dst++ = T(normal.at(g));
      for (std::size_t d = rank; d-- > 0;) {  // the next local multi-index
        if (++idx[d] < std::uint64_t(e.local_extent[d])) break;
        idx[d] = 0;
      }
    }
  }
}

/// Sets a flat buffer of memory space Space to zero.
template <MemorySpace Space, class T>
void zero_flat(std::span<T> s) {
  Space::zero(s.data(), s.size_bytes());
}
}  // namespace detail

template <class T, std::size_t N, MemorySpace Space = host_space>
class FlatParams {
 public:
  using Entry = FlatEntry<N>;
  using element_type = T;
  using space = Space;

  /// A group of the given entries (offsets assigned here, in order), values and gradients zero;
  /// deferred (nothing allocated) when every entry has an Init (see the top of this file).
  FlatParams(std::string name, std::vector<Entry> entries) : name_(std::move(name)), entries_(std::move(entries)) {
    std::size_t total = 0;
    deferred_ = !entries_.empty();
    const auto aligned = detail::aligned_dims(entries_);
    for (auto& e : entries_) {
      e.slot = detail::reserved_slot(e, aligned);
      e.offset = total;
      total += e.reserved();
      deferred_ = deferred_ && e.init.has_value();
    }
    size_ = total;
    if (deferred_) return;
    for (auto& e : entries_) e.init.reset();
    {
      MemoryTagScope tag(MemoryTag::parameters);
      values_ = Buffer(Shape<1>{Extent(total)});
    }
    MemoryTagScope tag(MemoryTag::gradients);
    grads_ = Buffer(Shape<1>{Extent(total)});
  }
  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  const std::string& name() const noexcept { return name_; }
  std::span<T> values() noexcept { return values_.span(); }
  std::span<T> grads() noexcept { return grads_.span(); }
  std::span<const T> values() const noexcept { return values_.span(); }
  std::span<const T> grads() const noexcept { return grads_.span(); }
  std::size_t size() const noexcept { return size_; }
  std::vector<Entry>& entries() noexcept { return entries_; }
  const std::vector<Entry>& entries() const noexcept { return entries_; }

  // ---------------------------------------------------------------- deferred initialisation
  /// Whether the values exist nowhere yet (every entry has its Init; nothing allocated).
  bool deferred() const noexcept { return deferred_; }
  /// Elements [lo, lo + out.size()) of the values as they will start, into host memory (the
  /// padding past size() zero); the group must be deferred.
  void initial_values(std::size_t lo, std::span<T> out) const {
    if (!deferred_) throw Error("FlatParams::initial_values", dtensor::detail::cat("group ", name_, " is not deferred: its values exist"));
    detail::initial_values<T, N>(entries_, lo, out);
  }
  /// The values now live elsewhere (FSDP's shards, which drew them): the group is an ordinary
  /// released one from here on.
  void end_deferred() noexcept {
    deferred_ = false;
    for (auto& e : entries_) e.init.reset();
  }
  /// A deferred group made whole: every value drawn, the gradients zero (no-op otherwise).
  void ensure_materialized() {
    if (!deferred_) return;
    materialize_values(size_);  // fills them from the Inits
    materialize_grads(size_);
  }

  std::span<T> value(std::size_t i) {
    require_resident("FlatParams::value", values_resident(), "values");
    return values().subspan(entries_.at(i).offset, entries_[i].numel);
  }
  std::span<T> grad(std::size_t i) {
    require_resident("FlatParams::grad", grads_resident(), "gradients");
    return grads().subspan(entries_.at(i).offset, entries_[i].numel);
  }

  // ---------------------------------------------------------------- storage (FSDP)
  /// fully_shard has taken this group over: its parameters' ParamRefs (model.collect) are no
  /// longer what an optimizer may step (fully_shard(...).params() are). Never cleared.
  void set_sharded() noexcept { sharded_ = true; }
  bool sharded() const noexcept { return sharded_; }
  const bool* sharded_flag() const noexcept { return &sharded_; }
  bool values_resident() const noexcept { return std::size_t(values_.numel()) == size_; }
  bool grads_resident() const noexcept { return std::size_t(grads_.numel()) == size_; }
  /// Frees the values / gradients (the group keeps its entries).
  void release_values() { values_ = Buffer(); }
  void release_grads() { grads_ = Buffer(); }
  /// Allocates uninitialized values with room for `capacity` elements (the padding past size()
  /// belongs to no entry); no-op when already resident with that room, and a resident buffer
  /// with less room keeps its values (the padding uninitialized).
  /// A deferred group's values are drawn from the Inits (and the group is deferred no more).
  void materialize_values(std::size_t capacity) {
    materialize(values_, capacity, false, MemoryTag::parameters);
    if (!deferred_) return;
    if constexpr (std::is_same_v<Space, host_space>) {
      detail::initial_values<T, N>(entries_, 0, values_.span());
    } else if constexpr (holds_data_v<Space>) {  // drawn on the host, then copied (a device's copy takes host pointers)
      std::vector<T> staged(size_);
      detail::initial_values<T, N>(entries_, 0, std::span<T>(staged));
      Space::copy(values_.data(), staged.data(), size_ * sizeof(T));
    }
    end_deferred();
  }
  /// Allocates zero gradients with room for `capacity` elements (padding zero too); a resident
  /// buffer with less room keeps its gradients (the new padding zero).
  void materialize_grads(std::size_t capacity) { materialize(grads_, capacity, true, MemoryTag::gradients); }
  /// The whole allocation behind values() / grads(), padding included (empty while released).
  std::span<T> values_storage() noexcept { return {values_.data(), std::size_t(values_.capacity())}; }
  std::span<T> grads_storage() noexcept { return {grads_.data(), std::size_t(grads_.capacity())}; }
  /// Bytes held now by the values and gradients (their allocations, padding included).
  std::size_t resident_bytes() const noexcept { return std::size_t(values_.capacity() + grads_.capacity()) * sizeof(T); }

  /// The entry called `name`; throws naming the group when there is none.
  const Entry& entry(const std::string& name) const {
    for (const auto& e : entries_)
      if (e.name == name) return e;
    throw Error("FlatParams::entry", dtensor::detail::cat("group ", name_, " has no parameter ", name));
  }

 private:
  void require_resident(const char* op, bool resident, const char* what) const {
    if (!resident && deferred_)
      throw Error(op, dtensor::detail::cat("the ", what, " of group ", name_,
                                           " are not materialised yet (deferred initialisation): ensure_materialized() first"));
    if (!resident)
      throw Error(op, dtensor::detail::cat("the ", what, " of group ", name_,
                                           " are released (sharded by FSDP): unshard the unit before use"));
  }
  using Buffer = Tensor<T, 1, Space>;
  void materialize(Buffer& t, std::size_t capacity, bool zero, MemoryTag what) {
    if (capacity < size_)
      throw Error("FlatParams::materialize", dtensor::detail::cat("group ", name_, ": capacity ", capacity, " < size ", size_));
    const bool resident = std::size_t(t.numel()) == size_;
    if (resident && std::size_t(t.capacity()) >= capacity) return;
    MemoryTagScope tag(what);
    Buffer grown = Buffer::with_capacity(Shape<1>{Extent(size_)}, Extent(capacity));
    if (resident) {
      // Growing a resident buffer (ZeRO-1/2 make room for the padded all-gather of a unit whose
      // size the shard count does not divide) keeps its contents: the values or accumulated
      // gradients are the model's, not scratch.
      Space::copy(grown.data(), t.data(), size_ * sizeof(T));
      if (zero && grown.data()) Space::zero(grown.data() + size_, (capacity - size_) * sizeof(T));  // meta: null
    } else if (zero) {
      Space::zero(grown.data(), capacity * sizeof(T));
    }
    t = std::move(grown);
  }

  std::string name_;
  std::vector<Entry> entries_;
  std::size_t size_ = 0;
  Buffer values_, grads_;
  bool sharded_ = false;
  bool deferred_ = false;
};

}  // namespace dtensor::nn
