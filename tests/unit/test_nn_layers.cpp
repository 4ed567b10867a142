// nn::Linear (every style), LayerNorm / RMSNorm, Embedding, MLP and the losses: backward
// against finite differences (one rank, double), and each distributed layout against the
// one-rank run, with the collectives each style documents. Activations are [B, T, C]: B = 3
// splits unevenly over dp = 2, T = 6 over tp = 4 under sequence parallelism (2, 2, 2, 0).
#include <catch2/catch.hpp>

#include "dtensor/core/float8.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/nn/embedding.hpp"
#include "dtensor/nn/fp8_recipe.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/mlp.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/parallel/vocab_parallel.hpp"
#include "test_nn_support.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_nn_layers {

using namespace dtensor;
using namespace dtensor::testing;
using parallel::ColwiseParallel;
using parallel::RowwiseParallel;

namespace {

constexpr Extent B = 3, T = 6, IN = 8, OUT = 6;  // 6 features over tp = 4: chunks 2, 2, 2, 0
const auto x_full = normal<double>(Shape<3>{B, T, IN}, 11);
const auto r_out = normal<double>(Shape<3>{B, T, OUT}, 12);
const auto r_in = normal<double>(Shape<3>{B, T, IN}, 13);

template <class Style>
ModuleRun<3> linear_run(const NnMesh& mesh) {
  nn::Linear<double, NnMesh, Style> lin("fc", mesh, IN, OUT, 5);
  auto x = distribute_replicated<typename decltype(lin)::InL>(mesh, x_full);
  return run_module(lin, mesh, x, r_out);
}

ModuleRun<3> linear_reference() {
  ModuleRun<3> ref;
  threads::run(1, [&](CommPtr w) { ref = linear_run<nn::Replicated<>>(NnMesh(w, {1, 1})); });
  return ref;
}

/// "" or what a log holds beyond exactly (all-gathers, reduce-scatters, all-reduces) on "tp".
std::string tp_collectives(const CommLog& log, std::size_t ag, std::size_t rs, std::size_t ar) {
  if (log.count(CollectiveKind::all_gather, "tp") != ag || log.count(CollectiveKind::reduce_scatter, "tp") != rs ||
      log.count(CollectiveKind::all_reduce, "tp") != ar || log.size() != ag + rs + ar)
    return detail::cat("expected ", ag, " AG, ", rs, " RS, ", ar, " AR on tp, got:\n", log.to_string());
  return {};
}

/// A distributed Linear equals the one-rank one and issues exactly its style's collectives.
template <class Style>
void check_linear_style(std::array<int, 2> shape, std::size_t fwd_ag, std::size_t fwd_rs, std::size_t fwd_ar,
                        std::size_t bwd_ag, std::size_t bwd_rs, std::size_t bwd_ar) {
  const auto ref = linear_reference();
  auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
    NnMesh mesh(world, shape);
    report(compare_runs(linear_run<Style>(mesh), ref));
    nn::Linear<double, NnMesh, Style> lin("fc", mesh, IN, OUT, 5);
    auto x = distribute_replicated<typename decltype(lin)::InL>(mesh, x_full);
    CommLog fl;
    auto [y, saved] = lin.forward(x);
    if (auto e = tp_collectives(fl, fwd_ag, fwd_rs, fwd_ar); !e.empty()) report(std::string(Style::name) + " forward: " + e);
    // What a Linear saves is its input as given (under SP this rank's positions), never the
    // gathered copy the matmul used (Megatron's saving; nn/linear.hpp).
    if (saved.x.to_local().shape() != x.to_local().shape())
      report(std::string(Style::name) + " saved " + to_string(saved.x.to_local().shape()) + " for an input of " +
             to_string(x.to_local().shape()));
    auto dy = distribute_replicated<typename decltype(y)::layout>(mesh, r_out);
    CommLog bl;
    auto [dx, wctx] = lin.backward_input(std::move(saved), dy);
    if (auto e = tp_collectives(bl, bwd_ag, bwd_rs, bwd_ar); !e.empty())
      report(std::string(Style::name) + " backward_input: " + e);
    CommLog wl;
    lin.backward_weight(std::move(wctx));
    if (wl.size() != 0) report(std::string(Style::name) + " backward_weight communicated:\n" + wl.to_string());
  });
  INFO(Style::name << " on " << to_string(shape) << ": " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

TEST_CASE("nn::Linear backward matches finite differences", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::Linear<double, NnMesh> lin("fc", mesh, IN, OUT, 5);
    // A non-zero bias, so that a wrong bias gradient shows.
    lin.bias().value().local() = normal<double>(Shape<1>{OUT}, 6);
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    const auto e = fd_check(lin, x, r_out);
    INFO(e);
    REQUIRE(e.empty());
  });
}

TEST_CASE("nn::Linear in every tensor-parallel style equals the one-rank Linear", "[nn][parallel]") {
  // (forward AG, RS, AR; backward AG, RS, AR) on "tp", as parallel/tensor_parallel.hpp documents.
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    check_linear_style<ColwiseParallel<>>(shape, 0, 0, 0, 0, 0, 1);
    check_linear_style<ColwiseParallel<nn::SeqSplit>>(shape, 1, 0, 0, 1, 1, 0);  // backward: the saved shard re-gathered
    check_linear_style<RowwiseParallel<>>(shape, 0, 0, 1, 0, 0, 0);
    check_linear_style<RowwiseParallel<nn::SeqSplit>>(shape, 0, 1, 0, 1, 0, 0);
    check_linear_style<nn::Replicated<>>(shape, 0, 0, 0, 0, 0, 0);
    check_linear_style<nn::Replicated<nn::SeqSplit>>(shape, 0, 0, 0, 0, 0, 0);
  }
}

TEST_CASE("nn::Linear whose entry moves no data (tp = 1) copies no input and equals one rank", "[nn][parallel]") {
  // Under sequence parallelism the input (Shard<1> on tp) and the matmul's (Replicate on tp)
  // differ in type but place alike where tp = 1: the forward then multiplies the saved input
  // itself, with no copy of it, and backward hands it to the weight gradient without one.
  check_linear_style<ColwiseParallel<nn::SeqSplit>>({4, 1}, 0, 0, 0, 0, 0, 0);
  check_linear_style<ColwiseParallel<nn::SeqSplit>>({2, 1}, 0, 0, 0, 0, 0, 0);
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {2, 1});
    nn::Linear<double, NnMesh, ColwiseParallel<nn::SeqSplit>> lin("fc", mesh, IN, OUT, 5);
    using Lin = decltype(lin);
    static_assert(!std::is_same_v<Lin::InL, Lin::style::compute_layout<NnMesh>>);
    auto x = distribute_replicated<Lin::InL>(mesh, x_full);
    const auto x_bytes = std::int64_t(x.to_local().numel() * sizeof(double));
    const auto* x_data = x.to_local().data();
    {  // a temporary input: only the output is allocated
      auto xt = x;
      const auto* xt_data = xt.to_local().data();
      MemoryLedger ledger;
      auto [y, saved] = lin.forward(std::move(xt));
      const auto y_bytes = std::int64_t(y.to_local().numel() * sizeof(double));
      if (ledger.peak("host") >= y_bytes + x_bytes)
        report(detail::cat("forward of a temporary allocated ", ledger.peak("host"), " B at its peak: output ", y_bytes,
                           " B and a copy of the ", x_bytes, " B input"));
      if (saved.x.to_local().data() != xt_data) report("the saved input is not the temporary's storage");
    }
    {  // an lvalue: saved as a copy (one), and left as it was
      MemoryLedger ledger;
      auto [y, saved] = lin.forward(x);
      const auto y_bytes = std::int64_t(y.to_local().numel() * sizeof(double));
      if (ledger.peak("host") >= y_bytes + 2 * x_bytes)
        report(detail::cat("forward of an lvalue allocated ", ledger.peak("host"), " B at its peak"));
      if (x.to_local().data() != x_data || x.to_local().shape() != saved.x.to_local().shape())
        report("forward changed its lvalue input");
      for (Extent i = 0; i < x.to_local().numel(); ++i)
        if (x.to_local().data()[i] != saved.x.to_local().data()[i]) report("the saved input differs from the input");
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("nn::Linear checks its input and output gradient", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::Linear<double, NnMesh> lin("fc", mesh, IN, OUT, 5);
    auto bad = distribute_replicated<nn::tokens<NnMesh>>(mesh, normal<double>(Shape<3>{B, T, IN + 1}, 1));
    try {
      (void)lin.forward(bad);
      FAIL("no exception");
    } catch (const Error& e) {
      REQUIRE(std::string(e.what()).find("nn::Linear") != std::string::npos);
      REQUIRE(std::string(e.what()).find("[3, 6, 9]") != std::string::npos);
    }
    auto [y, saved] = lin.forward(distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full));
    auto bad_dy = distribute_replicated<nn::tokens<NnMesh>>(mesh, normal<double>(Shape<3>{B, T + 1, OUT}, 2));
    try {
      (void)lin.backward_input(std::move(saved), bad_dy);
      FAIL("no exception");
    } catch (const Error& e) {
      REQUIRE(std::string(e.what()).find("nn::Linear::backward_input") != std::string::npos);
      REQUIRE(std::string(e.what()).find("[3, 7, 6]") != std::string::npos);
    }
    REQUIRE_THROWS_AS((nn::Linear<double, NnMesh>("fc", mesh, 0, OUT, 5)), Error);
  });
}

namespace {

/// sum_p FA(a[i,p] sa) FB(b[j,p] sb) / (sa sb): the FP8 product of [M, K] a and [N, K] b (a b^T),
/// summed in double (the tests' tolerance covers the fp32 sum of the kernel).
template <class FA, class FB>
Tensor<double, 2> fp8_abt(const Tensor<double, 2>& a, double amax_a, const Tensor<double, 2>& b, double amax_b) {
  const float sa = FA::max_value() / float(amax_a), sb = FB::max_value() / float(amax_b);
  Tensor<double, 2> c(Shape<2>{a.extent(0), b.extent(0)});
  for (Extent i = 0; i < a.extent(0); ++i)
    for (Extent j = 0; j < b.extent(0); ++j) {
      double s = 0;
      for (Extent p = 0; p < a.extent(1); ++p)
        s += double(float(FA(float(float(a(i, p)) * sa)))) * double(float(FB(float(float(b(j, p)) * sb))));
      c(i, j) = s * double(1.f / sa * (1.f / sb));
    }
  return c;
}

double max_abs(const Tensor<double, 2>& t) {
  double m = 0;
  for (Extent i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t[i]));
  return m;
}

Tensor<double, 2> transposed(const Tensor<double, 2>& t) {
  Tensor<double, 2> r(Shape<2>{t.extent(1), t.extent(0)});
  for (Extent i = 0; i < t.extent(0); ++i)
    for (Extent j = 0; j < t.extent(1); ++j) r(j, i) = t(i, j);
  return r;
}

/// "" or where two FP8 runs differ beyond the fp32 summation order (rtol = atol = 1e-5).
std::string fp8_compare(const ModuleRun<3>& got, const ModuleRun<3>& ref) {
  const Tolerance tol{.rtol = 1e-5, .atol = 1e-5};
  if (auto c = compare(got.y, ref.y, tol); !c) return "output: " + c.message;
  if (auto c = compare(got.dx, ref.dx, tol); !c) return "input gradient: " + c.message;
  for (std::size_t i = 0; i < ref.grads.size(); ++i)
    for (std::size_t k = 0; k < ref.grads[i].second.size(); ++k)
      if (!(std::abs(got.grads[i].second[k] - ref.grads[i].second[k]) <= 1e-5 * (1 + std::abs(ref.grads[i].second[k]))))
        return detail::cat("gradient of ", ref.grads[i].first, "[", k, "]");
  return {};
}

}  // namespace

TEST_CASE("nn::Linear under FP8 autocast: E4M3 forward, E5M2 gradients, delayed scales", "[nn][fp8]") {
  const nn::Fp8Autocast fp8(true, {.history = 2, .margin = 0});
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::Linear<double, NnMesh> lin("fc", mesh, IN, OUT, 5, {.bias = true, .init_std = 0.5});
    lin.bias().value().local() = normal<double>(Shape<1>{OUT}, 6);
    const auto x2 = x_full.reshape<2>(Shape<2>{B * T, IN});
    const auto wt = lin.weight().value().to_local();
    const auto dy2 = r_out.reshape<2>(Shape<2>{B * T, OUT});
    // The first use of each role takes its own amax: scale = fp8_max / amax.
    auto [y, saved] = lin.forward(distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full));
    const auto y_ref = fp8_abt<float8_e4m3, float8_e4m3>(x2, max_abs(x2), wt, max_abs(wt));
    const auto yl = y.to_local().reshape<2>(Shape<2>{B * T, OUT});
    double exact_diff = 0;
    for (Extent i = 0; i < B * T; ++i)
      for (Extent o = 0; o < OUT; ++o) {
        const double b = lin.bias().value().to_local()[o];
        REQUIRE(std::abs(yl(i, o) - (y_ref(i, o) + b)) <= 1e-6 * (1 + std::abs(yl(i, o))));
        double e = b;
        for (Extent p = 0; p < IN; ++p) e += x2(i, p) * wt(o, p);
        exact_diff = std::max(exact_diff, std::abs(yl(i, o) - e));
      }
    CHECK(exact_diff > 1e-3);  // it did quantize (E4M3 keeps 4 significant bits)
    CHECK(saved.fp8_sx == 448.f / float(max_abs(x2)));
    // Backward: dx = dy W with dy in E5M2, dW = dy^T x; x and W with the forward's scales.
    auto [dx, ctx] = lin.backward_input(std::move(saved), distribute_replicated<nn::tokens<NnMesh>>(mesh, r_out));
    const auto dx_ref = fp8_abt<float8_e5m2, float8_e4m3>(dy2, max_abs(dy2), transposed(wt), max_abs(wt));
    const auto dxl = dx.to_local().reshape<2>(Shape<2>{B * T, IN});
    for (Extent i = 0; i < dx_ref.numel(); ++i)
      REQUIRE(std::abs(dxl[i] - dx_ref[i]) <= 1e-6 * (1 + std::abs(dx_ref[i])));
    nn::zero_grad(lin);
    lin.backward_weight(std::move(ctx));
    const auto dw_ref = fp8_abt<float8_e5m2, float8_e4m3>(transposed(dy2), max_abs(dy2), transposed(x2), max_abs(x2));
    const auto& dw = lin.weight().grad_local();
    for (Extent i = 0; i < dw_ref.numel(); ++i)
      REQUIRE(std::abs(dw[i] - dw_ref[i]) <= 1e-6 * (1 + std::abs(dw_ref[i])));

    // The second use is delayed: 3x quantizes with the first step's scale (its large values
    // saturate at 448 / scale), and only then is amax(3x) recorded.
    auto x3 = x_full;
    for (Extent i = 0; i < x3.numel(); ++i) x3[i] *= 3;
    auto [y3, s3] = lin.forward(distribute_replicated<nn::tokens<NnMesh>>(mesh, x3));
    CHECK(s3.fp8_sx == 448.f / float(max_abs(x2)));
    const auto& h = lin.fp8_scaling_state()->input;
    REQUIRE(h.history().size() == 2);
    CHECK(h.history()[1] == float(3 * max_abs(x2)));
    CHECK(h.next_scale() == 448.f / float(3 * max_abs(x2)));
    const auto x3_2 = x3.reshape<2>(Shape<2>{B * T, IN});
    // fp8_abt takes the scale from the amax it is given: the old one.
    const auto y3_ref = fp8_abt<float8_e4m3, float8_e4m3>(x3_2, max_abs(x2), wt, max_abs(wt));
    const auto y3l = y3.to_local().reshape<2>(Shape<2>{B * T, OUT});
    for (Extent i = 0; i < B * T; ++i)
      for (Extent o = 0; o < OUT; ++o)
        REQUIRE(std::abs(y3l(i, o) - (y3_ref(i, o) + lin.bias().value().to_local()[o])) <=
                1e-6 * (1 + std::abs(y3l(i, o))));
  });
}

TEST_CASE("nn::Linear under FP8 autocast: every tensor-parallel style equals one rank, amax all-reduces",
          "[nn][parallel][fp8]") {
  const nn::Fp8Autocast fp8;
  const auto check_style = [&]<class Style>(Style, std::array<std::size_t, 6> collectives) {
    const auto ref = linear_reference();
    for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
      auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
        NnMesh mesh(world, shape);
        if (auto e = fp8_compare(linear_run<Style>(mesh), ref); !e.empty()) report(std::string(Style::name) + ": " + e);
        if (shape[0] != 1) return;
        // The style's collectives plus one all-reduce of one float per tensor split over tp.
        nn::Linear<double, NnMesh, Style> lin("fc", mesh, IN, OUT, 5);
        auto x = distribute_replicated<typename decltype(lin)::InL>(mesh, x_full);
        CommLog fl;
        auto [y, saved] = lin.forward(x);
        if (auto e = tp_collectives(fl, collectives[0], collectives[1], collectives[2]); !e.empty())
          report(std::string(Style::name) + " forward: " + e);
        auto dy = distribute_replicated<typename decltype(y)::layout>(mesh, r_out);
        CommLog bl;
        auto [dx, wctx] = lin.backward_input(std::move(saved), dy);
        if (auto e = tp_collectives(bl, collectives[3], collectives[4], collectives[5]); !e.empty())
          report(std::string(Style::name) + " backward_input: " + e);
      });
      INFO(Style::name << " on " << to_string(shape) << ": " << summary(f));
      REQUIRE(f.empty());
    }
  };
  // (forward AG, RS, AR; backward AG, RS, AR) on "tp": the styles' (see the test above), plus
  // an all-reduce for W (split in every TP style), for x where it is split at the GEMM (row-wise),
  // and for dy where it is split (column-wise).
  check_style(ColwiseParallel<>{}, {0, 0, 1, 0, 0, 2});
  check_style(ColwiseParallel<nn::SeqSplit>{}, {1, 0, 1, 1, 1, 1});
  check_style(RowwiseParallel<>{}, {0, 0, 3, 0, 0, 0});
  check_style(RowwiseParallel<nn::SeqSplit>{}, {0, 1, 2, 1, 0, 0});
  check_style(nn::Replicated<>{}, {0, 0, 0, 0, 0, 0});
  check_style(nn::Replicated<nn::SeqSplit>{}, {0, 0, 1, 0, 0, 1});
}

TEST_CASE("LayerNorm and RMSNorm: finite differences, and sequence-parallel equals one rank", "[nn]") {
  ModuleRun<3> ln_ref, rms_ref;
  const auto ln_weight = normal<double>(Shape<1>{IN}, 21), ln_bias = normal<double>(Shape<1>{IN}, 22);
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    nn::LayerNorm<double, NnMesh> ln("ln", mesh, IN);
    nn::RMSNorm<double, NnMesh> rms("rms", mesh, IN);
    // Non-trivial weights so that their gradients enter dx.
    ln.weight().value().local() = ln_weight;
    ln.bias().value().local() = ln_bias;
    rms.weight().value().local() = ln_weight;
    auto e = fd_check(ln, x, r_in);
    INFO(e);
    REQUIRE(e.empty());
    e = fd_check(rms, x, r_in);
    INFO(e);
    REQUIRE(e.empty());
    ln_ref = run_module(ln, mesh, x, r_in);
    rms_ref = run_module(rms, mesh, x, r_in);
  });
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      auto x = distribute_replicated<nn::tokens<NnMesh, nn::SeqSplit>>(mesh, x_full);
      nn::LayerNorm<double, NnMesh, nn::SeqSplit> ln("ln", mesh, IN);
      nn::RMSNorm<double, NnMesh, nn::SeqSplit> rms("rms", mesh, IN);
      // Written through the views into the flat groups.
      ln.weight().value().local() = distribute_replicated<nn::params<NnMesh>>(mesh, ln_weight).to_local();
      ln.bias().value().local() = distribute_replicated<nn::params<NnMesh>>(mesh, ln_bias).to_local();
      rms.weight().value().local() = distribute_replicated<nn::params<NnMesh>>(mesh, ln_weight).to_local();
      CommLog log;
      (void)forward_backward(ln, x, dy_from(r_in));
      if (log.size() != 0) report("a norm communicated:\n" + log.to_string());
      report(compare_runs(run_module(ln, mesh, x, r_in), ln_ref));
      report(compare_runs(run_module(rms, mesh, x, r_in), rms_ref));
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("MLP: finite differences, and Megatron (with and without SP) equals one rank", "[nn][parallel]") {
  ModuleRun<3> ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    nn::MLP<double, NnMesh> mlp("mlp", mesh, IN, 4 * IN, 9, 0.3, 0.3);
    const auto e = fd_check(mlp, x, r_in);
    INFO(e);
    REQUIRE(e.empty());
    ref = run_module(mlp, mesh, x, r_in);
  });
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      nn::MLP<double, NnMesh, ColwiseParallel<>, RowwiseParallel<>> tp("mlp", mesh, IN, 4 * IN, 9, 0.3, 0.3);
      report(compare_runs(run_module(tp, mesh, distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full), r_in), ref));
      nn::MLP<double, NnMesh, ColwiseParallel<nn::SeqSplit>, RowwiseParallel<nn::SeqSplit>> sp("mlp", mesh, IN, 4 * IN, 9,
                                                                                                0.3, 0.3);
      report(compare_runs(run_module(sp, mesh, distribute_replicated<nn::tokens<NnMesh, nn::SeqSplit>>(mesh, x_full), r_in),
                          ref));
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("Embedding: gradient is the scatter of dy; vocabulary-parallel equals one rank", "[nn][parallel]") {
  constexpr Extent V = 7, C = 4;  // 7 rows over tp = 4: 2, 2, 2, 1
  auto ids_full = randint<std::int32_t>(Shape<2>{B, T}, 31, 0, V);
  auto dy_full = normal<double>(Shape<3>{B, T, C}, 32);
  Tensor<double, 3> y_ref;
  Tensor<double, 2> g_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::Embedding<double, NnMesh> e("wte", mesh, V, C, 3);
    auto ids = distribute_replicated<nn::tokens<NnMesh>>(mesh, ids_full);
    auto [y, saved] = e.forward(ids);
    y_ref = full_tensor(y);
    auto [none, wctx] = e.backward_input(std::move(saved), distribute_replicated<nn::tokens<NnMesh>>(mesh, dy_full));
    static_assert(std::is_same_v<decltype(none), nn::Nothing>, "ids have no gradient");
    e.backward_weight(std::move(wctx));
    g_ref = e.weight().grad_local();
    // The lookup is linear in the table: the gradient is the finite difference of J = sum(y * dy).
    nn::ParamList<double, 2> ps;
    nn::collect(e, ps);
    auto J = [&] { return objective(e.forward(ids).y, dy_full); };
    const auto err = fd_span("wte.weight", ps[0].value, std::span<const double>(ps[0].grad), J, 28);
    INFO(err);
    REQUIRE(err.empty());
  });
  for (bool sp : {false, true}) {
    for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
      auto f = on_ranks(4, [&](CommPtr world, auto report) {
        NnMesh mesh(world, shape);
        auto check = [&](auto& e) {
          nn::ParamList<double, 2> ps;
          nn::collect(e, ps);
          auto ids = distribute_replicated<nn::tokens<NnMesh>>(mesh, ids_full);
          CommLog log;
          auto [y, saved] = e.forward(ids);
          if (log.size() != 1 || log.count(sp ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce, "tp") != 1)
            report("vocabulary-parallel lookup issued:\n" + log.to_string());
          if (!compare(full_tensor(y), y_ref, {.rtol = 1e-15})) report("lookup differs from one rank");
          CommLog blog;
          auto [none, wctx] = e.backward_input(std::move(saved), distribute_replicated<typename decltype(y)::layout>(mesh, dy_full));
          // The exit's adjoint: nothing after an all-reduce, an all-gather after a reduce-scatter.
          if (blog.size() != (sp ? 1u : 0u) || (sp && blog.count(CollectiveKind::all_gather, "tp") != 1))
            report("vocabulary-parallel backward issued:\n" + blog.to_string());
          e.backward_weight(std::move(wctx));
          parallel::DataParallel<NnMesh>(mesh).all_reduce_gradients(ps);
          if (!compare(full_tensor(e.weight().grad()), g_ref, {.rtol = 1e-15})) report("table gradient differs");
        };
        if (sp) {
          nn::Embedding<double, NnMesh, parallel::VocabParallel<nn::SeqSplit>> e("wte", mesh, V, C, 3);
          check(e);
        } else {
          nn::Embedding<double, NnMesh, parallel::VocabParallel<>> e("wte", mesh, V, C, 3);
          check(e);
        }
      });
      INFO((sp ? "SP " : "") << to_string(shape) << ": " << summary(f));
      REQUIRE(f.empty());
    }
  }
}

TEST_CASE("loss parallel: vocabulary-split cross-entropy equals the whole one, three all-reduces", "[nn][parallel]") {
  constexpr Extent V = 11;  // over tp = 4: 3, 3, 3, 2
  auto logits_full = normal<double>(Shape<3>{B, T, V}, 41, 0, 2);
  auto tgt_full = randint<std::int32_t>(Shape<2>{B, T}, 42, 0, V);
  double loss_ref = 0;
  Tensor<double, 3> d_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::CrossEntropyLoss<double, NnMesh> ce;
    auto logits = distribute_replicated<nn::tokens<NnMesh>>(mesh, logits_full);
    auto tgt = distribute_replicated<nn::tokens<NnMesh>>(mesh, tgt_full);
    auto [loss, saved] = ce.forward(logits, tgt);
    loss_ref = full_tensor(loss)[0];
    d_ref = full_tensor(ce.backward(std::move(saved), 0.5));
    // d(0.5 * loss)/d(logits) by finite differences.
    auto J = [&] { return 0.5 * full_tensor(ce.forward(logits, tgt).y)[0]; };
    const auto err = fd_span("logits", logits.local().span(), d_ref.span(), J, 30);
    INFO(err);
    REQUIRE(err.empty());
  });
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      parallel::VocabParallelCrossEntropy<double, NnMesh> ce;
      auto logits = distribute_replicated<nn::tokens<NnMesh, nn::FeatureSplit>>(mesh, logits_full);
      auto tgt = distribute_replicated<nn::tokens<NnMesh>>(mesh, tgt_full);
      CommLog log;
      auto [loss, saved] = ce.forward(logits, tgt);
      if (log.size() != 3 || log.count(CollectiveKind::all_reduce, "tp") != 3)
        report("loss parallel issued:\n" + log.to_string());
      CommLog blog;
      auto d = ce.backward(std::move(saved), 0.5);
      if (blog.size() != 0) report("loss-parallel backward communicated");
      const double l = full_tensor(loss)[0];
      if (std::abs(l - loss_ref) > 1e-13 * loss_ref) report(detail::cat("loss ", l, " vs ", loss_ref));
      if (auto c = compare(full_tensor(d), d_ref, {.rtol = 1e-12, .atol = 1e-15}); !c) report("dlogits: " + c.message);
      // A target outside the vocabulary is an error naming the op.
      auto bad = tgt_full;
      bad[3] = std::int32_t(V);
      try {
        (void)ce.forward(logits, distribute_replicated<nn::tokens<NnMesh>>(mesh, bad));
        // Only the ranks holding the bad target's sequence see it (batch 0 is on dp coordinate 0).
        if (mesh.coordinate(0) == 0) report("no error for a target outside the vocabulary");
      } catch (const Error& e) {
        if (std::string(e.what()).find("VocabParallelCrossEntropy") == std::string::npos) report(e.what());
      }
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

}  // namespace test_nn_layers
