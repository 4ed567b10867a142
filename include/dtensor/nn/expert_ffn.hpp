// dtensor/nn/expert_ffn.hpp — which feed-forward a mixture of experts' experts are: GPT's GELU MLP
// (fc1 -> GELU -> fc2, with biases) or Llama's SwiGLU (w2(silu(x w1) * (x w3)), no biases; Mixtral's
// and DeepSeek's experts). Its own header: a model's Layers policy names it (models/gpt.hpp) without
// pulling in the experts (parallel/experts.hpp).
#pragma once

namespace dtensor::nn {

enum class ExpertFfn { gelu_mlp, swiglu };

inline const char* name_of(ExpertFfn f) { return f == ExpertFfn::swiglu ? "swiglu" : "gelu_mlp"; }

}  // namespace dtensor::nn
