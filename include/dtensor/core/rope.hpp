// dtensor/core/rope.hpp — the parameters of a rotary position embedding (RoPE): its base and,
// optionally, Llama 3.1's frequency remap (Hugging Face's rope_type "llama3").
//
//   Rope plain = 500000.0;                                               // theta only (implicit)
//   Rope llama31{500000.0, {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
//                           .original_max_position = 8192}};
//   kernels::host::detail::rotary_inv_freq(llama31, pair, half_dim)   // a pair's angle per position
//
// Unscaled, pair i of a head of D features turns by position * theta^(-2i/D). With llama3
// scaling (transformers' modeling_rope_utils._compute_llama3_parameters, Meta's Llama 3.1
// reference): with f = theta^(-2i/D) and its wavelength w = 2 pi / f, high_w = original /
// high_freq_factor, low_w = original / low_freq_factor,
//   w < high_w              : f                      (high frequencies kept)
//   w > low_w               : f / factor             (low frequencies slowed by the factor)
//   otherwise (in between)  : (1 - s) f / factor + s f,  s = (original / w - low_freq_factor) /
//                                                           (high_freq_factor - low_freq_factor)
// No attention factor (transformers' is 1 for llama3). Everything in double; the host and CUDA
// kernels share this function, so every rank and space turns a position by the same angle.
#pragma once

namespace dtensor {

/// Llama 3.1's RoPE frequency remap; factor 0 means none (plain RoPE).
struct RopeScaling {
  double factor = 0;                    // > 0 (>= 1 in practice): llama3 scaling on; 0: off
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  double original_max_position = 8192;  // original_max_position_embeddings
  constexpr bool on() const { return factor != 0; }
  /// The settings make sense: off, or factor > 0, high_freq_factor > low_freq_factor > 0 and
  /// original_max_position > 0 (the remap divides by the difference of the two factors).
  constexpr bool valid() const {
    return !on() || (factor > 0 && low_freq_factor > 0 && high_freq_factor > low_freq_factor && original_max_position > 0);
  }
  friend constexpr bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

/// A rotary embedding's parameters: the base theta (> 0) and an optional scaling.
struct Rope {
  double theta = 0;
  RopeScaling scaling{};
  constexpr Rope() = default;
  constexpr Rope(double base) : theta(base) {}  // NOLINT(google-explicit-constructor): a plain RoPE is its base
  constexpr Rope(double base, RopeScaling s) : theta(base), scaling(s) {}
};

}  // namespace dtensor
