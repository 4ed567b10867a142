// dtensor/parallel/sync/delayed_gradients.hpp — asynchronous data parallelism with bounded
// staleness: the gradient all-reduce of step t is applied at step t + s.
//
//   parallel::sync::DelayedGradients<float, Mesh> delayed(mesh, params, /*staleness=*/1);
//   for (...) {
//     zero_grad; forward; backward;       // gradients Partial on the data dimension
//     if (delayed.exchange()) opt.step();  // starts this step's all-reduce; puts step t - s's into the gradients
//   }
//   delayed.drain();                       // wait for what is still in flight (dropped)
//
// exchange() copies this step's local gradients into a new slot, starts their all-reduce on the
// data dimension asynchronously (one collective per step over all the gradients; Partial<sum> is
// summed, Partial<avg> averaged, as DataParallel), and, once s + 1 slots are in flight, waits for
// the oldest — issued s steps ago, so its communication had s whole steps of compute to hide
// behind — copies it into the gradients and marks them Replicate there. During the first s steps
// it returns false: no reduced gradient exists yet, the optimizer must not step. s = 0 is DDP:
// the all-reduce is waited for at once.
//
// The update is θ_{t+1} = θ_t − η·g(θ_{t−s}): the gradient was computed at parameters s steps
// old. Convergence caveats (docs/beyond-sync.md): the staleness acts like extra momentum; a
// learning rate that is stable for s = 0 can diverge for larger s (the stable rate shrinks about
// as 1/(s + 1) for SGD on a quadratic); adaptive optimizers' moments see the same stale
// gradients; the first s steps do not update at all. Memory: s + 1 gradient-sized slots
// (counted as communication memory).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <span>
#include <optional>
#include <vector>

#include "dtensor/comm/work.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/parallel/sync/detail/replicas.hpp"

namespace dtensor::parallel::sync {

template <class T, MeshType Mesh, fixed_string Dim = "">
class DelayedGradients {
 public:
  using value_type = T;  // what checkpoint/sync_state.hpp reads (no deduction through Dim)
  static constexpr std::size_t dim = parallel::detail::data_parallel_dim<Mesh, Dim>();
  static constexpr std::size_t N = Mesh::ndim;
  using Space = mesh_space_t<Mesh>;
  using List = nn::ParamList<T, N, Space>;

  DelayedGradients(Mesh mesh, List params, int staleness) : mesh_(std::move(mesh)), params_(std::move(params)), s_(staleness) {
    if (staleness < 0)
      throw Error("DelayedGradients", detail::cat("staleness s = ", staleness, ": must be >= 0 (0 is DDP)"), mesh_.rank());
    detail::check_replicated("DelayedGradients", mesh_, dim, params_);
    elements_ = detail::local_elements(params_);
  }
  DelayedGradients(const DelayedGradients&) = delete;
  DelayedGradients& operator=(const DelayedGradients&) = delete;
  ~DelayedGradients() {
    try {
      drain();
    } catch (...) {  // a failed collective is reported where it is waited on, not here
    }
  }

  /// Starts this step's all-reduce; returns true when the gradients now hold the reduced
  /// gradients of step t − s (Replicate on the data dimension), false in the first s steps.
  bool exchange() {
    const ReduceOp op = pending_op();
    Slot slot;
    {
      MemoryTagScope tag(MemoryTag::communication);
      slot.buf = Tensor<T, 1, Space>::uninitialized(Shape<1>{Extent(elements_)});
    }
    std::size_t off = 0;
    for (const auto& p : params_) {  // a bf16 gradient shard (ParamRef::narrow_grad) widens into the slot
      p.visit_grad([&](auto g) { parallel::detail::convert_flat<Space>(std::span<T>(slot.buf.data() + off, g.size()), g); });
      off += p.grad_size();
    }
    slot.work = mesh_.group(dim).all_reduce_async(std::span<const T>(slot.buf.span()), slot.buf.span(), op);
    slots_.push_back(std::move(slot));
    ++issued_;
    if (slots_.size() <= std::size_t(s_)) return false;
    Slot oldest = std::move(slots_.front());
    slots_.pop_front();
    oldest.work.wait();
    off = 0;
    for (auto& p : params_) {
      p.visit_grad([&](auto g) { parallel::detail::convert_flat<Space>(g, std::span<T>(oldest.buf.data() + off, g.size())); });
      off += p.grad_size();
      p.grad_state->placements[dim] = PlacementDesc::replicate();
      *p.has_grad = true;
    }
    return true;
  }

  /// Waits for every all-reduce in flight and drops it (the end of training). Returns how many.
  std::size_t drain() {
    const std::size_t n = slots_.size();
    while (!slots_.empty()) {
      slots_.front().work.wait();
      slots_.pop_front();
    }
    return n;
  }

  /// For a checkpoint: waits for every all-reduce in flight and returns their reduced buffers,
  /// oldest first (still queued: exchange() applies them as before). A resumed run refills them
  /// through restore().
  std::vector<std::span<T>> settle() {
    std::vector<std::span<T>> out;
    for (auto& slot : slots_) {
      slot.work.wait();
      out.push_back(slot.buf.span());
    }
    return out;
  }

  /// After a resume: `issued` steps were exchanged before the checkpoint, so min(s, issued)
  /// reduced gradients are pending; returns their buffers (oldest first) to load into. Only on
  /// a fresh object.
  std::vector<std::span<T>> restore(long issued) {
    if (issued < 0 || issued_ != 0 || !slots_.empty())
      mesh_.comm().fail("DelayedGradients::restore", detail::cat("issued = ", issued, " on an object that issued ", issued_,
                                                                 " (", slots_.size(), " in flight): restore a fresh one"));
    const std::size_t n = std::size_t(std::min<long>(s_, issued));
    std::vector<std::span<T>> out;
    for (std::size_t i = 0; i < n; ++i) {
      Slot slot;
      MemoryTagScope tag(MemoryTag::communication);
      slot.buf = Tensor<T, 1, Space>::uninitialized(Shape<1>{Extent(elements_)});
      slots_.push_back(std::move(slot));  // its Work is default: already complete
      out.push_back(slots_.back().buf.span());
    }
    issued_ = issued;
    return out;
  }

  int staleness() const noexcept { return s_; }
  std::size_t in_flight() const noexcept { return slots_.size(); }
  long issued() const noexcept { return issued_; }

 private:
  struct Slot {
    Tensor<T, 1, Space> buf;
    Work work;
  };

  /// The one reduction op of the pending gradients (all Partial on the data dimension).
  ReduceOp pending_op() const {
    std::optional<ReduceOp> op;
    for (const auto& p : params_) {
      const auto& pl = p.grad_state->placements[dim];
      if (!pl.is_partial())
        mesh_.comm().fail("DelayedGradients", detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                                          ", not Partial on the data dimension \"", Mesh::names[dim],
                                                          "\": reduced already, or no backward since zero_grad"));
      if (op && *op != pl.op)
        mesh_.comm().fail("DelayedGradients", detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                                          ": one reduction op for all gradients (one all-reduce per step)"));
      op = pl.op;
    }
    return op.value_or(ReduceOp::sum);
  }

  Mesh mesh_;
  List params_;
  int s_;
  std::size_t elements_ = 0;
  std::deque<Slot> slots_;
  long issued_ = 0;
};

}  // namespace dtensor::parallel::sync
