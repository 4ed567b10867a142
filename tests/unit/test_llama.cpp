// The Llama pieces: ops::rotary and ops::repeat_interleave against finite differences (double)
// and their defining properties; grouped-query attention with rotary positions, SwiGLU and the
// Llama block against finite differences; tensor-parallel GQA / SwiGLU / block (TP, TP + SP on
// 1-D and 2-D meshes) equal to the one-rank modules; models::Llama's parameters and units; the
// errors for KV heads or ffn that do not split over tp. Training parity: tests/parity/test_llama_parity.cpp.
// models::generate: greedy tokens of models::GPT and models::Llama equal on one rank and TP = 2 (+SP), sampling
// deterministic and following softmax(logits / temperature) over the top k.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>

#include "dtensor/comm/threads.hpp"
#include "dtensor/models/generate.hpp"
#include "dtensor/models/hf_checkpoint.hpp"
#include "dtensor/models/llama.hpp"
#include "dtensor/ops/repeat.hpp"
#include "dtensor/ops/rotary.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/sim/serving.hpp"
#include "test_nn_support.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_llama {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

constexpr Extent B = 2, T = 5, C = 16, H = 4, KV = 2, FFN = 12, SEQ = 8;
const auto x_full = normal<double>(Shape<3>{B, T, C}, 61);
const auto r_full = normal<double>(Shape<3>{B, T, C}, 62);
const nn::AttentionConfig gqa{.dim = C, .heads = H, .seq = SEQ, .kv_heads = KV, .rope_theta = 100, .bias = false};
const nn::BlockConfig llama_bc{.dim = C, .heads = H, .seq = SEQ, .init_std = 0.3, .out_std = 0.3, .kv_heads = KV,
                               .ffn = FFN, .rope_theta = 100, .bias = false, .norm_eps = 1e-5};

template <class Plan>
using LlamaBlock = typename models::LlamaLayers::template block<double, NnMesh, Plan>;

/// Central differences of J(x) = sum(r * f(x)) at every entry of x, against `analytic`.
template <std::size_t R, class F, class G>
std::string fd_all(Tensor<double, R> x, const G& analytic, F f, const Tensor<double, R>& r) {
  auto J = [&] {
    const auto y = f(x);
    double s = 0;
    for (Extent i = 0; i < y.numel(); ++i) s += y[i] * r[i];
    return s;
  };
  return fd_span("x", x.span(), analytic.span(), J, int(x.numel()));
}

template <class Plan>
ModuleRun<3> block_run(const NnMesh& mesh) {
  LlamaBlock<Plan> blk("h.0", mesh, llama_bc, 3);
  auto x = distribute_replicated<typename decltype(blk)::In::layout>(mesh, x_full);
  return run_module(blk, mesh, x, r_full);
}
template <class Plan>
ModuleRun<3> attn_run(const NnMesh& mesh) {
  nn::CausalSelfAttention<double, NnMesh, typename Plan::qkv, typename Plan::proj> a("attn", mesh, gqa, 3, 0.3, 0.3);
  auto x = distribute_replicated<typename decltype(a)::In::layout>(mesh, x_full);
  return run_module(a, mesh, x, r_full);
}

}  // namespace

TEST_CASE("rotary: the backward is the adjoint (finite differences), position 0 is the identity, norms and "
          "relative angles are kept", "[llama][ops]") {
  const Shape<4> s{2, 3, 2, 6};
  const auto x = normal<double>(s, 1), r = normal<double>(s, 2);
  Tensor<std::int32_t, 2> pos(Shape<2>{2, 3});
  for (Extent b = 0; b < 2; ++b)
    for (Extent t = 0; t < 3; ++t) pos(b, t) = std::int32_t(b == 0 ? t : 7 - 2 * t);  // any global positions
  const double theta = 50;
  auto e = fd_all(x, kernels::rotary_backward(pos, r, theta),
                  [&](const Tensor<double, 4>& v) { return kernels::rotary(v, pos, theta); }, r);
  INFO(e);
  REQUIRE(e.empty());
  const auto y = kernels::rotary(x, pos, theta);
  // Position 0 turns by nothing; every (b, t, h) row keeps its norm.
  for (Extent i = 0; i < 6; ++i) REQUIRE(y(0, 0, 1, i) == x(0, 0, 1, i));
  for (Extent b = 0; b < 2; ++b)
    for (Extent t = 0; t < 3; ++t) {
      double nx = 0, ny = 0;
      for (Extent i = 0; i < 6; ++i) nx += x(b, t, 0, i) * x(b, t, 0, i), ny += y(b, t, 0, i) * y(b, t, 0, i);
      REQUIRE(ny == Approx(nx).epsilon(1e-12));
    }
  // <rot(q, m), rot(k, n)> depends on m - n only: (m, n) = (3, 1) and (7, 5).
  Tensor<double, 4> qk(Shape<4>{1, 4, 1, 6});
  const auto q = normal<double>(Shape<1>{6}, 3), k = normal<double>(Shape<1>{6}, 4);
  Tensor<std::int32_t, 2> p4(Shape<2>{1, 4});
  const std::int32_t at[4] = {3, 1, 7, 5};
  for (Extent t = 0; t < 4; ++t) {
    p4(0, t) = at[t];
    for (Extent i = 0; i < 6; ++i) qk(0, t, 0, i) = t % 2 == 0 ? q[i] : k[i];
  }
  const auto turned = kernels::rotary(qk, p4, theta);
  auto dot = [&](Extent a, Extent b) {
    double d = 0;
    for (Extent i = 0; i < 6; ++i) d += turned(0, a, 0, i) * turned(0, b, 0, i);
    return d;
  };
  REQUIRE(dot(0, 1) == Approx(dot(2, 3)).epsilon(1e-12));
  REQUIRE_THROWS_AS(kernels::rotary(normal<double>(Shape<4>{2, 3, 2, 5}, 1), pos, theta), Error);  // D odd
}

TEST_CASE("repeat_interleave: values, and the backward sums the repeats (finite differences)", "[llama][ops]") {
  const auto x = normal<double>(Shape<4>{2, 3, 2, 2}, 5);
  const auto y = kernels::repeat_interleave(x, 1, 3);
  REQUIRE(y.shape() == Shape<4>{2, 9, 2, 2});
  for (Extent b = 0; b < 2; ++b)
    for (Extent h = 0; h < 9; ++h) REQUIRE(y(b, h, 1, 0) == x(b, h / 3, 1, 0));
  const auto r = normal<double>(y.shape(), 6);
  auto e = fd_all(x, kernels::repeat_interleave_backward(r, 1, 3),
                  [&](const Tensor<double, 4>& v) { return kernels::repeat_interleave(v, 1, 3); }, r);
  INFO(e);
  REQUIRE(e.empty());
  REQUIRE_THROWS_AS(kernels::repeat_interleave_backward(r, 1, 2), Error);  // 9 is not a multiple of 2
}

TEST_CASE("ops::rotary and ops::repeat_interleave on a split mesh equal the one-rank ops", "[llama][ops]") {
  const auto x = normal<double>(Shape<4>{3, 5, 4, 6}, 7);  // B = 3 over dp = 2 (uneven), heads over tp = 2
  Tensor<double, 4> rot_ref, rep_ref;
  auto positions_of = [](const NnMesh& mesh) { return nn::positions<nn::tokens<NnMesh>>(mesh, {3, 5}); };
  using HeadsL = nn::tokens<NnMesh, Shard<2>>;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto xd = distribute_replicated<HeadsL>(mesh, x);
    rot_ref = full_tensor(ops::rotary(xd, positions_of(mesh), 30.0));
    rep_ref = full_tensor(ops::repeat_interleave_backward<2>(ops::repeat_interleave<2>(xd, 2), 2));
  });
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {2, 2});
    auto xd = distribute_replicated<HeadsL>(mesh, x);
    if (auto c = compare(full_tensor(ops::rotary(xd, positions_of(mesh), 30.0)), rot_ref); !c) report(c.message);
    if (auto c = compare(full_tensor(ops::repeat_interleave_backward<2>(ops::repeat_interleave<2>(xd, 2), 2)), rep_ref); !c)
      report(c.message);
    // 3 heads do not split evenly over tp = 2: the repeated pieces would not line up.
    auto odd = distribute_replicated<HeadsL>(mesh, normal<double>(Shape<4>{3, 5, 3, 6}, 8));
    try {
      (void)ops::repeat_interleave<2>(odd, 2);
      report("no error for 3 heads over tp = 2");
    } catch (const Error& e) {
      if (std::string(e.what()).find("repeat_interleave") == std::string::npos) report(e.what());
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("GQA attention with rotary positions, SwiGLU and the Llama block match finite differences", "[llama][nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    nn::CausalSelfAttention<double, NnMesh> a("attn", mesh, gqa, 3, 0.3, 0.3);
    auto e = fd_check(a, x, r_full);
    INFO("attention: " << e);
    REQUIRE(e.empty());
    nn::SwiGLU<double, NnMesh> ff("mlp", mesh, C, FFN, 4, 0.3, 0.3);
    e = fd_check(ff, x, r_full);
    INFO("swiglu: " << e);
    REQUIRE(e.empty());
    LlamaBlock<nn::ReplicatedPlan> blk("h.0", mesh, llama_bc, 3);
    e = fd_check(blk, x, r_full);
    INFO("block: " << e);
    REQUIRE(e.empty());
    // The qkv projection holds H + 2 KV heads of D features, and no bias.
    REQUIRE(a.qkv().weight().value().shape() == Shape<2>{(H + 2 * KV) * (C / H), C});
    REQUIRE(!a.qkv().bias().defined());
  });
}

TEST_CASE("tensor-parallel GQA and Llama block (TP, TP + SP) equal the one-rank modules", "[llama][nn][parallel]") {
  ModuleRun<3> attn_ref, block_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    attn_ref = attn_run<nn::ReplicatedPlan>(mesh);
    block_ref = block_run<nn::ReplicatedPlan>(mesh);
  });
  for (std::array<int, 2> shape : {std::array{1, 2}, std::array{2, 2}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      report(compare_runs(attn_run<parallel::MegatronPlan<false>>(mesh), attn_ref));
      report(compare_runs(attn_run<parallel::MegatronPlan<true>>(mesh), attn_ref));
      report(compare_runs(block_run<parallel::MegatronPlan<false>>(mesh), block_ref));
      report(compare_runs(block_run<parallel::MegatronPlan<true>>(mesh), block_ref));
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("KV heads and the ffn width must split over tp", "[llama][nn]") {
  auto f = on_ranks(4, [&](CommPtr w, auto report) {
    NnMesh mesh(w, {1, 4});
    using A = nn::CausalSelfAttention<double, NnMesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>>;
    try {
      A("attn", mesh, gqa, 3);  // 2 KV heads over tp = 4
      report("no error for 2 KV heads over tp = 4");
    } catch (const Error& e) {
      if (std::string(e.what()).find("KV heads") == std::string::npos) report(e.what());
    }
    using F = nn::SwiGLU<double, NnMesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>>;
    try {
      F("mlp", mesh, C, 10, 3);  // ffn 10 over tp = 4
      report("no error for ffn 10 over tp = 4");
    } catch (const Error& e) {
      if (std::string(e.what()).find("nn::SwiGLU") == std::string::npos) report(e.what());
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("models::Llama: parameters, units and no position table", "[llama][nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    const models::GPTConfig cfg{.vocab = 29, .seq = SEQ, .dim = C, .heads = H, .layers = 3, .kv_heads = KV, .ffn = FFN};
    models::Llama<double, NnMesh> model(mesh, cfg);
    nn::ParamList<double, 2> ps;
    model.collect(ps);
    Extent count = 0;
    bool wpe = false;
    for (const auto& p : ps) {
      count += Extent(p.value.size());
      wpe = wpe || p.name.find("wpe") != std::string::npos;
    }
    const Extent D = C / H;
    const Extent per_block = 2 * C + C * (H + 2 * KV) * D + C * C + 3 * C * FFN;
    REQUIRE(!wpe);
    REQUIRE(count == 29 * C + 3 * per_block + C + C * 29);
    REQUIRE(model.units().size() == 5);  // embed, h.0 .. h.2, head
    REQUIRE(model.units().front().params.size() == 1);  // wte alone
  });
}

// ---- models::generate ---------------------------------------------------------------------------

namespace {

template <class Model>
std::vector<std::int32_t> generate_on(const NnMesh& mesh, const models::GPTConfig& cfg,
                                      std::vector<std::int32_t> prompt, const models::GenerateOptions& o) {
  Model model(mesh, cfg);
  return models::generate(model, std::move(prompt), o);
}

template <template <class, class, class> class Arch>
void check_generate_tp(const models::GPTConfig& cfg) {
  using One = Arch<double, NnMesh, nn::ReplicatedPlan>;
  using Tp = Arch<double, NnMesh, parallel::MegatronPlan<true>>;
  const std::vector<std::int32_t> prompt{1, 2, 3};
  const models::GenerateOptions greedy{.new_tokens = 12},
      sampled{.new_tokens = 12, .temperature = 0.9, .top_k = 6, .top_p = 0.8, .seed = 7};
  std::vector<std::int32_t> ref_greedy, ref_sampled;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    ref_greedy = generate_on<One>(mesh, cfg, prompt, greedy);
    ref_sampled = generate_on<One>(mesh, cfg, prompt, sampled);
    // 15 tokens > seq 8: the context slides; a prompt of more than seq tokens keeps its last seq.
    std::vector<std::int32_t> long_prompt(ref_greedy.begin(), ref_greedy.begin() + 10);
    const auto from_long = generate_on<One>(mesh, cfg, long_prompt, {.new_tokens = 5});
    CHECK(std::vector<std::int32_t>(from_long.begin() + 10, from_long.end()) ==
          std::vector<std::int32_t>(ref_greedy.begin() + 10, ref_greedy.end()));
  });
  // The KV cache (the default) against recomputing every window: the same tokens, logits to 1e-12,
  // on one rank and under TP 2 + SP; 12 new tokens after 3 pass seq 8, so the last steps slide.
  const auto cached_vs_full = [&](const NnMesh& mesh, auto model_tag, auto report) {
    using Model = typename decltype(model_tag)::type;
    for (const auto& o : {greedy, sampled}) {
      Model model(mesh, cfg);
      auto no_cache = o;
      no_cache.kv_cache = false;
      const auto a = models::generate_logits(model, prompt, o), b = models::generate_logits(model, prompt, no_cache);
      if (a.tokens != b.tokens) report("KV-cached tokens differ from recomputed ones");
      double worst = 0;
      for (std::size_t s = 0; s < a.logits.size(); ++s)
        for (std::size_t i = 0; i < a.logits[s].size(); ++i) worst = std::max(worst, std::abs(a.logits[s][i] - b.logits[s][i]));
      if (!(worst < 1e-12)) report(dtensor::detail::cat("KV-cached logits differ from recomputed ones by ", worst));
      if (a.logits.size() != 12 || a.logits[0].size() != std::size_t(cfg.vocab)) report("12 rows of vocab logits expected");
    }
  };
  auto fc = on_ranks(1, [&](CommPtr world, auto report) {
    cached_vs_full(NnMesh(world, {1, 1}), std::type_identity<One>{}, report);
  });
  auto fc2 = on_ranks(2, [&](CommPtr world, auto report) {
    cached_vs_full(NnMesh(world, {1, 2}), std::type_identity<Tp>{}, report);
  });
  INFO(summary(fc) << summary(fc2));
  CHECK(fc.empty());
  CHECK(fc2.empty());
  REQUIRE(ref_greedy.size() == 15);
  CHECK(std::vector<std::int32_t>(ref_greedy.begin(), ref_greedy.begin() + 3) == prompt);
  CHECK(ref_sampled != ref_greedy);  // sampling at temperature 0.9 departs from the argmax
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {1, 2});
    if (generate_on<Tp>(mesh, cfg, prompt, greedy) != ref_greedy) report("greedy tokens under TP 2 differ from one rank's");
    if (generate_on<Tp>(mesh, cfg, prompt, sampled) != ref_sampled) report("sampled tokens under TP 2 differ from one rank's");
  });
  INFO(summary(f));
  CHECK(f.empty());
}

template <class T, class Mesh, class Plan>
using GptArch = models::GPT<T, Mesh, Plan>;
template <class T, class Mesh, class Plan>
using LlamaArch = models::Llama<T, Mesh, Plan>;

}  // namespace

TEST_CASE("generate: GPT and Llama give the same tokens on one rank and under TP 2 + SP", "[models][generate]") {
  // vocab 23 splits unevenly over tp 2 (12, 11).
  check_generate_tp<GptArch>({.vocab = 23, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .seed = 3});
  check_generate_tp<LlamaArch>({.vocab = 23, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .seed = 4, .kv_heads = 2,
                                .ffn = 24, .rope_theta = 100, .bias = false});
}

namespace {

namespace pp = parallel::pipeline;
using PpMesh = DeviceMesh<"pp", "dp", "tp">;

/// Generation over pipeline stages (models::generate_logits(stages, layout, mesh, ...)) against
/// the whole model on one rank: the same tokens, logits within 1e-12 in double, cached and not.
template <template <class, class, class> class Arch, class Layers, class Mesh = PpMesh>
void check_generate_pipeline(const models::GPTConfig& cfg, std::array<int, 3> shape, pp::StageLayout layout) {
  using One = Arch<double, NnMesh, nn::ReplicatedPlan>;
  const std::vector<std::int32_t> prompt{1, 2, 3};
  const std::vector<models::GenerateOptions> options{
      {.new_tokens = 9}, {.new_tokens = 9, .temperature = 0.9, .top_k = 6, .top_p = 0.8, .seed = 7}};
  std::vector<models::GenerateResult> ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto one_cfg = cfg;
    one_cfg.context = {};  // one rank: no context dimension
    One model(mesh, one_cfg);
    for (const auto& o : options) ref.push_back(models::generate_logits(model, prompt, o));
  });
  auto f = on_ranks(shape[0] * shape[1] * shape[2], [&](CommPtr world, auto report) {
    Mesh mesh(world, shape);
    const auto stage_mesh = pp::stage_mesh_of(mesh);
    using StageMesh = std::remove_cvref_t<decltype(stage_mesh)>;
    using Model = models::GptParts<double, StageMesh, parallel::MegatronPlan<true>, std::int32_t, Layers>;
    static_assert(models::detail::KvCacheable<pp::Stage<Model>>, "a GPT stage keeps KV caches");
    auto stages = pp::split(Model(stage_mesh, cfg), layout, mesh.coordinate(0));
    // The messages of one generation: per token, one send per stage whose next stage is on
    // another rank, one receive per stage whose previous one is, one broadcast of the logits on "pp".
    std::size_t sends = 0, recvs = 0;
    for (int s : layout.stages_of(mesh.coordinate(0))) {
      sends += s + 1 < layout.stages() && layout.rank_of(s + 1) != mesh.coordinate(0);
      recvs += s > 0 && layout.rank_of(s - 1) != mesh.coordinate(0);
    }
    for (std::size_t i = 0; i < options.size(); ++i)
      for (bool cache : {true, false}) {
        auto o = options[i];
        o.kv_cache = cache;
        CommLog log;
        const auto r = models::generate_logits(stages, layout, mesh, prompt, o);
        const std::size_t steps = std::size_t(o.new_tokens);
        if (log.count(CollectiveKind::broadcast, "pp") != steps || log.count(CollectiveKind::send) != steps * sends ||
            log.count(CollectiveKind::recv) != steps * recvs)
          report(dtensor::detail::cat("messages: ", log.count(CollectiveKind::broadcast, "pp"), " broadcasts on pp, ",
                                      log.count(CollectiveKind::send), " sends, ", log.count(CollectiveKind::recv),
                                      " receives; expected ", steps, ", ", steps * sends, ", ", steps * recvs));
        if (r.tokens != ref[i].tokens) report(dtensor::detail::cat("tokens differ from one rank's (options ", i, ", cache ", cache, ")"));
        double worst = 0;
        for (std::size_t s = 0; s < r.logits.size(); ++s)
          for (std::size_t v = 0; v < r.logits[s].size(); ++v) worst = std::max(worst, std::abs(r.logits[s][v] - ref[i].logits[s][v]));
        if (!(worst < 1e-12) || r.logits.size() != ref[i].logits.size())
          report(dtensor::detail::cat("logits differ from one rank's by ", worst, " (options ", i, ", cache ", cache, ")"));
      }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace

TEST_CASE("generate: over pipeline stages (x TP 2 + SP, x CP 2), KV-cached, as one rank", "[models][generate][pipeline]") {
  // 5 layers over 2 and 4 stages (uneven), vocab 23 over tp 2 (12, 11); 3 + 9 tokens pass seq 8,
  // so the cached run slides into recomputed windows at the end.
  const models::GPTConfig gpt{.vocab = 23, .seq = 8, .dim = 16, .heads = 4, .layers = 5, .seed = 3};
  const models::GPTConfig llama{.vocab = 23,
                                .seq = 8,
                                .dim = 16,
                                .heads = 4,
                                .layers = 5,
                                .seed = 4,
                                .kv_heads = 2,
                                .ffn = 24,
                                .rope_theta = 100,
                                .bias = false};
  check_generate_pipeline<GptArch, models::DenseLayers>(gpt, {2, 1, 2}, pp::StageLayout::looped(2));
  check_generate_pipeline<LlamaArch, models::LlamaLayers>(llama, {2, 1, 2}, pp::StageLayout::looped(2));
  check_generate_pipeline<GptArch, models::DenseLayers>(gpt, {2, 2, 1},
                                                        pp::StageLayout::looped(2, 2));  // 2 stages per rank, dp 2
  auto llama7 = llama;
  llama7.layers = 7;  // 6 stages of 1 or 2 blocks
  check_generate_pipeline<LlamaArch, models::LlamaLayers>(llama7, {3, 1, 1},
                                                          pp::StageLayout::v_shape(3));  // V: stages 0 and 5 on rank 0
  // With a context dimension: each stage's caches split over cp 2 (the prompt of 3 stored
  // load-balanced), ring with the Llama, all-gather with the GPT, x TP 2.
  using PpCpMesh = DeviceMesh<"pp", "cp", "tp">;
  auto gpt_cp = gpt, llama_cp = llama;
  gpt_cp.context = {.kind = parallel::ContextKind::allgather, .load_balanced = true};
  llama_cp.context = {.kind = parallel::ContextKind::ring, .load_balanced = true};
  check_generate_pipeline<GptArch, models::DenseLayers, PpCpMesh>(gpt_cp, {2, 2, 2}, pp::StageLayout::looped(2));
  check_generate_pipeline<LlamaArch, models::LlamaLayers, PpCpMesh>(llama_cp, {2, 2, 1}, pp::StageLayout::looped(2));
}

TEST_CASE("generate: the choice of a token, and bad input", "[models][generate]") {
  const std::vector<double> logits{0.5, 2.0, -1.0, 2.0, 1.5};
  CHECK(models::choose_token(logits, {}, 0) == 1);  // greedy: the first largest
  for (std::uint64_t step = 0; step < 50; ++step) {
    CHECK(models::choose_token(logits, {.temperature = 3, .top_k = 1, .seed = 9}, step) == 1);  // top-1 is greedy
    const auto t = models::choose_token(logits, {.temperature = 100, .top_k = 3, .seed = 9}, step);
    CHECK((t == 1 || t == 3 || t == 4));  // the three largest only
  }
  // Top-p: softmax(logits) is about (0.09, 0.40, 0.02, 0.40, 0.24)/1.15 sorted 1, 3, 4, 0, 2; a
  // nucleus of 0.5 takes 1 and 3, of 0.8 adds 4, of 1e-9 is the argmax alone.
  std::set<std::int32_t> seen_half, seen_most;
  for (std::uint64_t step = 0; step < 200; ++step) {
    CHECK(models::choose_token(logits, {.temperature = 1, .top_p = 1e-9, .seed = 3}, step) == 1);
    seen_half.insert(models::choose_token(logits, {.temperature = 1, .top_p = 0.5, .seed = 3}, step));
    seen_most.insert(models::choose_token(logits, {.temperature = 1, .top_p = 0.8, .seed = 3}, step));
  }
  CHECK(seen_half == std::set<std::int32_t>{1, 3});
  CHECK(seen_most == std::set<std::int32_t>{1, 3, 4});
  // Temperature 1 over all: frequencies of 20000 draws within 0.015 of softmax(logits).
  std::vector<double> count(logits.size()), p(logits.size());
  double z = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(logits[i]);
  for (std::uint64_t step = 0; step < 20000; ++step) count[std::size_t(models::choose_token(logits, {.temperature = 1, .seed = 5}, step))] += 1;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(count[i] / 20000 - p[i] / z) < 0.015);
  }
  // Ranks given different prompts or options all throw, naming what differs, before any collective
  // of the model (under TP 2 and over 2 pipeline stages).
  for (int form = 0; form < 2; ++form) {
    std::vector<std::string> errors(2);
    threads::run(2, [&](CommPtr w) {
      const bool second = w->rank() == 1;
      const models::GenerateOptions o{.new_tokens = 2, .temperature = second ? 0.5 : 0.0};
      try {
        if (form == 0) {
          NnMesh mesh(w, {1, 2});
          models::GPT<double, NnMesh, parallel::MegatronPlan<true>> model(
              mesh, {.vocab = 5, .seq = 4, .dim = 8, .heads = 2, .layers = 1});
          (void)models::generate(model, {1, second ? 2 : 3}, o);
        } else {
          using Mesh = DeviceMesh<"pp", "dp", "tp">;
          Mesh mesh(w, {2, 1, 1});
          const auto stage_mesh = parallel::pipeline::stage_mesh_of(mesh);
          auto stages =
              parallel::pipeline::split(models::GptParts<double, std::remove_cvref_t<decltype(stage_mesh)>>(
                                            stage_mesh, {.vocab = 5, .seq = 4, .dim = 8, .heads = 2, .layers = 2}),
                                        parallel::pipeline::StageLayout::looped(2), mesh.coordinate(0));
          (void)models::generate(stages, parallel::pipeline::StageLayout::looped(2), mesh, {1, second ? 2 : 3}, o);
        }
      } catch (const Error& e) {
        errors[std::size_t(w->rank())] = e.what();
      }
    });
    for (const auto& e : errors) {
      CAPTURE(form, e);
      CHECK(e.find("models::generate") != std::string::npos);
      CHECK(e.find("prompt") != std::string::npos);
      CHECK(e.find("temperature") != std::string::npos);
    }
  }
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    models::GPT<double, NnMesh> model(mesh, {.vocab = 5, .seq = 4, .dim = 8, .heads = 2, .layers = 1});
    using Catch::Contains;
    CHECK_THROWS_WITH(models::generate(model, {}, {}), Contains("models::generate") && Contains("prompt is empty"));
    CHECK_THROWS_WITH(models::generate(model, {1, 5}, {}), Contains("prompt token 5 is not in the vocabulary [0, 5)"));
    CHECK_THROWS_WITH(models::generate(model, {1}, {.temperature = -1}), Contains("none may be negative"));
    CHECK_THROWS_WITH(models::generate(model, {1}, {.temperature = 1, .top_p = 0}), Contains("top_p 0 must be in (0, 1]"));
    // The cache refuses a second multi-position input and positions beyond seq.
    using Attn = std::remove_cvref_t<decltype(model.blocks().front().inner())>::Attn;
    Attn attn("a", mesh, {.dim = 8, .heads = 2, .seq = 4}, 1);
    Attn::KvCache cache;
    auto x = distribute_replicated<Attn::In::layout>(mesh, Tensor<double, 3>(Shape<3>{1, 3, 8}));
    (void)attn.forward_cached(x, cache);
    CHECK(cache.length == 3);
    CHECK_THROWS_WITH(attn.forward_cached(x, cache), Contains("then one position at a time"));
    auto one = distribute_replicated<Attn::In::layout>(mesh, Tensor<double, 3>(Shape<3>{1, 1, 8}));
    (void)attn.forward_cached(one, cache);
    CHECK_THROWS_WITH(attn.forward_cached(one, cache), Contains("exceed the configured sequence length 4"));
  });
}

// ---- generate under context parallelism ---------------------------------------------------------
// The KV cache split over the context ranks (parallel::ContextAttention::prefill / decode) and the
// uncached windows (stored order under load balancing) against a one-rank model: logits to 1e-12,
// the same greedy tokens; ring, all-gather and Ulysses, load balanced and not, cp 2 and 3 with
// prompts that divide by neither cp nor 2 cp (and one of a single token: ranks with empty caches),
// GPT (learned positions) and Llama (rotary, 2 KV heads for 6 heads), and cp 2 x tp 2.

namespace {

using CpMesh = DeviceMesh<"cp">;
using CpTpMesh = DeviceMesh<"cp", "tp">;

double worst_logit_gap(const models::GenerateResult& a, const models::GenerateResult& b) {
  if (a.logits.size() != b.logits.size()) return 1e300;
  double worst = 0;
  for (std::size_t s = 0; s < a.logits.size(); ++s) {
    if (a.logits[s].size() != b.logits[s].size()) return 1e300;
    for (std::size_t i = 0; i < a.logits[s].size(); ++i) worst = std::max(worst, std::abs(a.logits[s][i] - b.logits[s][i]));
  }
  return worst;
}

/// Cached and uncached generation of `Model` on `mesh` against the one-rank result `ref`.
template <class Model, class Mesh, class Report>
void generate_matches(const Mesh& mesh, const models::GPTConfig& cfg, const std::vector<std::int32_t>& prompt,
                      const models::GenerateResult& ref, const std::string& what, Report report) {
  Model model(mesh, cfg);
  const models::GenerateOptions cached{.new_tokens = 9}, uncached{.new_tokens = 9, .kv_cache = false};
  for (const auto& o : {cached, uncached}) {
    const auto r = models::generate_logits(model, prompt, o);
    const std::string tag = what + (o.kv_cache ? " (KV cache)" : " (recomputed)");
    if (r.tokens != ref.tokens) report(tag + ": tokens differ from one rank's");
    const double gap = worst_logit_gap(r, ref);
    if (!(gap < 1e-12)) report(dtensor::detail::cat(tag, ": logits differ from one rank's by ", gap));
  }
}

template <template <class, class, class> class Arch>
void check_generate_cp(models::GPTConfig cfg) {
  using One = Arch<double, NnMesh, nn::ReplicatedPlan>;
  using Cp = Arch<double, CpMesh, nn::ReplicatedPlan>;
  using CpTp = Arch<double, CpTpMesh, parallel::MegatronPlan<false>>;
  using parallel::ContextKind;
  for (const std::vector<std::int32_t>& prompt : {std::vector<std::int32_t>{1, 2, 3, 4, 5}, std::vector<std::int32_t>{7}}) {
    models::GenerateResult ref;  // 5 + 9 > seq 12: the last steps slide (the window recomputed)
    threads::run(1, [&](CommPtr w) {
      One model(NnMesh(w, {1, 1}), cfg);
      ref = models::generate_logits(model, prompt, {.new_tokens = 9, .kv_cache = false});
    });
    for (int cp : {2, 3})
      for (ContextKind kind : {ContextKind::ring, ContextKind::allgather, ContextKind::ulysses})
        for (bool balanced : {false, true}) {
          cfg.context = {.kind = kind, .load_balanced = balanced};
          const std::string what = dtensor::detail::cat("cp ", cp, " ", parallel::name_of(kind), balanced ? " balanced" : "",
                                                        ", prompt of ", prompt.size());
          auto f = on_ranks(cp, [&](CommPtr world, auto report) {
            generate_matches<Cp>(CpMesh(world, {cp}), cfg, prompt, ref, what, report);
          });
          INFO(what << summary(f));
          CHECK(f.empty());
        }
    for (ContextKind kind : {ContextKind::ring, ContextKind::allgather})
      for (bool balanced : {false, true}) {
        cfg.context = {.kind = kind, .load_balanced = balanced};
        const std::string what = dtensor::detail::cat("cp 2 x tp 2 ", parallel::name_of(kind), balanced ? " balanced" : "");
        auto f = on_ranks(4, [&](CommPtr world, auto report) {
          generate_matches<CpTp>(CpTpMesh(world, {2, 2}), cfg, prompt, ref, what, report);
        });
        INFO(what << summary(f));
        CHECK(f.empty());
      }
  }
}

}  // namespace

TEST_CASE("generate under context parallelism: the split KV cache and the windows equal one rank", "[models][generate][context]") {
  check_generate_cp<GptArch>({.vocab = 23, .seq = 12, .dim = 24, .heads = 6, .layers = 2, .seed = 5});
  check_generate_cp<LlamaArch>({.vocab = 23, .seq = 12, .dim = 24, .heads = 6, .layers = 2, .seed = 6, .kv_heads = 2,
                                .ffn = 24, .rope_theta = 100, .bias = false});
}

TEST_CASE("KV cache under context parallelism: a decode step's collectives, the split, bad input", "[models][generate][context]") {
  const models::GPTConfig cfg{.vocab = 11,
                              .seq = 7,
                              .dim = 12,
                              .heads = 6,
                              .layers = 2,
                              .seed = 8,
                              .context = {.kind = parallel::ContextKind::ring, .load_balanced = true},
                              .kv_heads = 2,
                              .ffn = 16,
                              .rope_theta = 100,
                              .bias = false};
  static_assert(models::detail::KvCacheable<models::Llama<double, CpMesh, nn::ReplicatedPlan>>);
  auto f = on_ranks(3, [&](CommPtr world, auto report) {
    CpMesh mesh(world, {3});
    models::Llama<double, CpMesh, nn::ReplicatedPlan> model(mesh, cfg);
    using Attn = std::remove_cvref_t<decltype(model.blocks().front().inner())>::Attn;
    std::vector<Attn::KvCache> caches(model.blocks().size());
    using Ids = decltype(model)::Ids;
    const auto ids = [&](std::vector<std::int32_t> t, Extent batch = 1) {
      Tensor<std::int32_t, 2> x(Shape<2>{batch, Extent(t.size()) / batch});
      std::copy(t.begin(), t.end(), x.span().begin());
      return distribute_replicated<Ids::layout>(mesh, parallel::load_balance(x, 1, 3));
    };
    const auto run = [&](const Ids& x, Extent first) {
      auto h = model.prologue().forward_at(x, first);
      for (std::size_t l = 0; l < caches.size(); ++l) h = model.blocks()[l].inner().forward_cached(h, caches[l]);
      return h;
    };
    (void)run(ids({1, 2, 3, 4}), 0);  // 4 over 3 ranks (torch.chunk): 2, 2, 0 rows
    const std::vector<std::vector<Extent>> expected_rows{{2, 2, 1}, {2, 2, 2}, {3, 2, 2}};
    for (std::size_t step = 0; step < 3; ++step) {
      CommLog log;
      (void)run(ids({5}), Extent(4 + step));
      // Per layer: one all_gather of the new q, k, v and one each of the partial outputs and
      // log-sum-exps, all on the context group; nothing else (no tensor dimension here).
      if (log.count(CollectiveKind::all_gather, "cp") != 3 * caches.size() || log.size() != 3 * caches.size())
        report("decode step: expected 3 all_gather on cp per layer, got\n" + log.to_string());
      const auto& split = caches[0].split;
      if (split.rows != expected_rows[step] || split.k.extent(2) != split.rows[std::size_t(world->rank())] ||
          caches[0].length != Extent(5 + step))
        report(dtensor::detail::cat("step ", step, ": rows not balanced as documented (the fewest, lowest rank first)"));
    }
    // The cache is full (7 = seq): one more position, and a decode with another batch, fail on every rank.
    try {
      (void)run(ids({5}), 7);
      report("no error past the configured sequence length");
    } catch (const Error& e) {
      if (std::string(e.what()).find("exceed the configured sequence length 7") == std::string::npos) report(e.what());
    }
    std::vector<Attn::KvCache> fresh(model.blocks().size());
    caches.swap(fresh);
    (void)run(ids({1, 2}), 0);
    try {
      (void)run(ids({5, 6}, 2), 2);
      report("no error for a batch of 2 after a prefill of 1");
    } catch (const Error& e) {
      if (std::string(e.what()).find("batch 2, the cache's is 1") == std::string::npos) report(e.what());
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

// ---- Hugging Face checkpoints (models/hf_checkpoint.hpp) ----------------------------------------
// tests/data/hf: tiny GPT-2 (one file, Conv1D weights, a 16-row position table for a 12-position
// model, lm_head tied) and Llama (two shards and an index) checkpoints in HF's names, and the
// logits of 10 tokens from an independent float64 twin of HF's forward (scripts/hf_fixtures.py).

namespace {

const std::filesystem::path hf_dir = std::filesystem::path(DTENSOR_TEST_DATA) / "hf";

std::vector<double> hf_tensor(const std::filesystem::path& file, const std::string& name) {
  const auto info = checkpoint::safetensors::read_header(file);
  const auto& shape = info.tensors.at(name).shape;
  Extent n = 1;
  for (Extent d : shape) n *= d;
  std::vector<double> v(static_cast<std::size_t>(n));
  checkpoint::safetensors::read_box(info, name, checkpoint::Region{std::vector<Extent>(shape.size(), 0), shape}, v.data());
  return v;
}

/// Every position's logits [T * vocab] of one sequence, gathered whole.
template <class Model>
std::vector<double> all_logits(Model& model, const std::vector<std::int32_t>& tokens) {
  Tensor<std::int32_t, 2> ids(Shape<2>{1, Extent(tokens.size())});
  std::copy(tokens.begin(), tokens.end(), ids.span().begin());
  auto x = model.prologue().forward(distribute_replicated<typename Model::Ids::layout>(model.mesh(), ids)).y;
  for (auto& block : model.blocks()) x = block.forward(x).y;
  const auto logits = full_tensor(model.epilogue().forward(x).y);
  return {logits.span().begin(), logits.span().end()};
}

double worst_gap(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 1e300;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

const models::GPTConfig hf_gpt2{.vocab = 29, .seq = 12, .dim = 16, .heads = 4, .layers = 2, .norm_eps = 1e-5};
const models::GPTConfig hf_llama{.vocab = 31,
                                 .seq = 12,
                                 .dim = 16,
                                 .heads = 4,
                                 .layers = 2,
                                 .kv_heads = 2,
                                 .ffn = 24,
                                 .rope_theta = 10000,
                                 .bias = false,
                                 .norm_eps = 1e-6};

}  // namespace

TEST_CASE("Hugging Face checkpoints: GPT-2 and Llama logits equal the reference on 1, 2 and 4 ranks", "[models][hf]") {
  const auto golden = hf_dir / "logits.safetensors";
  std::vector<std::int32_t> tokens;
  for (double t : hf_tensor(golden, "tokens")) tokens.push_back(std::int32_t(t));
  const auto gpt2_ref = hf_tensor(golden, "gpt2"), llama_ref = hf_tensor(golden, "llama");
  REQUIRE(tokens.size() == 10);
  // Both sides compute in double from the same F32 weights: only the order of sums differs.
  constexpr double tol = 1e-9;
  auto check_on = [&](auto tag, const NnMesh& mesh, auto report) {
    using Plan = typename decltype(tag)::type;
    models::GPT<double, NnMesh, Plan> gpt(mesh, hf_gpt2);
    models::import_hf_safetensors(hf_dir / "gpt2_tiny.safetensors", gpt, models::HfArch::gpt2);
    if (double g = worst_gap(all_logits(gpt, tokens), gpt2_ref); !(g < tol)) report(dtensor::detail::cat("GPT-2 logits off by ", g));
    models::Llama<double, NnMesh, Plan> llama(mesh, hf_llama);
    models::import_hf_safetensors(hf_dir / "llama_tiny.safetensors.index.json", llama, models::HfArch::llama);
    if (double g = worst_gap(all_logits(llama, tokens), llama_ref); !(g < tol)) report(dtensor::detail::cat("Llama logits off by ", g));
  };
  auto f1 = on_ranks(1, [&](CommPtr w, auto report) { check_on(std::type_identity<nn::ReplicatedPlan>{}, NnMesh(w, {1, 1}), report); });
  auto f2 = on_ranks(2, [&](CommPtr w, auto report) { check_on(std::type_identity<parallel::MegatronPlan<true>>{}, NnMesh(w, {1, 2}), report); });
  auto f4 = on_ranks(4, [&](CommPtr w, auto report) { check_on(std::type_identity<parallel::MegatronPlan<false>>{}, NnMesh(w, {2, 2}), report); });
  INFO(summary(f1) << summary(f2) << summary(f4));
  CHECK(f1.empty());
  CHECK(f2.empty());
  CHECK(f4.empty());
}

TEST_CASE("Hugging Face checkpoints: export from TP 2 gives HF's tensors back; bad input", "[models][hf]") {
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor_hf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto f = on_ranks(2, [&](CommPtr w, auto report) {
    NnMesh mesh(w, {1, 2});
    models::Llama<double, NnMesh, parallel::MegatronPlan<true>> llama(mesh, hf_llama);
    models::import_hf_safetensors(hf_dir / "llama_tiny.safetensors.index.json", llama, models::HfArch::llama);
    models::export_hf_safetensors(dir / "llama.safetensors", llama, models::HfArch::llama);
    models::GPT<double, NnMesh, parallel::MegatronPlan<true>> gpt(mesh, hf_gpt2);
    models::import_hf_safetensors(hf_dir / "gpt2_tiny.safetensors", gpt, models::HfArch::gpt2);
    models::export_hf_safetensors(dir / "gpt2.safetensors", gpt, models::HfArch::gpt2);
    if (w->rank() == 0 && std::filesystem::exists(dir / "llama.safetensors.dtensor-names")) report("staging file left behind");
  });
  INFO(summary(f));
  REQUIRE(f.empty());
  // Llama: every tensor of the sharded original, exactly (F32 values held in double).
  const auto index = checkpoint::safetensors::read_index(hf_dir / "llama_tiny.safetensors.index.json");
  const auto exported = checkpoint::safetensors::read_header(dir / "llama.safetensors");
  CHECK(exported.tensors.size() == index.size());
  for (const auto& [name, file] : index) {
    CAPTURE(name);
    CHECK(hf_tensor(dir / "llama.safetensors", name) == hf_tensor(file, name));
  }
  // GPT-2: the same tensors (wpe: the model's 12 of the file's 16 rows; lm_head written, = wte).
  const auto original = checkpoint::safetensors::read_header(hf_dir / "gpt2_tiny.safetensors");
  for (const auto& [name, e] : original.tensors) {
    CAPTURE(name);
    auto mine = hf_tensor(dir / "gpt2.safetensors", name), theirs = hf_tensor(hf_dir / "gpt2_tiny.safetensors", name);
    if (name == "transformer.wpe.weight") theirs.resize(mine.size());
    CHECK(mine == theirs);
  }
  CHECK(hf_tensor(dir / "gpt2.safetensors", "lm_head.weight") == hf_tensor(hf_dir / "gpt2_tiny.safetensors", "transformer.wte.weight"));
  CHECK_FALSE(std::filesystem::exists(dir / "gpt2.safetensors.partial"));
  CHECK_FALSE(std::filesystem::exists(dir / "config.json.partial"));
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    using Catch::Contains;
    // The export's checksums: a byte of its data zeroed after writing is refused, naming the file and tensor.
    {
      const auto info = checkpoint::safetensors::read_header(dir / "gpt2.safetensors");
      const auto& e = info.tensors.at("transformer.h.1.mlp.c_fc.weight");
      std::fstream io(dir / "gpt2.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(std::streamoff(info.data_start + e.begin + 8));
      const std::string zeros(8, '\0');
      io.write(zeros.data(), 8);
    }
    models::GPT<double, NnMesh> damaged(mesh, hf_gpt2);
    CHECK_THROWS_WITH(models::import_hf_safetensors(dir / "gpt2.safetensors", damaged, models::HfArch::gpt2),
                      Contains("gpt2.safetensors: tensor 'transformer.h.1.mlp.c_fc.weight': its data's checksum"));
    models::Llama<double, NnMesh> llama(mesh, hf_llama);
    CHECK_THROWS_WITH(models::import_hf_safetensors(hf_dir / "gpt2_tiny.safetensors", llama, models::HfArch::llama),
                      Contains("models::import_hf_safetensors") && Contains("has no tensor 'model.embed_tokens.weight'"));
    models::GPTConfig wide = hf_gpt2;
    wide.dim = 32;
    models::GPT<double, NnMesh> gpt(mesh, wide);
    CHECK_THROWS_WITH(models::import_hf_safetensors(hf_dir / "gpt2_tiny.safetensors", gpt, models::HfArch::gpt2),
                      Contains("tensor 'transformer.wte.weight' is [29, 16], wte.weight needs [29, 32]"));
  });
  std::filesystem::remove_all(dir);
}

// ---- checkpoints written by transformers itself (scripts/hf_transformers_fixtures.py) ------------
// tests/data/hf/gpt2_hf and llama_hf: GPT2LMHeadModel / LlamaForCausalLM saved by save_pretrained
// (sharded, with model.safetensors.index.json; GPT-2 tied, Llama grouped-query 8 heads over 4 KV
// heads), and transformers' own float32 logits of 12 tokens (transformers_logits.safetensors).

namespace {

const models::GPTConfig tf_gpt2{.vocab = 29, .seq = 16, .dim = 16, .heads = 4, .layers = 2, .norm_eps = 1e-5};
const models::GPTConfig tf_llama{.vocab = 31,
                                 .seq = 16,
                                 .dim = 32,
                                 .heads = 8,
                                 .layers = 2,
                                 .kv_heads = 4,
                                 .ffn = 40,
                                 .rope_theta = 10000,
                                 .bias = false,
                                 .norm_eps = 1e-6};

/// What an import reads besides the elements of its boxes: the index and each shard's 8-byte
/// length and header (read here with std::ifstream, which the counter does not see).
std::uint64_t index_and_headers(const std::filesystem::path& index) {
  std::uint64_t n = std::filesystem::file_size(index);
  std::set<std::filesystem::path> files;
  for (const auto& [name, file] : checkpoint::safetensors::read_index(index)) files.insert(file);
  REQUIRE(files.size() >= 2);  // sharded, as large models are
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::uint64_t len = 0;
    in.read(reinterpret_cast<char*>(&len), 8);
    n += 8 + len;
  }
  return n;
}

}  // namespace

TEST_CASE("transformers' save_pretrained checkpoints: logits equal transformers' on 1, 4 and 8 ranks, each rank "
          "reading only its own bytes; the export loads back", "[models][hf]") {
  const auto golden = hf_dir / "transformers_logits.safetensors";
  std::vector<std::int32_t> tokens;
  for (double t : hf_tensor(golden, "tokens")) tokens.push_back(std::int32_t(t));
  REQUIRE(tokens.size() == 12);
  const auto gpt2_ref = hf_tensor(golden, "gpt2"), llama_ref = hf_tensor(golden, "llama");
  const auto gpt2_index = hf_dir / "gpt2_hf" / "model.safetensors.index.json";
  const auto llama_index = hf_dir / "llama_hf" / "model.safetensors.index.json";
  const std::uint64_t gpt2_extra = index_and_headers(gpt2_index), llama_extra = index_and_headers(llama_index);
  // dtensor in double from the F32 weights against transformers' float32 forward: float32's
  // rounding (the script prints it: about 1e-6 here) is the whole gap.
  constexpr double tol = 1e-5;
  // DTENSOR_HF_EXPORT=DIR keeps the TP 4 export for scripts/hf_transformers_fixtures.py --check-export DIR.
  const char* keep = std::getenv("DTENSOR_HF_EXPORT");
  const auto out = keep ? std::filesystem::path(keep) : std::filesystem::temp_directory_path() / ("dtensor_tf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(out / "gpt2");
  std::filesystem::create_directories(out / "llama");
  auto check_on = [&](auto tag, const NnMesh& mesh, bool save, auto report) {
    using Plan = typename decltype(tag)::type;
    auto one = [&](auto& model, const std::filesystem::path& index, std::uint64_t extra, const std::vector<double>& ref,
                   models::HfArch arch, const char* what) {
      std::uint64_t own = 0;  // the elements of this rank's boxes, F32
      for (const auto& s : checkpoint::parameter_slots(model.units(), mesh)) own += std::uint64_t(s.box.numel()) * 4;
      const std::uint64_t before = checkpoint::safetensors::bytes_read();
      models::import_hf_safetensors(index, model, arch);
      const std::uint64_t read = checkpoint::safetensors::bytes_read() - before;
      if (read != own + extra)
        report(dtensor::detail::cat(what, " on ", mesh.comm().size(), " ranks, rank ", mesh.comm().rank(), ": read ", read,
                                    " bytes, its boxes' are ", own, " + ", extra, " of index and headers"));
      if (double g = worst_gap(all_logits(model, tokens), ref); !(g < tol))
        report(dtensor::detail::cat(what, " logits on ", mesh.comm().size(), " ranks off transformers' by ", g));
      if (save) models::export_hf_safetensors(out / what / "model.safetensors", model, arch);
    };
    models::GPT<double, NnMesh, Plan> gpt(mesh, tf_gpt2);
    one(gpt, gpt2_index, gpt2_extra, gpt2_ref, models::HfArch::gpt2, "gpt2");
    models::Llama<double, NnMesh, Plan> llama(mesh, tf_llama);
    one(llama, llama_index, llama_extra, llama_ref, models::HfArch::llama, "llama");
  };
  // tp 4: vocab 29 / 31 in rows of 8, 7, 7, 7 (Shard<0>, one range per rank; GPT-2's Conv1D
  // stored transposed, so strided), the row-parallel weights Shard<1> (a range per row).
  auto f1 = on_ranks(1, [&](CommPtr w, auto report) { check_on(std::type_identity<nn::ReplicatedPlan>{}, NnMesh(w, {1, 1}), false, report); });
  auto f4 = on_ranks(4, [&](CommPtr w, auto report) { check_on(std::type_identity<parallel::MegatronPlan<true>>{}, NnMesh(w, {1, 4}), true, report); });
  auto f8 = on_ranks(8, [&](CommPtr w, auto report) { check_on(std::type_identity<parallel::MegatronPlan<false>>{}, NnMesh(w, {2, 4}), false, report); });
  INFO(summary(f1) << summary(f4) << summary(f8));
  CHECK(f1.empty());
  CHECK(f4.empty());
  CHECK(f8.empty());
  // The export (one file each, HF names) imported on one rank gives transformers' logits again.
  auto fe = on_ranks(1, [&](CommPtr w, auto report) {
    NnMesh mesh(w, {1, 1});
    models::GPT<double, NnMesh> gpt(mesh, tf_gpt2);
    models::import_hf_safetensors(out / "gpt2" / "model.safetensors", gpt, models::HfArch::gpt2);
    if (double g = worst_gap(all_logits(gpt, tokens), gpt2_ref); !(g < tol)) report(dtensor::detail::cat("exported GPT-2 off by ", g));
    models::Llama<double, NnMesh> llama(mesh, tf_llama);
    models::import_hf_safetensors(out / "llama" / "model.safetensors", llama, models::HfArch::llama);
    if (double g = worst_gap(all_logits(llama, tokens), llama_ref); !(g < tol)) report(dtensor::detail::cat("exported Llama off by ", g));
  });
  INFO(summary(fe));
  CHECK(fe.empty());
  // GPT-2 from a model whose context (12) is shorter than the checkpoint's table (16): the export
  // holds the model's 12 rows and its config.json says n_positions 12, so from_pretrained loads
  // it as written (scripts/hf_transformers_fixtures.py --check-export: gpt2_seq12, 12 tokens).
  std::filesystem::create_directories(out / "gpt2_seq12");
  models::GPTConfig short_gpt2 = tf_gpt2;
  short_gpt2.seq = 12;
  auto fs = on_ranks(2, [&](CommPtr w, auto report) {
    NnMesh mesh(w, {1, 2});
    models::GPT<double, NnMesh, parallel::MegatronPlan<true>> gpt(mesh, short_gpt2);
    models::import_hf_safetensors(gpt2_index, gpt, models::HfArch::gpt2);
    models::export_hf_safetensors(out / "gpt2_seq12" / "model.safetensors", gpt, models::HfArch::gpt2);
    models::GPT<double, NnMesh, parallel::MegatronPlan<true>> back(mesh, short_gpt2);
    models::import_hf_safetensors(out / "gpt2_seq12" / "model.safetensors", back, models::HfArch::gpt2);
    if (double g = worst_gap(all_logits(back, tokens), gpt2_ref); !(g < tol)) report(dtensor::detail::cat("GPT-2 seq 12 export off by ", g));
  });
  INFO(summary(fs));
  CHECK(fs.empty());
  CHECK(models::hf_config(out / "gpt2_seq12", models::HfArch::gpt2).seq == 12);
  CHECK(checkpoint::safetensors::read_header(out / "gpt2_seq12" / "model.safetensors").tensors.at("transformer.wpe.weight").shape ==
        std::vector<Extent>{12, 16});
  // A model with a longer context than that export's table: refused by its config.json, naming it.
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    models::GPT<double, NnMesh> longer(mesh, tf_gpt2);
    CHECK_THROWS_WITH(models::import_hf_safetensors(out / "gpt2_seq12" / "model.safetensors", longer, models::HfArch::gpt2),
                      Catch::Contains("config.json: n_positions = 12, the model's seq is 16"));
  });
  if (!keep) std::filesystem::remove_all(out);
}

TEST_CASE("a Hugging Face config.json asking for what the import cannot express is refused, naming the field; "
          "tensors no parameter reads are refused", "[models][hf]") {
  // llama_hf with one field of its config.json changed (the shards linked, not copied).
  const auto src = hf_dir / "llama_hf";
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor_hfcfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.path().filename() != "config.json") std::filesystem::create_symlink(e.path(), dir / e.path().filename());
  std::ifstream in(src / "config.json");
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto import_with = [&](const std::string& from, const std::string& to) {
    std::string text = config;
    if (!from.empty()) {
      const auto at = text.find(from);
      REQUIRE(at != std::string::npos);
      text.replace(at, from.size(), to);
    }
    std::ofstream(dir / "config.json") << text;
    std::string message;
    threads::run(1, [&](CommPtr w) {
      NnMesh mesh(w, {1, 1});
      models::Llama<double, NnMesh> llama(mesh, tf_llama);
      try {
        models::import_hf_safetensors(dir / "model.safetensors.index.json", llama, models::HfArch::llama);
      } catch (const Error& e) {
        message = e.what();
      }
    });
    return message;
  };
  CHECK(import_with("", "").empty());  // as saved: imports
  CHECK_THAT(import_with("\"attention_bias\": false", "\"attention_bias\": true"),
             Catch::Contains("config.json: attention_bias = true"));
  CHECK_THAT(import_with("\"mlp_bias\": false", "\"mlp_bias\": true"), Catch::Contains("mlp_bias = true"));
  // Rope types other than default and llama3: refused, naming the type.
  for (const char* type : {"dynamic", "yarn", "linear", "longrope"})
    CHECK_THAT(import_with("\"rope_type\": \"default\"", dtensor::detail::cat("\"rope_type\": \"", type, "\", \"factor\": 2.0")),
               Catch::Contains(dtensor::detail::cat("rope_parameters.rope_type = \"", type, "\"")) &&
                   Catch::Contains("this rope type is not implemented"));
  // llama3 without its parameters; llama3 in a file the model (unscaled) does not match.
  CHECK_THAT(import_with("\"rope_type\": \"default\"", "\"rope_type\": \"llama3\", \"factor\": 8.0"),
             Catch::Contains("rope_parameters.low_freq_factor = (absent): llama3 rope scaling needs it"));
  CHECK_THAT(import_with("\"rope_type\": \"default\"", "\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                                                           "\"high_freq_factor\": 4.0"),
             Catch::Contains("rope scaling = llama3 {factor 8, low_freq_factor 1, high_freq_factor 4, "
                             "original_max_position_embeddings 16}, the model's rope_scaling is none"));
  CHECK_THAT(import_with("\"rope_type\": \"default\"", "\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, "
                                                           "\"high_freq_factor\": 4.0"),
             Catch::Contains("llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor"));
  // transformers 4's rope_scaling: read too; one that disagrees with rope_parameters is ambiguous.
  CHECK_THAT(import_with("\"pretraining_tp\": 1,", "\"pretraining_tp\": 1,\n  \"rope_scaling\": {\"rope_type\": \"llama3\"},"),
             Catch::Contains("rope_scaling = {\"rope_type\": \"llama3\", ...}") && Catch::Contains("ambiguous"));
  CHECK(import_with("\"pretraining_tp\": 1,", "\"pretraining_tp\": 1,\n  \"rope_scaling\": null,").empty());
  // Sizes, eps and theta that differ from the model's: refused, naming both.
  CHECK_THAT(import_with("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e-05"),
             Catch::Contains("rms_norm_eps = 1e-05, the model's norm_eps is 1e-06"));
  CHECK_THAT(import_with("\"rope_theta\": 10000.0", "\"rope_theta\": 500000.0"),
             Catch::Contains("rope_theta = 500000, the model's rope_theta is 10000"));
  CHECK_THAT(import_with("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 2"),
             Catch::Contains("num_key_value_heads = 2, the model's kv_heads is 4"));
  CHECK_THAT(import_with("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), Catch::Contains("hidden_act = \"gelu\""));
  std::filesystem::remove_all(dir);
  // A checkpoint with a tensor no parameter reads (a bias the model lacks): refused, naming it.
  const auto bias_dir = std::filesystem::temp_directory_path() / ("dtensor_hfbias_" + std::to_string(::getpid()));
  std::filesystem::create_directories(bias_dir);
  const auto file = bias_dir / "model.safetensors";
  std::string message;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    models::Llama<double, NnMesh> llama(mesh, tf_llama);
    models::export_hf_safetensors(file, llama, models::HfArch::llama);
    const auto info = checkpoint::safetensors::read_header(file);
    std::vector<std::vector<double>> values;
    std::vector<checkpoint::safetensors::Named<double>> named;
    for (const auto& [name, t] : info.tensors) {
      Extent n = 1;
      for (Extent d : t.shape) n *= d;
      values.emplace_back(static_cast<std::size_t>(n));
      checkpoint::safetensors::read_box(info, name, checkpoint::Region{std::vector<Extent>(t.shape.size(), 0), t.shape},
                                        values.back().data());
    }
    std::size_t i = 0;
    for (const auto& [name, t] : info.tensors) named.push_back({name, t.shape, values[i++].data()});
    const std::vector<double> bias(32, 0.5);
    named.push_back({"model.layers.0.self_attn.q_proj.bias", {32}, bias.data()});
    checkpoint::safetensors::write(file, named);
    try {
      models::import_hf_safetensors(file, llama, models::HfArch::llama);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  std::filesystem::remove_all(bias_dir);
  CHECK_THAT(message, Catch::Contains("holds 1 tensors this Llama model has no place for: 'model.layers.0.self_attn.q_proj.bias'"));
}

TEST_CASE("llama3 rope scaling (Llama 3.1): config.json read, logits equal transformers' on 1 and 4 ranks; the export "
          "writes the scaling back", "[models][hf]") {
  // tests/data/hf/llama3_hf: LlamaForCausalLM with rope_parameters {rope_type llama3, theta 100,
  // factor 8, low 1, high 4, original_max_position_embeddings 64}: of each head's 4 frequency
  // pairs, one is kept, two are smoothed and one is divided by the factor (the script's docstring).
  const auto golden = hf_dir / "transformers_logits.safetensors";
  std::vector<std::int32_t> tokens;
  for (double t : hf_tensor(golden, "tokens")) tokens.push_back(std::int32_t(t));
  const auto ref = hf_tensor(golden, "llama3");
  const auto src = hf_dir / "llama3_hf";
  const models::GPTConfig cfg = models::hf_config(src, models::HfArch::llama);
  CHECK(cfg.vocab == 31);
  CHECK(cfg.dim == 32);
  CHECK(cfg.heads == 4);
  CHECK(cfg.kv_heads == 2);
  CHECK(cfg.ffn == 40);
  CHECK(cfg.layers == 2);
  CHECK(cfg.seq == 128);
  CHECK(cfg.norm_eps == 1e-6);
  CHECK(cfg.rope_theta == 100);
  CHECK(cfg.rope_scaling == RopeScaling{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 64});
  // float32 (transformers) against double (here) from the same F32 weights: the script prints
  // the float32 rounding (about 1e-6); unscaled RoPE is off by more than 1e-2 (checked below).
  constexpr double tol = 1e-5;
  const char* keep = std::getenv("DTENSOR_HF_EXPORT");
  const auto out = keep ? std::filesystem::path(keep) : std::filesystem::temp_directory_path() / ("dtensor_l3_" + std::to_string(::getpid()));
  std::filesystem::create_directories(out / "llama3");
  auto check_on = [&](auto tag, const NnMesh& mesh, bool save, auto report) {
    using Plan = typename decltype(tag)::type;
    models::Llama<double, NnMesh, Plan> llama(mesh, cfg);
    models::import_hf_safetensors(src / "model.safetensors.index.json", llama, models::HfArch::llama);
    if (double g = worst_gap(all_logits(llama, tokens), ref); !(g < tol))
      report(dtensor::detail::cat("llama3 logits on ", mesh.comm().size(), " ranks off transformers' by ", g));
    if (save) models::export_hf_safetensors(out / "llama3" / "model.safetensors", llama, models::HfArch::llama);
  };
  auto f1 = on_ranks(1, [&](CommPtr w, auto report) { check_on(std::type_identity<nn::ReplicatedPlan>{}, NnMesh(w, {1, 1}), false, report); });
  auto f4 = on_ranks(4, [&](CommPtr w, auto report) { check_on(std::type_identity<parallel::MegatronPlan<true>>{}, NnMesh(w, {2, 2}), true, report); });
  INFO(summary(f1) << summary(f4));
  CHECK(f1.empty());
  CHECK(f4.empty());
  // The export's config.json carries the scaling (transformers' from_pretrained reads it:
  // scripts/hf_transformers_fixtures.py --check-export), and the export imports back equal.
  const models::GPTConfig back = models::hf_config(out / "llama3", models::HfArch::llama);
  CHECK(back.rope_scaling == cfg.rope_scaling);
  CHECK(back.rope_theta == cfg.rope_theta);
  // The same weights without the config.json, into an unscaled model: the scaling is what matters.
  const auto bare = std::filesystem::temp_directory_path() / ("dtensor_l3bare_" + std::to_string(::getpid()));
  std::filesystem::create_directories(bare);
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.path().filename() != "config.json") std::filesystem::create_symlink(e.path(), bare / e.path().filename());
  double exported_gap = -1, unscaled_gap = -1;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    models::Llama<double, NnMesh> again(mesh, cfg);
    models::import_hf_safetensors(out / "llama3" / "model.safetensors", again, models::HfArch::llama);
    exported_gap = worst_gap(all_logits(again, tokens), ref);
    models::GPTConfig plain = cfg;
    plain.rope_scaling = {};
    models::Llama<double, NnMesh> unscaled(mesh, plain);
    models::import_hf_safetensors(bare / "model.safetensors.index.json", unscaled, models::HfArch::llama);
    unscaled_gap = worst_gap(all_logits(unscaled, tokens), ref);
  });
  std::filesystem::remove_all(bare);
  if (!keep) std::filesystem::remove_all(out);
  CHECK(exported_gap < tol);
  CHECK(unscaled_gap > 1e-2);
}

// ---- serving memory (sim/serving.hpp) against a real model --------------------------------------

namespace {

/// This rank's parameter elements and KV-cache elements after a prefill of batch x context.
template <class Model>
std::pair<double, double> held_elements(Model& model, Extent batch, Extent context) {
  double params = 0, cache = 0;
  for (const auto& s : checkpoint::parameter_slots(model.units(), model.mesh())) params += double(s.box.numel());
  Tensor<std::int32_t, 2> ids(Shape<2>{batch, context});
  for (Extent i = 0; i < ids.numel(); ++i) ids.span()[std::size_t(i)] = std::int32_t(i % 7);
  using Cache = typename std::remove_cvref_t<decltype(model.blocks().front().inner())>::Attn::KvCache;
  std::vector<Cache> caches(model.blocks().size());
  auto x = model.prologue().forward_at(distribute_replicated<typename Model::Ids::layout>(model.mesh(), ids), 0);
  for (std::size_t l = 0; l < caches.size(); ++l) {
    x = model.blocks()[l].inner().forward_cached(x, caches[l]);
    cache += double(caches[l].k.to_local().numel() + caches[l].v.to_local().numel());
    if constexpr (requires { caches[l].split.k.numel(); })  // under CP: this rank's rows
      cache += double(caches[l].split.k.numel() + caches[l].split.v.numel());
  }
  return {params, cache};
}

}  // namespace

TEST_CASE("serving memory: weights and KV cache per rank equal a real GPT's and Llama's on one rank and TP 2", "[models][serving]") {
  const models::GPTConfig gpt{.vocab = 24, .seq = 8, .dim = 16, .heads = 4, .layers = 3, .seed = 2};
  const models::GPTConfig llama{.vocab = 24,
                                .seq = 8,
                                .dim = 16,
                                .heads = 4,
                                .layers = 3,
                                .seed = 2,
                                .kv_heads = 2,
                                .ffn = 24,
                                .rope_theta = 100,
                                .bias = false};
  auto shape = [](const models::GPTConfig& c, bool is_llama) {
    return sim::ModelShape{.layers = c.layers, .dim = c.dim, .heads = c.heads, .kv_heads = c.kv_heads, .ffn = c.ffn,
                           .vocab = c.vocab, .seq = c.seq, .llama = is_llama};
  };
  const Extent batch = 2, context = 5;
  auto check_on = [&](auto tag, int tp, const NnMesh& mesh, auto report) {
    using Plan = typename decltype(tag)::type;
    const sim::ServingShape serve{.batch = batch, .context = context, .tp = tp, .pp = 1, .bytes = sizeof(double)};
    models::GPT<double, NnMesh, Plan> g(mesh, gpt);
    models::Llama<double, NnMesh, Plan> l(mesh, llama);
    const auto [gp, gc] = held_elements(g, batch, context);
    const auto [lp, lc] = held_elements(l, batch, context);
    const auto gs = sim::serving_memory(shape(gpt, false), serve), ls = sim::serving_memory(shape(llama, true), serve);
    if (gs.weights != gp * 8 || gs.kv_cache != gc * 8)
      report(dtensor::detail::cat("GPT tp ", tp, ": predicted ", gs.weights, " + ", gs.kv_cache, " bytes, held ", gp * 8, " + ", gc * 8));
    if (ls.weights != lp * 8 || ls.kv_cache != lc * 8)
      report(dtensor::detail::cat("Llama tp ", tp, ": predicted ", ls.weights, " + ", ls.kv_cache, " bytes, held ", lp * 8, " + ", lc * 8));
  };
  auto f1 = on_ranks(1, [&](CommPtr w, auto report) { check_on(std::type_identity<nn::ReplicatedPlan>{}, 1, NnMesh(w, {1, 1}), report); });
  auto f2 = on_ranks(2, [&](CommPtr w, auto report) { check_on(std::type_identity<parallel::MegatronPlan<true>>{}, 2, NnMesh(w, {1, 2}), report); });
  INFO(summary(f1) << summary(f2));
  CHECK(f1.empty());
  CHECK(f2.empty());
  // cp 3 (x tp 2 for the Llama): the cache split over the context ranks, 5 positions as 2 + 2 + 1
  // (the busiest rank holds 2), the weights whole on every context rank.
  using CpTp = DeviceMesh<"cp", "tp">;
  auto fc = on_ranks(6, [&](CommPtr w, auto report) {
    CpTp mesh(w, {3, 2});
    auto cp_gpt = gpt, cp_llama = llama;
    cp_gpt.context = cp_llama.context = {.kind = parallel::ContextKind::ring, .load_balanced = false};
    models::GPT<double, CpTp, parallel::MegatronPlan<true>> g(mesh, cp_gpt);
    models::Llama<double, CpTp, parallel::MegatronPlan<true>> l(mesh, cp_llama);
    const sim::ServingShape serve{.batch = batch, .context = context, .tp = 2, .pp = 1, .cp = 3, .bytes = sizeof(double)};
    const auto gs = sim::serving_memory(shape(gpt, false), serve), ls = sim::serving_memory(shape(llama, true), serve);
    const auto [gp, gc] = held_elements(g, batch, context);
    const auto [lp, lc] = held_elements(l, batch, context);
    const bool busiest = mesh.coordinate(0) < 2;  // torch.chunk's 2, 2, 1
    if (gs.weights != gp * 8 || (busiest && gs.kv_cache != gc * 8) || (!busiest && gs.kv_cache != 2 * gc * 8))
      report(dtensor::detail::cat("GPT cp 3 x tp 2: predicted ", gs.weights, " + ", gs.kv_cache, " bytes, held ", gp * 8, " + ", gc * 8));
    if (ls.weights != lp * 8 || (busiest && ls.kv_cache != lc * 8))
      report(dtensor::detail::cat("Llama cp 3 x tp 2: predicted ", ls.weights, " + ", ls.kv_cache, " bytes, held ", lp * 8, " + ", lc * 8));
  });
  INFO(summary(fc));
  CHECK(fc.empty());
  // pp 2 over 3 layers: the first stage's 2 blocks and the larger end (here the head: vocab x dim + norm).
  const auto p = sim::serving_memory(shape(llama, true), {.batch = 1, .context = 8, .tp = 1, .pp = 2, .bytes = 2});
  CHECK(p.layers == 2);
  CHECK(p.kv_per_token == 2.0 * 2 * (2 * 4) * 2);  // k and v, 2 layers, 2 KV heads x head_dim 4, bf16
  CHECK(p.kv_cache == p.kv_per_token * 8);
  using Catch::Contains;
  CHECK_THROWS_WITH(sim::serving_memory(shape(llama, true), {.context = 9}), Contains("context 9 is beyond the model's 8 positions"));
  CHECK_THROWS_WITH(sim::serving_memory(shape(llama, true), {.tp = 4}), Contains("2 KV heads over tp 4"));
}

TEST_CASE("serving latency: memory-bound decode, TP all-reduces and PP sends on the link model", "[models][serving]") {
  // Llama 3 70B in bf16 on H100s (sim::Hardware's defaults: 3.35 TB/s HBM, NVLink 450 GB/s + 3 us
  // in nodes of 8, the network 50 GB/s + 6 us), one sequence of 128 positions.
  const sim::ModelShape l70{.layers = 80, .dim = 8192, .heads = 64, .kv_heads = 8, .ffn = 28672, .vocab = 128256,
                            .seq = 8192, .llama = true};
  sim::Hardware hw;
  hw.fp32 = false;
  const double hbm = hw.hbm_bytes_per_second * sim::calibration.hbm_fraction, link = sim::calibration.link_fraction;
  auto shape = [](int tp, int pp, std::int64_t batch = 1) { return sim::ServingShape{.batch = batch, .context = 128, .tp = tp, .pp = pp, .bytes = 2}; };
  // One rank: every weight and cached key and value read once per token; its FLOPs far below.
  const auto one = sim::serving_latency(l70, shape(1, 1), hw);
  const auto m1 = sim::serving_memory(l70, shape(1, 1));
  CHECK(one.decode == Approx((m1.weights + m1.kv_cache) / hbm).epsilon(1e-12));
  CHECK(one.decode_compute < one.decode_memory / 5);
  CHECK(one.decode_tp == 0);
  CHECK(one.decode_pp == 0);
  // tp 8 (a node): a rank's weights and cache at its HBM, plus 2 x 80 + 1 all-reduces of 8192 bf16
  // values (ring: 2 x 7/8 of 16384 bytes; 2 log2(8) = 6 latencies) and the logits' all-gather.
  const auto t8 = sim::serving_latency(l70, shape(8, 1), hw);
  const auto m8 = sim::serving_memory(l70, shape(8, 1));
  CHECK(t8.decode_memory == Approx((m8.weights + m8.kv_cache) / hbm).epsilon(1e-12));
  const double all_reduce = 6 * 3e-6 + 2 * 14336.0 / (450e9 * link), all_gather = 7 * 3e-6 + 224448.0 / (450e9 * link);
  CHECK(t8.decode_tp == Approx(161 * all_reduce + all_gather).epsilon(1e-12));
  CHECK(t8.decode == Approx(t8.decode_memory + t8.decode_tp).epsilon(1e-12));
  CHECK(t8.decode < one.decode / 4);  // 8 HBMs, less the all-reduces
  // pp 2 over two nodes: the stages in turn read the same bytes, and one send of 16384 bytes
  // crosses the network.
  const auto p2 = sim::serving_latency(l70, shape(8, 2), hw);
  CHECK(p2.decode_memory == Approx(t8.decode_memory).epsilon(1e-12));
  CHECK(p2.decode_tp == Approx(t8.decode_tp).epsilon(1e-12));
  CHECK(p2.decode_pp == Approx(6e-6 + 16384.0 / (50e9 * link)).epsilon(1e-12));
  // cp 2 x tp 4 in a node: each rank reads the weights of tp 4 and half the cache; per block 3
  // all-gathers on NVLink: the new q, k, v (1 x (8192 + 2 x 1024) / 4 bf16), the partial outputs
  // (2 x 8192 / 4 bf16) and their statistics (2 x 64 / 4 floats).
  const auto c2 = sim::serving_latency(l70, {.batch = 1, .context = 128, .tp = 4, .pp = 1, .cp = 2, .bytes = 2}, hw);
  const auto mc2 = sim::serving_memory(l70, {.batch = 1, .context = 128, .tp = 4, .pp = 1, .cp = 2, .bytes = 2});
  const auto m4 = sim::serving_memory(l70, shape(4, 1));
  CHECK(mc2.weights == m4.weights);
  CHECK(mc2.kv_cache == m4.kv_cache / 2);
  CHECK(c2.decode_memory == Approx((mc2.weights + mc2.kv_cache) / hbm).epsilon(1e-12));
  auto gather2 = [&](double bytes) { return 3e-6 + bytes / 2 / (450e9 * link); };  // ring of 2: 1 latency, half the bytes
  CHECK(c2.decode_cp == Approx(80 * (gather2(2.0 * (8192 + 2048) / 4) + gather2(2 * 2.0 * 8192 / 4) + gather2(2 * 4.0 * 64 / 4)))
                            .epsilon(1e-12));
  CHECK(c2.decode == Approx(c2.decode_memory + c2.decode_tp + c2.decode_cp).epsilon(1e-12));
  // The prefill of 64 x 128 positions is compute-bound: at least its GEMM FLOPs at the best GEMM rate.
  const auto big = sim::serving_latency(l70, shape(8, 1, 64), hw);
  CHECK(big.prefill > 64 * 128 * 2 * l70.params() / 8 / (hw.peak_bf16_flops * sim::calibration.gemm_max_fraction) * 0.9);
  CHECK(big.prefill > big.decode);
  CHECK(big.decode > t8.decode);  // 64 sequences' caches
}

}  // namespace test_llama
