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
#include <optional>
#include <span>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/float8.hpp"
#include "dtensor/core/memory.hpp"
#include "dtensor/kernels/host/gemm_fp8.hpp"

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

/// A tensor role of an FP8 Linear: its input and weight (E4M3), its output gradient (E5M2).
enum class Fp8Role { input, weight, grad_output };
/// The three GEMMs of an FP8 Linear: y = x W^T (E4M3 x E4M3), dx = dy W and dW = dy^T x (E5M2 x E4M3).
enum class Fp8LinearGemm { forward, grad_input, grad_weight };

namespace detail {

/// What an nn::Linear computes in FP8, on this rank's pieces, whatever its layout and mesh: the
/// Linear passes its pieces and the communicators of the mesh dimensions that split them. One
/// table per element type and memory space, the pointers into that space's memory (the host's
/// emulation here; the GPU's in nn/fp8_cuda.cuh). Reached through a pointer that Fp8Autocast
/// sets, so that a program which never constructs one compiles none of it; every Linear would
/// compile its FP8 path otherwise, the switch being a run-time one (docs/benchmarks.md, "A
/// user's FSDP x TP program").
template <kernels::host::FloatElement T>
struct Fp8LinearKernels {
  /// The scale of this use of `role`'s tensor (n values at `local`), from the role's history in
  /// `state` (made with the autocast's recipe at the first use), then the tensor's amax recorded:
  /// max |x| of the piece (a NaN as +inf: max would drop it on some ranks and keep it on others)
  /// max-all-reduced over `groups`, so that every rank holding a piece quantizes with one scale.
  float (*scale)(std::optional<Fp8LinearScaling>& state, Fp8Role role, const T* local, Extent n,
                 std::span<Communicator* const> groups);
  /// c = op(a) op(b) of `gemm`, a [ra, ca] and b [rb, cb] quantized by sa and sb
  /// (kernels::host::gemm_fp8_quantizing and its twins).
  void (*gemm)(Fp8LinearGemm gemm, const T* a, Extent ra, Extent ca, float sa, const T* b, Extent rb, Extent cb,
               float sb, T* c);
  /// max |x| of n values, a NaN as +inf (the grouped experts' amaxes, parallel/experts.hpp).
  float (*amax)(const T* x, Extent n);
};

/// The scale of a use of role's tensor whose amax (max-all-reduced over `groups` here) is a, then a
/// recorded: Fp8LinearKernels::scale of every space, given the space's amax.
inline float fp8_scale_and_record(std::optional<Fp8LinearScaling>& state, Fp8Role role, float a,
                                  std::span<Communicator* const> groups) {
  if (!state) state.emplace(fp8_autocast_recipe());
  AmaxHistory& h = role == Fp8Role::input ? state->input : role == Fp8Role::weight ? state->weight : state->grad_output;
  for (Communicator* g : groups) g->all_reduce(std::span<float>(&a, 1), ReduceOp::max);
  const float s = h.scale(a);
  h.record(a);
  return s;
}

/// Fp8LinearKernels::scale over the amax Amax of the space (a NaN as +inf).
template <kernels::host::FloatElement T, float (*Amax)(const T*, Extent)>
float fp8_linear_scale(std::optional<Fp8LinearScaling>& state, Fp8Role role, const T* local, Extent n,
                       std::span<Communicator* const> groups) {
  return fp8_scale_and_record(state, role, Amax(local, n), groups);
}

/// kernels::host::amax with a NaN as +inf.
template <kernels::host::FloatElement T>
float host_amax_inf(const T* x, Extent n) {
  const float a = kernels::host::amax(x, n);
  return std::isnan(a) ? std::numeric_limits<float>::infinity() : a;
}

/// The three GEMMs of an FP8 Linear by the gemm_fp8_quantizing of a space: Quantizing::run<FA, FB>
/// (HostFp8Gemm here, the GPU's in nn/fp8_cuda.cuh).
template <kernels::host::FloatElement T, class Quantizing>
void fp8_linear_gemm(Fp8LinearGemm gemm, const T* a, Extent ra, Extent ca, float sa, const T* b, Extent rb, Extent cb,
                     float sb, T* c) {
  switch (gemm) {
    case Fp8LinearGemm::forward:
      Quantizing::template run<float8_e4m3, float8_e4m3>(false, true, a, ra, ca, sa, b, rb, cb, sb, c);
      return;
    case Fp8LinearGemm::grad_input:
      Quantizing::template run<float8_e5m2, float8_e4m3>(false, false, a, ra, ca, sa, b, rb, cb, sb, c);
      return;
    case Fp8LinearGemm::grad_weight:
      Quantizing::template run<float8_e5m2, float8_e4m3>(true, false, a, ra, ca, sa, b, rb, cb, sb, c);
      return;
  }
}

/// The host's emulation for fp8_linear_gemm.
struct HostFp8Gemm {
  template <class FA, class FB, class T>
  static void run(bool ta, bool tb, const T* a, Extent ra, Extent ca, float sa, const T* b, Extent rb, Extent cb,
                  float sb, T* c) {
    kernels::host::gemm_fp8_quantizing<FA, FB>(ta, tb, a, ra, ca, sa, b, rb, cb, sb, c);
  }
};

template <kernels::host::FloatElement T>
inline constexpr Fp8LinearKernels<T> fp8_linear_kernels_impl{&fp8_linear_scale<T, &host_amax_inf<T>>,
                                                             &fp8_linear_gemm<T, HostFp8Gemm>, &host_amax_inf<T>};
/// The table of each element type and memory space (null: none installed for it).
template <kernels::host::FloatElement T, class Space>
inline std::atomic<const Fp8LinearKernels<T>*> fp8_linear_kernels_set{nullptr};

/// Sets the host's kernels of every element type a Linear computes in (Fp8Autocast's constructor).
inline void install_fp8_linear_kernels() {
  fp8_linear_kernels_set<float, host_space>.store(&fp8_linear_kernels_impl<float>, std::memory_order_release);
  fp8_linear_kernels_set<double, host_space>.store(&fp8_linear_kernels_impl<double>, std::memory_order_release);
  fp8_linear_kernels_set<bfloat16, host_space>.store(&fp8_linear_kernels_impl<bfloat16>, std::memory_order_release);
}

/// The kernels a Linear in T on Space's memory computes in FP8 with: the host's are set by every
/// Fp8Autocast (a Linear computes in FP8 only after one was constructed), the GPU's by including
/// nn/fp8_cuda.cuh in one of the program's CUDA units.
template <kernels::host::FloatElement T, class Space = host_space>
const Fp8LinearKernels<T>& fp8_linear_kernels(const char* op = "nn::Linear") {
  const auto* k = fp8_linear_kernels_set<T, Space>.load(std::memory_order_acquire);
  if (k == nullptr) {
    if constexpr (std::is_same_v<Space, host_space>)
      throw Error(op, "an FP8 GEMM before any nn::Fp8Autocast was constructed");
    else
      throw Error(op,
                  "FP8 on GPU tensors needs the GPU's FP8 kernels: include dtensor/nn/fp8_cuda.cuh in one of the "
                  "program's CUDA translation units (docs/fp8.md)");
  }
  return *k;
}

}  // namespace detail

/// While an Fp8Autocast(true) lives, every nn::Linear's forward (and the backward of that
/// forward) computes its three GEMMs in FP8 (nn/linear.hpp). Process-wide, like TE's
/// fp8_autocast, so that a model's Linears need no option threaded through its constructors:
/// set it before the ranks start (their threads read it), and keep it for the run. Restores the
/// previous state when it ends.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(bool enabled = true, DelayedScaling recipe = {})
      : previous_(fp8_autocast_enabled()), previous_recipe_(fp8_autocast_recipe()) {
    detail::install_fp8_linear_kernels();
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
