// dtensor/nn/fp8_recipe.hpp — per-tensor FP8 scaling with a delayed amax history (Transformer
// Engine's DelayedScaling recipe, HYBRID format: E4M3 forward, E5M2 gradients).
//
//   nn::AmaxHistory h(float8_e4m3::max_value(), {.history = 16, .margin = 0});
//   const float s = h.scale(amax_now);    // the scale this step quantizes with
//   q = float8_e4m3(x * s) ...            // kernels/host/gemm_fp8.hpp: quantize(x, n, s, q)
//   h.record(amax_now);                   // after the use: the history, and the next step's scale
//
// The recipe (TE's DelayedScaling with amax_compute_algo "max"): every tensor role (a Linear's
// input, weight and output gradient) keeps the amaxes (max |x|) of its last H uses. The scale of
// a use is computed from the history *before* it — the amax of the tensor being quantized is
// only recorded afterwards, so the quantization needs no pass over the tensor first on a GPU
// (TE fuses the amax into the cast):
//
//   scale = (fp8_max / max(history)) / 2^margin
//
// kept at the previous scale when that max is 0, not finite, or so small that the scale
// overflows (TE: torch.where(amax > 0 and isfinite(amax), sf, scale)). Values beyond fp8_max /
// scale saturate in the conversion (core/float8.hpp). The one departure from TE: the first use,
// with an empty history, takes its scale from its own amax (TE starts from scale 1, which
// saturates or flushes whatever is far from 1 on the first step); every later scale is delayed.
//
// Distributed tensors: the amax recorded must be the same on every rank that shares the tensor
// (the max over the tensor-parallel group of the shards' amaxes), or ranks would quantize one
// tensor with different scales (nn/linear.hpp's FP8 option documents its collective).
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/float8.hpp"

namespace dtensor::nn {

/// The recipe's knobs (TE's DelayedScaling: amax_history_len, margin).
struct DelayedScaling {
  int history = 16;  // H: amaxes kept per tensor role
  int margin = 0;    // scale divided by 2^margin: headroom against growth between updates
};

/// The amax history of one tensor role and the scale it gives (see the synopsis).
class AmaxHistory {
 public:
  AmaxHistory() = default;
  AmaxHistory(float fp8_max, DelayedScaling o = {}) : fp8_max_(fp8_max), opts_(o) {
    dtensor::detail::check(o.history >= 1 && o.margin >= 0 && fp8_max > 0 && std::isfinite(fp8_max), "nn::AmaxHistory",
                           "history ", o.history, " (>= 1), margin ", o.margin, " (>= 0), fp8_max ", fp8_max, " (> 0)");
    amax_.reserve(std::size_t(o.history));
  }

  /// The scale of this use: the delayed one, or on the first use (empty history) the one of
  /// `current_amax`, this use's own amax.
  float scale(float current_amax) const { return amax_.empty() ? scale_from(current_amax, 1.f) : scale_; }

  /// Records this use's amax (after the use) and updates the scale from the last H amaxes.
  void record(float amax) {
    if (amax_.size() < std::size_t(opts_.history)) amax_.push_back(amax);
    else amax_[next_] = amax;
    next_ = (next_ + 1) % std::size_t(opts_.history);
    float m = 0;
    bool finite = true;
    for (float a : amax_) {
      if (!std::isfinite(a)) finite = false;  // NaN/inf (a diverged step) keep the scale
      else if (a > m) m = a;
    }
    scale_ = finite ? scale_from(m, scale_) : scale_;
  }

  /// scale(amax) and record(amax) together: the usual sequence when the amax is known first.
  float use(float amax) {
    const float s = scale(amax);
    record(amax);
    return s;
  }

  /// The scale the next use will get (1 before any record).
  float next_scale() const noexcept { return scale_; }
  /// The amaxes held, oldest first.
  std::vector<float> history() const {
    std::vector<float> h;
    for (std::size_t i = 0; i < amax_.size(); ++i)
      h.push_back(amax_[(amax_.size() < std::size_t(opts_.history) ? i : (next_ + i) % amax_.size())]);
    return h;
  }
  const DelayedScaling& options() const noexcept { return opts_; }
  float fp8_max() const noexcept { return fp8_max_; }

 private:
  float scale_from(float amax, float previous) const {
    if (!(amax > 0) || !std::isfinite(amax)) return previous;
    const float s = fp8_max_ / amax / std::ldexp(1.f, opts_.margin);
    return std::isfinite(s) ? s : previous;
  }

  float fp8_max_ = float8_e4m3::max_value();
  DelayedScaling opts_;
  std::vector<float> amax_;  // a ring of up to H amaxes; next_ is where the next one goes
  std::size_t next_ = 0;
  float scale_ = 1.f;
};

/// The three roles of an FP8 Linear under the HYBRID format: input and weight in E4M3, the
/// output gradient in E5M2.
struct Fp8LinearScaling {
  AmaxHistory input, weight, grad_output;
  Fp8LinearScaling() : Fp8LinearScaling(DelayedScaling{}) {}
  explicit Fp8LinearScaling(DelayedScaling o)
      : input(float8_e4m3::max_value(), o),
        weight(float8_e4m3::max_value(), o),
        grad_output(float8_e5m2::max_value(), o) {}
};

namespace detail {
inline std::atomic<bool> fp8_autocast_on{false};
inline DelayedScaling fp8_autocast_recipe_value{};
}  // namespace detail

/// Whether nn::Linear computes in FP8 now (Transformer Engine's fp8_autocast, process-wide).
inline bool fp8_autocast_enabled() noexcept { return detail::fp8_autocast_on.load(std::memory_order_relaxed); }
/// The recipe a Linear's histories get at its first FP8 forward.
inline DelayedScaling fp8_autocast_recipe() noexcept { return detail::fp8_autocast_recipe_value; }

/// While an Fp8Autocast(true) lives, every nn::Linear's forward (and the backward of that
/// forward) computes its three GEMMs in FP8 (nn/linear.hpp). Process-wide, like TE's
/// fp8_autocast, so that a model's Linears need no option threaded through its constructors:
/// set it before the ranks start (their threads read it), and keep it for the run. Restores the
/// previous state when it ends.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(bool enabled = true, DelayedScaling recipe = {})
      : previous_(fp8_autocast_enabled()), previous_recipe_(fp8_autocast_recipe()) {
    detail::fp8_autocast_recipe_value = recipe;
    detail::fp8_autocast_on.store(enabled);
  }
  ~Fp8Autocast() {
    detail::fp8_autocast_recipe_value = previous_recipe_;
    detail::fp8_autocast_on.store(previous_);
  }
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  bool previous_;
  DelayedScaling previous_recipe_;
};

}  // namespace dtensor::nn
