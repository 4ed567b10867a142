// dtensor/kernels/cuda/attention_cudnn.cuh — bf16 attention on cuDNN's fused flash attention
// (scaled dot-product attention through cuDNN's graph API, with the cudnn-frontend headers): the
// same contract as attention_fused.cuh and attention_gemm.cuh (out [B,H,Tq,Dv], lse [B,H,Tq] in
// double; the backward from the saved lse), on tensor cores without a T x T matrix.
//
//   if (auto f = kernels::cuda::attention_cudnn(q, k, v, opts)) ...          // std::nullopt: not taken
//   if (auto g = kernels::cuda::attention_cudnn_backward(q, k, v, out, lse, dout, opts)) ...
//   kernels::cuda::cudnn_attention_built()   // whether this build has cuDNN (DTENSOR_HAS_CUDNN)
//
// Taken for bfloat16 only (cuDNN's fused attention computes in bf16 inputs with fp32 softmax and
// accumulation; float and double keep the exact paths), and only where cuDNN says it supports the
// case: without a causal mask, or with one whose diagonal is q_offset - k_offset >= 0 keys right
// of the top-left one (the ring's diagonal block: 0) — a row that sees no key at all is not
// expressible. Everything else (and every case cuDNN's check_support refuses, remembered per
// shape) returns std::nullopt and kernels::cuda::attention (attention.cuh) runs the cuBLAS chunks
// or the fused kernels instead. The backward asks for cuDNN's deterministic algorithm (no atomic
// dQ accumulation): the same inputs give the same bits, as the other paths.
// Numerics: P is rounded to bf16 before P V (the tensor cores' input), so the output is about one
// bf16 rounding from the paths that keep P in float; the statistics are cuDNN's float lse
// (natural log of the scaled scores' sum of exponentials), widened to double.
// The graphs are built once per shape, scale and mask (a cache per thread: a cudnnHandle_t is
// per thread, as the cuBLAS handle) and run on the current stream; the workspace comes from the
// stream-ordered pool.
//
// Include this header in ONE translation unit of a program (the trainer: train_gpt_cuda_bf16.cu):
// it registers these functions with kernels::cuda::attention's automatic choice (attention.cuh's
// hooks) for the whole program. Why not from attention.cuh itself: cudnn-frontend is a large
// header library, ~40 s of nvcc per translation unit that includes it (docs/gpu.md), and every
// CUDA unit of a model includes attention.cuh.
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "dtensor/kernels/cuda/attention.cuh"  // the hooks this header fills; attention_shape
#include "dtensor/kernels/cuda/cast.cuh"

#if defined(DTENSOR_HAS_CUDNN)
#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>
#endif

namespace dtensor::kernels::cuda {

/// Whether this build can run attention on cuDNN (CMake found cuDNN 9 and cudnn-frontend).
constexpr bool cudnn_attention_built() {
#if defined(DTENSOR_HAS_CUDNN)
  return true;
#else
  return false;
#endif
}

/// The reason cuDNN refused the last case this thread asked for ("" when it took it or was not asked).
inline std::string& cudnn_attention_last_refusal() {
  thread_local std::string why;
  return why;
}

#if defined(DTENSOR_HAS_CUDNN)
namespace detail {

namespace fe = cudnn_frontend;

/// This thread's cuDNN handle on the current device, bound to the current stream.
inline cudnnHandle_t cudnn() {
  cudnnHandle_t h = per_thread_device(
      [] {
        cudnnHandle_t made = nullptr;
        const cudnnStatus_t st = cudnnCreate(&made);
        check(st == CUDNN_STATUS_SUCCESS, "cudnnCreate", "failed: ", cudnnGetErrorString(st));
        return made;
      },
      [](cudnnHandle_t old) { cudnnDestroy(old); });
  const cudnnStatus_t st = cudnnSetStream(h, stream());
  check(st == CUDNN_STATUS_SUCCESS, "cudnnSetStream", "failed: ", cudnnGetErrorString(st));
  return h;
}

/// What identifies one built graph: direction, extents, scale and the causal diagonal (-1: none).
struct CudnnSdpaKey {
  bool backward = false;
  Extent b = 0, h = 0, tq = 0, tk = 0, d = 0, dv = 0;
  Extent diagonal = -1;
  double scale = 0;
  bool operator==(const CudnnSdpaKey&) const = default;
};

struct CudnnSdpaGraph {
  CudnnSdpaKey key;
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused this case (why says so)
  std::int64_t workspace = 0;
  std::string why;
};

// The tensors' ids in the variant pack.
enum : std::int64_t { sdpa_q = 1, sdpa_k, sdpa_v, sdpa_o, sdpa_stats, sdpa_do, sdpa_dq, sdpa_dk, sdpa_dv };

/// A contiguous [b, h, rows, width] tensor of the graph.
inline std::shared_ptr<fe::graph::Tensor_attributes> sdpa_tensor(fe::graph::Graph& g, const char* name,
                                                                 std::int64_t uid, const CudnnSdpaKey& k, Extent rows,
                                                                 Extent width) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({k.b, k.h, rows, width})
                      .set_stride({k.h * rows * width, rows * width, width, 1}));
}

inline void sdpa_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, std::int64_t uid, const CudnnSdpaKey& k,
                        Extent rows, Extent width) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim({k.b, k.h, rows, width})
      .set_stride({k.h * rows * width, rows * width, width, 1});
}

template <class Attributes>
void sdpa_mask(Attributes& a, const CudnnSdpaKey& k) {
  if (k.diagonal < 0) return;
  a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(int(k.diagonal));
}

/// Builds the forward or backward graph of `key`; a refusal anywhere leaves graph null with the reason.
inline CudnnSdpaGraph build_sdpa_graph(const CudnnSdpaKey& key) {
  CudnnSdpaGraph r{.key = key};
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto q = sdpa_tensor(*g, "Q", sdpa_q, key, key.tq, key.d);
  const auto k = sdpa_tensor(*g, "K", sdpa_k, key, key.tk, key.d);
  const auto v = sdpa_tensor(*g, "V", sdpa_v, key, key.tk, key.dv);
  const std::vector<std::int64_t> stats_dim{key.b, key.h, key.tq, 1}, stats_stride{key.h * key.tq, key.tq, 1, 1};
  if (!key.backward) {
    auto a = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(float(key.scale));
    sdpa_mask(a, key);
    auto [o, stats] = g->sdpa(q, k, v, a);
    sdpa_output(o, sdpa_o, key, key.tq, key.dv);
    stats->set_output(true)
        .set_uid(sdpa_stats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
  } else {
    const auto o = sdpa_tensor(*g, "O", sdpa_o, key, key.tq, key.dv);
    const auto dout = sdpa_tensor(*g, "dO", sdpa_do, key, key.tq, key.dv);
    const auto stats = g->tensor(fe::graph::Tensor_attributes()
                                     .set_name("Stats")
                                     .set_uid(sdpa_stats)
                                     .set_data_type(fe::DataType_t::FLOAT)
                                     .set_dim(stats_dim)
                                     .set_stride(stats_stride));
    auto a = fe::graph::SDPA_backward_attributes()
                 .set_name("sdpa_backward")
                 .set_attn_scale(float(key.scale))
                 .set_deterministic_algorithm(true);
    sdpa_mask(a, key);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, a);
    sdpa_output(dq, sdpa_dq, key, key.tq, key.d);
    sdpa_output(dk, sdpa_dk, key, key.tk, key.d);
    sdpa_output(dv, sdpa_dv, key, key.tk, key.dv);
  }
  const cudnnHandle_t h = cudnn();
  if (auto e = g->validate(); !e.is_good()) return r.why = "validate: " + e.get_message(), r;
  if (auto e = g->build_operation_graph(h); !e.is_good()) return r.why = "build_operation_graph: " + e.get_message(), r;
  if (auto e = g->create_execution_plans({fe::HeurMode_t::A}); !e.is_good())
    return r.why = "create_execution_plans: " + e.get_message(), r;
  if (auto e = g->check_support(h); !e.is_good()) return r.why = "check_support: " + e.get_message(), r;
  if (auto e = g->build_plans(h); !e.is_good()) return r.why = "build_plans: " + e.get_message(), r;
  if (auto e = g->get_workspace_size(r.workspace); !e.is_good()) return r.why = "workspace: " + e.get_message(), r;
  r.graph = std::move(g);
  return r;
}

/// The built graph of `key` (this thread's cache; a refused case is remembered as refused).
inline const CudnnSdpaGraph& sdpa_graph(const CudnnSdpaKey& key) {
  thread_local std::vector<std::unique_ptr<CudnnSdpaGraph>> cache;
  for (const auto& g : cache)
    if (g->key == key) return *g;
  cache.push_back(std::make_unique<CudnnSdpaGraph>(build_sdpa_graph(key)));
  return *cache.back();
}

/// The key of a bf16 case cuDNN may take, or nullopt (another type, a row that sees no key).
template <class T>
std::optional<CudnnSdpaKey> sdpa_key(bool backward, const CudaTensor<T, 4>& q, const AttentionShape& s) {
  if constexpr (!std::is_same_v<T, bfloat16>) {
    return std::nullopt;
  } else {
    if (s.bh * s.tq * s.tk == 0 || s.d == 0 || s.dv == 0) return std::nullopt;
    const Extent diagonal = s.causal ? s.q_offset - s.k_offset : -1;
    if (s.causal && diagonal < 0) return std::nullopt;  // the first rows would see no key
    return CudnnSdpaKey{.backward = backward,
                        .b = q.extent(0),
                        .h = q.extent(1),
                        .tq = s.tq,
                        .tk = s.tk,
                        .d = s.d,
                        .dv = s.dv,
                        .diagonal = diagonal,
                        .scale = s.scale};
  }
}

/// The built graph for this call, or null where cuDNN does not take it (the reason recorded).
template <class T>
const CudnnSdpaGraph* sdpa_graph_for(bool backward, const char* op, const CudaTensor<T, 4>& q,
                                     const CudaTensor<T, 4>& k, const CudaTensor<T, 4>& v, const AttentionOptions& opts,
                                     AttentionShape& s) {
  s = attention_shape(op, q, k, v, opts);
  const auto key = sdpa_key(backward, q, s);
  if (!key) return nullptr;
  const auto& g = sdpa_graph(*key);
  cudnn_attention_last_refusal() = g.why;
  return g.graph ? &g : nullptr;
}

inline void run_sdpa(const CudnnSdpaGraph& g, std::unordered_map<std::int64_t, void*>& pack) {
  // float words: the pool's allocations are aligned for any element; cuDNN wants bytes.
  auto workspace =
      CudaTensor<float, 1>::uninitialized(Shape<1>{Extent(std::max<std::int64_t>(g.workspace, 4) + 3) / 4});
  auto e = g.graph->execute(cudnn(), pack, workspace.data());
  check(e.is_good(), "attention (cuDNN)", "execute failed: ", e.get_message());
}

}  // namespace detail
#endif

/// Attention through cuDNN, or std::nullopt where cuDNN does not take this case (see the header).
template <FloatElement T>
std::optional<AttentionForward<T>> attention_cudnn(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k,
                                                   const CudaTensor<T, 4>& v, const AttentionOptions& opts = {}) {
#if defined(DTENSOR_HAS_CUDNN)
  // Other types never reach cuDNN's graph code (which is then not compiled for them).
  if constexpr (!std::is_same_v<T, bfloat16>) {
    return std::nullopt;
  } else {
    detail::AttentionShape s;
    const auto* g = detail::sdpa_graph_for(false, "attention", q, k, v, opts, s);
    if (!g) return std::nullopt;
    AttentionForward<T> f{CudaTensor<T, 4>::uninitialized(Shape<4>{q.extent(0), q.extent(1), s.tq, s.dv}),
                          CudaTensor<Stat, 3>::uninitialized(Shape<3>{q.extent(0), q.extent(1), s.tq})};
    auto stats = CudaTensor<float, 3>::uninitialized(f.lse.shape());
    std::unordered_map<std::int64_t, void*> pack{{detail::sdpa_q, const_cast<T*>(q.data())},
                                                 {detail::sdpa_k, const_cast<T*>(k.data())},
                                                 {detail::sdpa_v, const_cast<T*>(v.data())},
                                                 {detail::sdpa_o, f.out.data()},
                                                 {detail::sdpa_stats, stats.data()}};
    detail::run_sdpa(*g, pack);
    cast_into(f.lse, stats);
    return f;
  }
#else
  (void)q, (void)k, (void)v, (void)opts;
  return std::nullopt;
#endif
}

/// The backward through cuDNN from the forward's out and lse, or std::nullopt (as attention_cudnn).
template <FloatElement T>
std::optional<AttentionBackward<T>> attention_cudnn_backward(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k,
                                                             const CudaTensor<T, 4>& v, const CudaTensor<T, 4>& out,
                                                             const CudaTensor<Stat, 3>& lse,
                                                             const CudaTensor<T, 4>& dout,
                                                             const AttentionOptions& opts = {}) {
#if defined(DTENSOR_HAS_CUDNN)
  if constexpr (!std::is_same_v<T, bfloat16>) {
    return std::nullopt;
  } else {
    detail::AttentionShape s;
    const auto* g = detail::sdpa_graph_for(true, "attention_backward", q, k, v, opts, s);
    if (!g) return std::nullopt;
    AttentionBackward<T> r{CudaTensor<T, 4>::uninitialized(q.shape()), CudaTensor<T, 4>::uninitialized(k.shape()),
                           CudaTensor<T, 4>::uninitialized(v.shape())};
    auto stats = CudaTensor<float, 3>::uninitialized(lse.shape());
    cast_into(stats, lse);
    std::unordered_map<std::int64_t, void*> pack{{detail::sdpa_q, const_cast<T*>(q.data())},
                                                 {detail::sdpa_k, const_cast<T*>(k.data())},
                                                 {detail::sdpa_v, const_cast<T*>(v.data())},
                                                 {detail::sdpa_o, const_cast<T*>(out.data())},
                                                 {detail::sdpa_do, const_cast<T*>(dout.data())},
                                                 {detail::sdpa_stats, stats.data()},
                                                 {detail::sdpa_dq, r.dq.data()},
                                                 {detail::sdpa_dk, r.dk.data()},
                                                 {detail::sdpa_dv, r.dv.data()}};
    detail::run_sdpa(*g, pack);
    return r;
  }
#else
  (void)q, (void)k, (void)v, (void)out, (void)lse, (void)dout, (void)opts;
  return std::nullopt;
#endif
}

#if defined(DTENSOR_HAS_CUDNN)
namespace detail {
/// The registration (once per program, whichever units include this header).
inline const bool cudnn_attention_registered = [] {
  attention_hooks().forward.store(&attention_cudnn<bfloat16>);
  attention_hooks().backward.store(&attention_cudnn_backward<bfloat16>);
  return true;
}();
}  // namespace detail
#endif

}  // namespace dtensor::kernels::cuda
