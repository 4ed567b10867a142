// dtensor/parallel/sync/diloco.hpp — local SGD and DiLoCo over a replica dimension: H inner
// steps without communication, then one outer step on the averaged pseudo-gradient.
//
//   using Mesh = DeviceMesh<"dp", "fsdp", "tp">;                    // replicas on "dp", FSDP x TP inside
//   optim::AdamW<float, 3> inner(params, {...});                    // the inner optimizer: the user's
//   parallel::sync::DiLoCo<float, Mesh> outer(mesh, params, {.inner_steps = 50});   // Nesterov SGD outside
//   for (...) {
//     zero_grad; forward; backward;          // gradients reduced inside the replica only (not on "dp")
//     inner.step();
//     outer.step();                          // every H-th call: the outer sync (one all-reduce per fragment)
//   }
//   DiLoCoOptions::local_sgd(H)              // outer SGD of rate 1, no momentum: plain periodic averaging
//
// The outer sync (Douillard et al., "DiLoCo", 2023): the pseudo-gradient Δ = θ_sync − θ (the
// parameters at the last sync minus now) is all-reduced (averaged) over the replica dimension,
// θ is reset to θ_sync, and the outer optimizer — optim::SGD with Nesterov momentum, lr 0.7,
// momentum 0.9 by default, as the paper — steps θ_sync with Δ as its gradient; every replica
// then continues from the new θ_sync. Local SGD (Stich 2019; Lin et al. 2020) is the special
// case of an outer SGD of rate 1 without momentum: θ_sync − avg(Δ) = avg(θ).
//
// Collectives: per sync, one all-reduce (avg) on the replica dimension per fragment, over the
// fragment's local elements — nothing in the other H − 1 steps, so H times fewer all-reduce bytes
// than DDP's per-step gradient all-reduce of the same elements. bf16_reduce sends Δ as bfloat16
// (half the bytes; Δ is rounded once, the average is formed in bfloat16 by the backend).
// Streaming DiLoCo (Douillard et al. 2025) in its simple form: `fragments` F > 1 cuts the
// parameter list into F contiguous pieces of about equal size; fragment f syncs at the inner
// steps t with t ≡ (f + 1)·H / F (mod H), each with its own outer momentum, so the peak bytes
// of one sync drop F times. overlap_steps τ > 0 overlaps a fragment's outer all-reduce with the
// next τ inner steps (the paper's overlap): at its due step the fragment's Δ is computed and its
// all-reduce issued asynchronously (comm/work.hpp), the replicas keep training, and τ steps later
// the all-reduce is waited for, the outer step applied to θ_sync, and the fragment's parameters
// set to (1 − α)·θ_sync + α·θ_local (α = overlap_alpha; 0 drops the τ local steps of that
// fragment, the paper mixes 0.5): the fragment's update lands with delay τ. τ = 0 is the blocking
// form exactly; the bytes are the same. τ < H (a fragment's next sync comes after its last).
//
// Composes with FSDP and TP inside a replica: the list is whatever the inner optimizer steps
// (FSDP's shards, TP's pieces); every parameter must be Replicate on the replica dimension
// (detail/replicas.hpp). The gradients there must not be reduced (no DataParallel / HSDP
// all-reduce on it): each replica follows its own data. The state for a checkpoint: inner_step(),
// anchor() (θ_sync) and outer(f) (the outer optimizers' momentum, optim::SGD::momentum_buffer);
// checkpoint/sync_state.hpp saves it with each replica's own parameters (they differ mid-round).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "dtensor/comm/work.hpp"
#include "dtensor/core/bfloat16.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/detail/convert.hpp"
#include "dtensor/parallel/sync/detail/replicas.hpp"

namespace dtensor::parallel::sync {

struct DiLoCoOptions {
  int inner_steps = 50;         // H: inner steps between two syncs of a fragment
  double outer_lr = 0.7;        // the paper's outer learning rate ...
  double outer_momentum = 0.9;  // ... and Nesterov momentum
  bool nesterov = true;
  bool bf16_reduce = false;     // the outer all-reduce in bfloat16 (half the bytes)
  int fragments = 1;            // Streaming DiLoCo: staggered syncs of F pieces of the parameters
  int overlap_steps = 0;        // τ: a fragment's outer all-reduce completes τ inner steps after issue
  double overlap_alpha = 0;     // α: the merge θ ← (1 − α)·θ_sync + α·θ_local when it completes

  /// Local SGD: average the replicas every H steps (outer SGD of rate 1, no momentum).
  static DiLoCoOptions local_sgd(int h) {
    return {.inner_steps = h, .outer_lr = 1, .outer_momentum = 0, .nesterov = false};
  }
};

template <class T, MeshType Mesh, fixed_string Dim = "">
class DiLoCo {
 public:
  using value_type = T;  // what checkpoint/sync_state.hpp reads (no deduction through Dim)
  static constexpr std::size_t dim = parallel::detail::data_parallel_dim<Mesh, Dim>();
  static constexpr std::size_t N = Mesh::ndim;
  using Space = mesh_space_t<Mesh>;
  using List = nn::ParamList<T, N, Space>;

  DiLoCo(Mesh mesh, List params, DiLoCoOptions o = {}) : mesh_(std::move(mesh)), params_(std::move(params)), o_(o) {
    const int rank = mesh_.rank();
    if (params_.empty()) throw Error("DiLoCo", "no parameters to synchronize", rank);
    if (o.inner_steps < 1)
      throw Error("DiLoCo", detail::cat("inner_steps H = ", o.inner_steps, ": must be >= 1 (H = 1 with outer SGD of "
                                        "rate 1 is DDP with averaged parameters)"), rank);
    if (o.fragments < 1 || o.fragments > o.inner_steps || std::size_t(o.fragments) > std::max<std::size_t>(1, params_.size()))
      throw Error("DiLoCo", detail::cat("fragments = ", o.fragments, " must be in [1, min(H = ", o.inner_steps,
                                        ", parameters = ", params_.size(), ")]"), rank);
    if (o.overlap_steps < 0 || o.overlap_steps >= o.inner_steps || !(o.overlap_alpha >= 0 && o.overlap_alpha <= 1))
      throw Error("DiLoCo", detail::cat("overlap_steps tau = ", o.overlap_steps, ", overlap_alpha = ", o.overlap_alpha,
                                        ": tau must be in [0, H = ", o.inner_steps, ") and alpha in [0, 1]"), rank);
    detail::check_replicated("DiLoCo", mesh_, dim, params_);
    anchor_ = optim::FlatState<T, Space>(params_);
    delta_ = optim::FlatState<T, Space>(params_);
    detail::copy_values(anchor_, params_);
    // The outer parameters: θ_sync (anchor_) with Δ (delta_) as the gradient, already reduced.
    states_.assign(params_.size(), {});
    has_grad_ = std::make_unique<bool[]>(params_.size());
    List outer;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      states_[k] = params_[k].layout;
      has_grad_[k] = true;
      outer.push_back({params_[k].name, anchor_.of(k), delta_.of(k), params_[k].layout, &states_[k], &has_grad_[k],
                       params_[k].decay});
    }
    // Fragments: contiguous runs of parameters of about total / F elements each.
    const std::size_t total = detail::local_elements(params_);
    std::size_t k = 0, seen = 0;
    for (int f = 0; f < o.fragments; ++f) {
      Fragment fr{k, k, {}};
      const std::size_t goal = total * std::size_t(f + 1) / std::size_t(o.fragments);
      const std::size_t keep = std::size_t(o.fragments - f - 1);  // at least a parameter for each later fragment
      do seen += params_[fr.end++].value.size();
      while (fr.end + keep < params_.size() && seen < goal);
      if (f + 1 == o.fragments) fr.end = params_.size();
      k = fr.end;
      fr.outer = std::make_unique<optim::SGD<T, N, Space>>(
          List(outer.begin() + std::ptrdiff_t(fr.begin), outer.begin() + std::ptrdiff_t(fr.end)),
          optim::SGDOptions{.lr = o.outer_lr, .momentum = o.outer_momentum, .nesterov = o.nesterov});
      fragments_.push_back(std::move(fr));
    }
  }
  DiLoCo(const DiLoCo&) = delete;  // the outer lists point into this object
  DiLoCo& operator=(const DiLoCo&) = delete;

  /// Call after every inner optimizer step. Syncs the fragments due at this step (all of them
  /// every H-th call with one fragment); returns how many synced.
  int step() {
    ++inner_;
    int synced = 0;
    for (std::size_t f = 0; f < fragments_.size(); ++f)
      if (due(f, inner_)) {
        issue(f);
        ++synced;
      }
    // Overlap: the all-reduces issued τ steps ago complete now (τ = 0: the ones just issued).
    while (!pending_.empty() && pending_.front().at <= inner_) complete();
    if (inner_ % o_.inner_steps == 0) ++rounds_;
    return synced;
  }

  /// Syncs fragment f now, blocking (what step() does when it is due and τ = 0).
  void sync(std::size_t f) {
    const long at = inner_;
    issue(f);
    pending_.back().at = at;
    while (!pending_.empty()) complete();
  }

  /// The end of training with overlap_steps > 0: waits for every outer all-reduce still in flight
  /// and applies it now (outer step, merge), instead of τ steps after its issue; returns how many.
  /// Collective like step(): every replica calls it (each issued the same all-reduces).
  std::size_t finish() {
    const std::size_t n = pending_.size();
    while (!pending_.empty()) complete();
    return n;
  }
  /// Outer all-reduces issued and not yet applied (overlap_steps > 0).
  std::size_t in_flight() const noexcept { return pending_.size(); }

  /// Inner steps taken (all of them, across rounds; the checkpoint's counter).
  long inner_step() const noexcept { return inner_; }
  /// Restores the counter from a checkpoint (with anchor() and the outer momentum): the rounds,
  /// the syncs and each outer optimizer's step count follow from it (the schedule is fixed).
  void set_inner_step(long s) {
    if (s < 0) throw Error("DiLoCo", detail::cat("inner step ", s, " < 0"), mesh_.rank());
    inner_ = s;
    rounds_ = s / o_.inner_steps;
    syncs_ = 0;
    for (std::size_t f = 0; f < fragments_.size(); ++f) {
      const long n = syncs_before(f, s);
      fragments_[f].outer->set_steps(n);
      syncs_ += n;
    }
  }
  long rounds() const noexcept { return rounds_; }
  long syncs() const noexcept { return syncs_; }
  /// θ_sync: the parameters at the last sync of each fragment (flat like the list).
  optim::FlatState<T, Space>& anchor() noexcept { return anchor_; }
  std::size_t num_fragments() const noexcept { return fragments_.size(); }
  optim::SGD<T, N, Space>& outer(std::size_t f) { return *fragments_.at(f).outer; }
  /// Parameter range [begin, end) of fragment f.
  std::pair<std::size_t, std::size_t> fragment(std::size_t f) const { return {fragments_.at(f).begin, fragments_.at(f).end}; }
  const DiLoCoOptions& options() const noexcept { return o_; }
  /// The bytes one rank's outer all-reduces carry per inner step, on average (the payload, not
  /// the ring's 2(n-1)/n factor): local elements x element size / H.
  double payload_bytes_per_step() const {
    const double elem = o_.bf16_reduce ? double(sizeof(bfloat16)) : double(sizeof(T));
    return double(detail::local_elements(params_)) * elem / double(o_.inner_steps);
  }

 private:
  struct Fragment {
    std::size_t begin, end;
    std::unique_ptr<optim::SGD<T, N, Space>> outer;
  };

  /// Whether fragment f syncs after inner step t (1-based): at t ≡ (f + 1)·H / F (mod H).
  bool due(std::size_t f, long t) const {
    const long h = o_.inner_steps, nf = long(fragments_.size());
    const long at = (long(f) + 1) * h / nf;  // in [1, H]
    return (t - at) % h == 0 && t >= at;
  }
  /// How many times fragment f synced in inner steps 1..t.
  long syncs_before(std::size_t f, long t) const {
    const long h = o_.inner_steps, at = (long(f) + 1) * h / long(fragments_.size());
    return t >= at ? (t - at) / h + 1 : 0;
  }
  std::size_t offset(std::size_t k) const {
    std::size_t o = 0;
    for (std::size_t j = 0; j < k; ++j) o += params_[j].value.size();
    return o;
  }

  /// An outer all-reduce in flight: fragment f's Δ (in delta_, or through `wire` in bfloat16),
  /// applied at inner step `at`.
  struct Pending {
    std::size_t f;
    long at;
    Work work;
    Tensor<bfloat16, 1, Space> wire;
  };

  /// Δ = θ_sync − θ for fragment f, and its average over the replica dimension started.
  void issue(std::size_t f) {
    Fragment& fr = fragments_.at(f);
    for (std::size_t k = fr.begin; k < fr.end; ++k) {
      Space::copy(delta_.of(k).data(), anchor_.of(k).data(), anchor_.of(k).size_bytes());
      detail::axpy<Space>(delta_.of(k), std::span<const T>(params_[k].value), -1.0);
    }
    const std::size_t lo = offset(fr.begin), hi = offset(fr.end);
    std::span<T> delta = delta_.all().subspan(lo, hi - lo);
    Pending p{f, inner_ + o_.overlap_steps, Work{}, {}};
    Communicator& group = mesh_.group(dim);
    if (group.size() > 1) {
      if (!o_.bf16_reduce || std::is_same_v<T, bfloat16>) {
        p.work = group.all_reduce_async(std::span<const T>(delta), delta, ReduceOp::avg);
      } else {
        {
          MemoryTagScope tag(MemoryTag::communication);
          p.wire = Tensor<bfloat16, 1, Space>::uninitialized(Shape<1>{Extent(delta.size())});
        }
        parallel::detail::convert_into<Space>(p.wire.span(), std::span<const T>(delta));
        p.work = group.all_reduce_async(std::span<const bfloat16>(p.wire.span()), p.wire.span(), ReduceOp::avg);
      }
    }
    pending_.push_back(std::move(p));
  }

  /// The oldest all-reduce in flight: waited for, the outer step on θ_sync, the merge into θ.
  void complete() {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    p.work.wait();
    Fragment& fr = fragments_.at(p.f);
    const std::size_t lo = offset(fr.begin), hi = offset(fr.end);
    if (p.wire.numel() > 0)
      parallel::detail::convert_into<Space>(delta_.all().subspan(lo, hi - lo), std::span<const bfloat16>(p.wire.span()));
    fr.outer->step();  // θ_sync ← outer(θ_sync, avg Δ)
    for (std::size_t k = fr.begin; k < fr.end; ++k) {
      if (o_.overlap_alpha == 0) {
        Space::copy(params_[k].value.data(), anchor_.of(k).data(), anchor_.of(k).size_bytes());
      } else {  // θ ← α·θ_local + (1 − α)·θ_sync
        detail::scale<Space>(params_[k].value, o_.overlap_alpha);
        detail::axpy<Space>(params_[k].value, std::span<const T>(anchor_.of(k)), 1.0 - o_.overlap_alpha);
      }
    }
    ++syncs_;
  }

  Mesh mesh_;
  List params_;
  DiLoCoOptions o_;
  optim::FlatState<T, Space> anchor_, delta_;
  std::vector<LayoutDesc<N>> states_;
  std::unique_ptr<bool[]> has_grad_;
  std::vector<Fragment> fragments_;
  std::deque<Pending> pending_;  // overlap: oldest first
  long inner_ = 0, rounds_ = 0, syncs_ = 0;
};

}  // namespace dtensor::parallel::sync
