// DeepSeek's multi-head latent attention (nn/latent_attention.hpp) and what it rests on:
// - the attention kernels with a value head (Dv) other than the query/key head (D): host forward
//   and lse against a naive double loop (causal or not, ring attention's offsets), the backward
//   against finite differences, the chunked (ring) attention merged over two key chunks, the meta
//   kernel's FLOPs (2 P (D + Dv) forward, P (6 D + 4 Dv) backward), and mismatched q/k heads refused;
// - the layer on one rank against a naive double implementation of the paper's formulas (weights
//   read from the module) and its gradients against finite differences, with and without the
//   query latent;
// - tensor parallelism (tp 2 and 4 with 4 heads, tp 2 and 3 with 6 heads), with and without
//   sequence parallelism, on 5 positions (uneven over tp): output, input gradient and every
//   parameter's gradient equal to the one-rank layer (double, rtol 1e-11); the layer's exact
//   collectives on "tp" under TP and TP + SP (CommLog);
// - the Llama block with MLA (nn::GqaOrMla) under TP + SP, the KV cache's logits equal to a full
//   recomputation, and bad input (heads % tp, zero ranks, odd rotary dims, kv_heads, GQA given an MLA
//   config) refused with dtensor::Error naming the op.
// Training parity (DP, TP, SP, CP, FSDP, PP): tests/parity/test_mla_parity.cpp and the example test
// example_train_gpt_mla.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "dtensor/comm/threads.hpp"
#include "dtensor/kernels/attention_chunk.hpp"
#include "dtensor/kernels/meta/cost_log.hpp"
#include "dtensor/models/llama.hpp"
#include "dtensor/nn/latent_attention.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "support/naive_attention.hpp"
#include "test_nn_support.hpp"

// This file's own namespace (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS).
namespace test_latent_attention {

using namespace dtensor;
using namespace dtensor::testing;
namespace kh = dtensor::kernels::host;
using T4 = Tensor<double, 4>;

namespace {

// ---------------------------------------------------------------- kernels with Dv != D

std::string close(const std::string& what, const T4& a, const T4& b, double tol = 1e-12) {
  const auto c = compare(a, b, {.rtol = tol, .atol = tol});
  return c ? std::string() : what + ": " + c.message;
}

// ---------------------------------------------------------------- the layer

constexpr Extent B = 2, T = 5, C = 24, SEQ = 8;
const nn::LatentAttentionConfig mla_shape{
    .q_lora_rank = 10, .kv_lora_rank = 8, .qk_nope_head_dim = 4, .qk_rope_head_dim = 4, .v_head_dim = 3};

nn::AttentionConfig mla_config(Extent heads, Extent q_lora_rank = mla_shape.q_lora_rank) {
  nn::AttentionConfig c{
      .dim = C, .heads = heads, .seq = SEQ, .rope_theta = 100, .bias = false, .mla = mla_shape, .norm_eps = 1e-6};
  c.mla.q_lora_rank = q_lora_rank;
  return c;
}
const auto x_full = normal<double>(Shape<3>{B, T, C}, 71);
const auto r_full = normal<double>(Shape<3>{B, T, C}, 72);

template <class Plan>
using Mla = nn::MultiHeadLatentAttention<double, NnMesh, typename Plan::qkv, typename Plan::proj>;

template <class Plan>
ModuleRun<3> mla_run(const NnMesh& mesh, const nn::AttentionConfig& c) {
  Mla<Plan> a("attn", mesh, c, 5, 0.3, 0.3);
  auto x = distribute_replicated<typename Mla<Plan>::In::layout>(mesh, x_full);
  return run_module(a, mesh, x, r_full);
}

/// Every parameter of a module, whole, by name.
template <class M>
std::map<std::string, Tensor<double, 2>> whole_weights(M& m) {
  std::map<std::string, Tensor<double, 2>> out;
  nn::for_each_parameter(m, [&](auto& p) {
    if (!p.defined()) return;
    const auto w = full_tensor(p.value());
    Tensor<double, 2> as2(Shape<2>{w.shape()[0], w.numel() / w.shape()[0]});
    for (Extent i = 0; i < w.numel(); ++i) as2[i] = w[i];
    out.emplace(p.name(), std::move(as2));
  });
  return out;
}

/// y = W x for one token (W [out, in]).
std::vector<double> matvec(const Tensor<double, 2>& w, const std::vector<double>& x) {
  std::vector<double> y(std::size_t(w.extent(0)));
  for (Extent o = 0; o < w.extent(0); ++o)
    for (Extent i = 0; i < w.extent(1); ++i) y[std::size_t(o)] += w(o, i) * x[std::size_t(i)];
  return y;
}
std::vector<double> rms(const std::vector<double>& x, const Tensor<double, 2>& g, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  const double s = 1 / std::sqrt(ms / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * g[Extent(i)];
  return y;
}
/// RoPE of r features at position t: pairs (i, i + r/2) turn by t * theta^(-2i/r).
void rotate(double* f, Extent r, double t, double theta) {
  for (Extent i = 0; i < r / 2; ++i) {
    const double a = t * std::pow(theta, -2.0 * double(i) / double(r)), lo = f[i], hi = f[i + r / 2];
    f[i] = lo * std::cos(a) - hi * std::sin(a);
    f[i + r / 2] = hi * std::cos(a) + lo * std::sin(a);
  }
}

/// The paper's MLA (DeepSeek-V3 §2.1.1) token by token in double, from the module's weights.
Tensor<double, 3> naive_mla(std::map<std::string, Tensor<double, 2>>& w, const nn::AttentionConfig& c,
                            const Tensor<double, 3>& x) {
  const auto& m = c.mla;
  const Extent H = c.heads, n = m.qk_nope_head_dim, r = m.qk_rope_head_dim, dv = m.v_head_dim, qk = n + r;
  const Extent batch = x.extent(0), len = x.extent(1);
  Tensor<double, 3> y(Shape<3>{batch, len, c.dim});
  for (Extent b = 0; b < batch; ++b) {
    const auto rows = static_cast<std::size_t>(len);
    std::vector<std::vector<double>> q(rows), k(rows), v(rows);
    for (Extent t = 0; t < len; ++t) {
      std::vector<double> h(std::size_t(c.dim));
      for (Extent i = 0; i < c.dim; ++i) h[std::size_t(i)] = x(b, t, i);
      q[std::size_t(t)] = m.q_lora_rank > 0
                              ? matvec(w.at("attn.q_b_proj.weight"), rms(matvec(w.at("attn.q_a_proj.weight"), h),
                                                                         w.at("attn.q_a_layernorm.weight"), c.norm_eps))
                              : matvec(w.at("attn.q_proj.weight"), h);
      auto a = matvec(w.at("attn.kv_a_proj_with_mqa.weight"), h);
      const auto kv =
          matvec(w.at("attn.kv_b_proj.weight"), rms(std::vector<double>(a.begin(), a.begin() + m.kv_lora_rank),
                                                    w.at("attn.kv_a_layernorm.weight"), c.norm_eps));
      rotate(a.data() + m.kv_lora_rank, r, double(t), c.rope_theta);  // the shared k_R
      for (Extent hd = 0; hd < H; ++hd) {
        rotate(q[std::size_t(t)].data() + hd * qk + n, r, double(t), c.rope_theta);
        for (Extent i = 0; i < n; ++i) k[std::size_t(t)].push_back(kv[std::size_t(hd * (n + dv) + i)]);
        for (Extent i = 0; i < r; ++i) k[std::size_t(t)].push_back(a[std::size_t(m.kv_lora_rank + i)]);
        for (Extent i = 0; i < dv; ++i) v[std::size_t(t)].push_back(kv[std::size_t(hd * (n + dv) + n + i)]);
      }
    }
    for (Extent t = 0; t < len; ++t) {
      std::vector<double> o(std::size_t(H * dv));
      for (Extent hd = 0; hd < H; ++hd) {
        std::vector<double> s;
        for (Extent j = 0; j <= t; ++j) {
          double dot = 0;
          for (Extent i = 0; i < qk; ++i)
            dot += q[std::size_t(t)][std::size_t(hd * qk + i)] * k[std::size_t(j)][std::size_t(hd * qk + i)];
          s.push_back(dot / std::sqrt(double(qk)));
        }
        double mx = -1e300, z = 0;
        for (double e : s) mx = std::max(mx, e);
        for (double e : s) z += std::exp(e - mx);
        for (Extent j = 0; j <= t; ++j)
          for (Extent i = 0; i < dv; ++i)
            o[std::size_t(hd * dv + i)] +=
                std::exp(s[std::size_t(j)] - mx) / z * v[std::size_t(j)][std::size_t(hd * dv + i)];
      }
      const auto out = matvec(w.at("attn.o_proj.weight"), o);
      for (Extent i = 0; i < c.dim; ++i) y(b, t, i) = out[std::size_t(i)];
    }
  }
  return y;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("attention kernels with a value head other than the query/key head (Dv != D)", "[mla][kernels]") {
  const auto q = normal<double>(Shape<4>{2, 3, 7, 6}, 1), k = normal<double>(Shape<4>{2, 3, 9, 6}, 2);
  const auto v = normal<double>(Shape<4>{2, 3, 9, 4}, 3), dout = normal<double>(Shape<4>{2, 3, 7, 4}, 4);
  for (bool causal : {true, false})
    for (auto [q0, k0] : {std::pair<Extent, Extent>{0, 0}, {3, 1}, {2, 8}}) {
      const kh::AttentionOptions o{.causal = causal, .q_offset = q0, .k_offset = k0};
      const auto f = kh::attention(q, k, v, o);
      const auto ref = naive_attention(q, k, v, causal, q0, k0);
      INFO("causal " << causal << ", offsets " << q0 << ", " << k0);
      REQUIRE(f.out.shape() == Shape<4>{2, 3, 7, 4});
      REQUIRE(close("out", f.out, ref.out).empty());
      for (Extent i = 0; i < ref.lse.numel(); ++i) {
        if (std::isinf(ref.lse[i])) REQUIRE(std::isinf(f.lse[i]));
        else REQUIRE(std::abs(f.lse[i] - ref.lse[i]) <= 1e-12 * (1 + std::abs(ref.lse[i])));
      }
      // Backward: J = sum(dout * out) differentiated by central differences at every entry.
      const auto g = kh::attention_backward(q, k, v, f.out, f.lse, dout, o);
      auto J = [&](const T4& qq, const T4& kk, const T4& vv) {
        const auto y = naive_attention(qq, kk, vv, causal, q0, k0).out;
        double s = 0;
        for (Extent i = 0; i < y.numel(); ++i) s += y[i] * dout[i];
        return s;
      };
      auto fd = [&](const char* what, const T4& grad, int which) {
        T4 qq = q, kk = k, vv = v;
        T4& x = which == 0 ? qq : which == 1 ? kk : vv;
        for (Extent i = 0; i < x.numel(); i += 5) {
          const double keep = x[i], h = 1e-6;
          x[i] = keep + h;
          const double jp = J(qq, kk, vv);
          x[i] = keep - h;
          const double jm = J(qq, kk, vv);
          x[i] = keep;
          const double num = (jp - jm) / (2 * h);
          if (std::abs(num - grad[i]) > 1e-6 + 1e-6 * std::abs(num))
            return detail::cat(what, "[", i, "]: ", grad[i], " vs finite difference ", num);
        }
        return std::string();
      };
      REQUIRE(fd("dq", g.dq, 0).empty());
      REQUIRE(fd("dk", g.dk, 1).empty());
      REQUIRE(fd("dv", g.dv, 2).empty());
      REQUIRE(g.dv.shape() == v.shape());
    }
  // Ring attention's local part: two key chunks merged by log-sum-exp equal attention over both.
  kernels::ChunkedAttention<double> acc(q, {{0, 0, 7}}, 4, {.causal = true});
  const auto k1 = k.slice(2, 0, 4), k2 = k.slice(2, 4, 5), v1 = v.slice(2, 0, 4), v2 = v.slice(2, 4, 5);
  const std::vector<kernels::SeqPiece> p2{{0, 4, 5}}, p1{{0, 0, 4}};
  acc.add_chunk(k2, v2, p2);
  acc.add_chunk(k1, v1, p1);
  const auto merged = std::move(acc).result();
  REQUIRE(close("chunked out", merged.out, naive_attention(q, k, v, true).out).empty());
  // Meta: FLOPs 2 P (D + Dv) forward and P (6 D + 4 Dv) backward, P the unmasked pairs.
  {
    kernels::meta::CostLog cost;
    const Tensor<double, 4, meta_space> mq(q.shape()), mk(k.shape()), mv(v.shape()), mo(dout.shape());
    const Tensor<kh::Stat, 3, meta_space> ml(Shape<3>{2, 3, 7});
    (void)kernels::meta::attention(mq, mk, mv, {});
    (void)kernels::meta::attention_backward(mq, mk, mv, mo, ml, mo, {});
    const std::int64_t pairs = 2 * 3 * (7 * 8 / 2);  // causal, 7 queries of 9 keys from position 0
    REQUIRE(cost.flops("attention") == pairs * 2 * (6 + 4));
    REQUIRE(cost.flops("attention_backward") == pairs * (6 * 6 + 4 * 4));
  }
  // q and k must share their head dimension: an Error naming the op and the shapes.
  const auto k5 = normal<double>(Shape<4>{2, 3, 9, 5}, 5);
  const auto e = error_of([&] { (void)kernels::attention(q, k5, v); });
  INFO(e);
  REQUIRE(e.find("attention") != std::string::npos);
  REQUIRE(e.find("[2, 3, 9, 5]") != std::string::npos);
}

TEST_CASE("MLA on one rank: the paper's formulas (naive double loops) and finite differences", "[mla][nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    for (Extent q_lora : {mla_shape.q_lora_rank, Extent(0)}) {
      const auto c = mla_config(4, q_lora);
      Mla<nn::ReplicatedPlan> a("attn", mesh, c, 5, 0.3, 0.3);
      auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
      auto weights = whole_weights(a);
      INFO("q_lora_rank " << q_lora);
      REQUIRE(weights.count("attn.kv_a_proj_with_mqa.weight") == 1);
      REQUIRE(weights.at("attn.kv_a_proj_with_mqa.weight").shape() == Shape<2>{8 + 4, C});
      REQUIRE(weights.at("attn.kv_b_proj.weight").shape() == Shape<2>{4 * (4 + 3), 8});
      REQUIRE(weights.at("attn.o_proj.weight").shape() == Shape<2>{C, 4 * 3});
      REQUIRE(weights.count(q_lora > 0 ? "attn.q_b_proj.weight" : "attn.q_proj.weight") == 1);
      REQUIRE(weights.count("attn.q_a_layernorm.weight") == (q_lora > 0 ? 1u : 0u));
      const auto y = full_tensor(a.forward(x).y);
      const auto c2 = compare(y, naive_mla(weights, c, x_full), {.rtol = 1e-12, .atol = 1e-12});
      INFO(c2.message);
      REQUIRE(c2.ok);
      const auto e = fd_check(a, x, r_full);
      INFO(e);
      REQUIRE(e.empty());
    }
  });
}

TEST_CASE("MLA under TP (2, 3, 4) and TP + SP, uneven positions, 4 and 6 heads, equals one rank",
          "[mla][nn][parallel]") {
  for (Extent heads : {Extent(4), Extent(6)}) {
    for (Extent q_lora : {mla_shape.q_lora_rank, Extent(0)}) {
      const auto c = mla_config(heads, q_lora);
      ModuleRun<3> ref;
      threads::run(1, [&](CommPtr w) { ref = mla_run<nn::ReplicatedPlan>(NnMesh(w, {1, 1}), c); });
      const std::vector<std::array<int, 2>> shapes = heads == 4
                                                         ? std::vector<std::array<int, 2>>{{1, 2}, {1, 4}, {2, 2}}
                                                         : std::vector<std::array<int, 2>>{{1, 2}, {1, 3}, {2, 3}};
      for (auto shape : shapes) {
        auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
          NnMesh mesh(world, shape);
          report(compare_runs(mla_run<parallel::MegatronPlan<false>>(mesh, c), ref));
          report(compare_runs(mla_run<parallel::MegatronPlan<true>>(mesh, c), ref));
        });
        INFO(heads << " heads, q_lora_rank " << q_lora << ", mesh " << to_string(shape) << ": " << summary(f));
        REQUIRE(f.empty());
      }
    }
  }
}

TEST_CASE("MLA's collectives on tp: TP 1 AR forward, 3 backward; TP + SP 3 AG + 1 RS, 3 AG + 2 RS + 1 AR",
          "[mla][nn][parallel]") {
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {1, 2});
    const auto c = mla_config(4);
    {
      Mla<parallel::MegatronPlan<false>> a("attn", mesh, c, 5);
      auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
      CommLog fl;
      auto [y, saved] = a.forward(x);
      if (fl.size() != 1 || fl.count(CollectiveKind::all_reduce, "tp") != 1) report("TP forward:\n" + fl.to_string());
      CommLog bl;
      auto [dx, w] = a.backward_input(std::move(saved), y);
      if (bl.size() != 3 || bl.count(CollectiveKind::all_reduce, "tp") != 3) report("TP backward:\n" + bl.to_string());
      CommLog wl;
      a.backward_weight(std::move(w));
      if (wl.size() != 0) report("TP backward_weight:\n" + wl.to_string());
    }
    {
      Mla<parallel::MegatronPlan<true>> a("attn", mesh, c, 5);
      auto x = distribute_replicated<nn::tokens<NnMesh, nn::SeqSplit>>(mesh, x_full);
      CommLog fl;
      auto [y, saved] = a.forward(x);
      if (fl.size() != 4 || fl.count(CollectiveKind::all_gather, "tp") != 3 ||
          fl.count(CollectiveKind::reduce_scatter, "tp") != 1)
        report("TP + SP forward:\n" + fl.to_string());
      CommLog bl;
      auto [dx, w] = a.backward_input(std::move(saved), y);
      if (bl.size() != 6 || bl.count(CollectiveKind::all_gather, "tp") != 3 ||
          bl.count(CollectiveKind::reduce_scatter, "tp") != 2 || bl.count(CollectiveKind::all_reduce, "tp") != 1)
        report("TP + SP backward:\n" + bl.to_string());
      CommLog wl;
      a.backward_weight(std::move(w));
      if (wl.size() != 0) report("TP + SP backward_weight:\n" + wl.to_string());
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("the Llama block with MLA (nn::GqaOrMla): TP + SP equals one rank, recomputation, KV cache", "[mla][nn]") {
  nn::BlockConfig bc{.dim = C,
                     .heads = 6,
                     .seq = SEQ,
                     .init_std = 0.3,
                     .out_std = 0.3,
                     .ffn = 18,
                     .rope_theta = 100,
                     .bias = false,
                     .norm_eps = 1e-5,
                     .mla = mla_shape};
  using Ref = typename models::LlamaLayers::template block<double, NnMesh, nn::ReplicatedPlan>;
  using Sp = typename models::LlamaLayers::template block<double, NnMesh, parallel::MegatronPlan<true>>;
  ModuleRun<3> ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    Ref blk("h.0", mesh, bc, 3);
    REQUIRE(blk.attn().is_mla());
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    ref = run_module(blk, mesh, x, r_full);
    // Recomputing the core and the norms gives the same gradients, bit for bit.
    auto rc = bc;
    rc.recompute = {.core_attn = true, .norm = true};
    Ref again("h.0", mesh, rc, 3);
    REQUIRE(compare_runs(run_module(again, mesh, x, r_full), ref, 0).empty());
    // KV cache: a prefill of 3 positions, then two decoded one at a time, equal the full forward.
    typename Ref::Attn::KvCache cache;
    auto full = full_tensor(blk.forward(x).y);
    auto prefix = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full.slice(1, 0, 3));
    auto y0 = full_tensor(blk.forward_cached(prefix, cache));
    REQUIRE(compare(y0, full.slice(1, 0, 3), {.rtol = 1e-12, .atol = 1e-12}).ok);
    for (Extent t = 3; t < 5; ++t) {
      auto xt = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full.slice(1, t, 1));
      auto yt = full_tensor(blk.forward_cached(xt, cache));
      const auto c = compare(yt, full.slice(1, t, 1), {.rtol = 1e-12, .atol = 1e-12});
      INFO("decoded position " << t << ": " << c.message);
      REQUIRE(c.ok);
    }
  });
  for (std::array<int, 2> shape : {std::array{1, 2}, std::array{1, 3}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      Sp blk("h.0", mesh, bc, 3);
      auto x = distribute_replicated<nn::tokens<NnMesh, nn::SeqSplit>>(mesh, x_full);
      report(compare_runs(run_module(blk, mesh, x, r_full), ref));
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("MLA bad input: heads % tp, zero or odd dims, kv_heads, GQA and GPT given an MLA shape", "[mla][nn]") {
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {1, 4});
    using Tp = Mla<parallel::MegatronPlan<false>>;
    auto expect = [&](const std::string& e, const std::string& op, const std::string& part) {
      if (e.find(op) == std::string::npos || e.find(part) == std::string::npos)
        report("expected an error of " + op + " naming \"" + part + "\", got: " + e);
    };
    expect(error_of([&] { Tp("attn", mesh, mla_config(6), 5); }), "nn::MultiHeadLatentAttention",
           "6 heads cannot be split evenly over the tensor dimension of size 4");
    auto zero = mla_config(4);
    zero.mla.v_head_dim = 0;
    expect(error_of([&] { Tp("attn", mesh, zero, 5); }), "nn::MultiHeadLatentAttention", "v_head_dim 0");
    auto odd = mla_config(4);
    odd.mla.qk_rope_head_dim = 3;
    expect(error_of([&] { Tp("attn", mesh, odd, 5); }), "nn::MultiHeadLatentAttention", "qk_rope_head_dim 3");
    auto grouped = mla_config(4);
    grouped.kv_heads = 2;
    expect(error_of([&] { Tp("attn", mesh, grouped, 5); }), "nn::MultiHeadLatentAttention", "kv_heads 2");
    auto no_rope = mla_config(4);
    no_rope.rope_theta = 0;
    expect(error_of([&] { Tp("attn", mesh, no_rope, 5); }), "nn::MultiHeadLatentAttention", "rope_theta 0");
    using Gqa = nn::SelfAttention<double, NnMesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>>;
    expect(error_of([&] { Gqa("attn", mesh, mla_config(4), 5); }), "nn::CausalSelfAttention", "kv_lora_rank 8");
    models::GPTConfig gpt{.vocab = 11, .seq = SEQ, .dim = C, .heads = 4, .layers = 1};
    gpt.mla = mla_shape;
    expect(error_of([&] { models::GPT<double, NnMesh, parallel::MegatronPlan<false>> m(mesh, gpt); }),
           "nn::CausalSelfAttention", "kv_lora_rank 8");
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

}  // namespace test_latent_attention
