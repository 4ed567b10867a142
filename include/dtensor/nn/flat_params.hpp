// dtensor/nn/flat_params.hpp — the parameters of a module group in one flat buffer.
//
//   auto group = nn::flatten<float, Mesh::ndim>("h.0", block);   // block's parameters now live in group
//   group->values()                 // every local piece, one after the other (registration order)
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
// Host memory for now; the entries' metadata is the same for every memory space.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/placement/layout.hpp"

namespace dtensor::nn {

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
};

template <class T, std::size_t N>
class FlatParams {
 public:
  using Entry = FlatEntry<N>;

  /// A group of the given entries (offsets assigned here, in order), values and gradients zero.
  FlatParams(std::string name, std::vector<Entry> entries) : name_(std::move(name)), entries_(std::move(entries)) {
    std::size_t total = 0;
    for (auto& e : entries_) {
      e.offset = total;
      total += e.numel;
    }
    values_ = Tensor<T, 1>(Shape<1>{Extent(total)});
    grads_ = Tensor<T, 1>(Shape<1>{Extent(total)});
  }
  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  const std::string& name() const noexcept { return name_; }
  std::span<T> values() noexcept { return values_.span(); }
  std::span<T> grads() noexcept { return grads_.span(); }
  std::span<const T> values() const noexcept { return values_.span(); }
  std::span<const T> grads() const noexcept { return grads_.span(); }
  std::size_t size() const noexcept { return std::size_t(values_.numel()); }
  std::vector<Entry>& entries() noexcept { return entries_; }
  const std::vector<Entry>& entries() const noexcept { return entries_; }

  std::span<T> value(std::size_t i) { return values().subspan(entries_.at(i).offset, entries_[i].numel); }
  std::span<T> grad(std::size_t i) { return grads().subspan(entries_.at(i).offset, entries_[i].numel); }

  /// The entry called `name`; throws naming the group when there is none.
  const Entry& entry(const std::string& name) const {
    for (const auto& e : entries_)
      if (e.name == name) return e;
    throw Error("FlatParams::entry", dtensor::detail::cat("group ", name_, " has no parameter ", name));
  }

 private:
  std::string name_;
  std::vector<Entry> entries_;
  Tensor<T, 1> values_, grads_;
};

}  // namespace dtensor::nn
