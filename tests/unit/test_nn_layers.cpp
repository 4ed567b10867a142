// nn::Linear (every style), LayerNorm / RMSNorm, Embedding, MLP and the losses: backward
// against finite differences (one rank, double), and each distributed layout against the
// one-rank run, with the collectives each style documents.
#include <catch2/catch.hpp>

#include "dtensor/nn/embedding.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/mlp.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/parallel/vocab_parallel.hpp"
#include "test_nn_support.hpp"

using namespace dtensor;
using namespace dtensor::testing;
using parallel::ColwiseParallel;
using parallel::RowwiseParallel;

namespace {

constexpr Extent N = 16, IN = 8, OUT = 6;  // 6 features over tp = 4: chunks 2, 2, 2, 0
const auto x_full = normal<double>(Shape<2>{N, IN}, 11);
const auto r_out = normal<double>(Shape<2>{N, OUT}, 12);
const auto r_in = normal<double>(Shape<2>{N, IN}, 13);


template <class Style>
ModuleRun linear_run(const NnMesh& mesh) {
  nn::Linear<double, NnMesh, Style> lin("fc", mesh, IN, OUT, 5);
  auto x = distribute_replicated<typename decltype(lin)::InL>(mesh, x_full);
  return run_module(lin, mesh, x, r_out, fwd(lin), bwd(lin));
}

ModuleRun linear_reference() {
  ModuleRun ref;
  threads::run(1, [&](CommPtr w) { ref = linear_run<nn::Replicated<>>(NnMesh(w, {1, 1})); });
  return ref;
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
    auto y = lin.forward(x);
    if (fl.count(CollectiveKind::all_gather, "tp") != fwd_ag || fl.count(CollectiveKind::reduce_scatter, "tp") != fwd_rs ||
        fl.count(CollectiveKind::all_reduce, "tp") != fwd_ar || fl.size() != fwd_ag + fwd_rs + fwd_ar)
      report(std::string(Style::name) + " forward issued:\n" + fl.to_string());
    auto dy = distribute_replicated<typename decltype(y)::layout>(mesh, r_out);
    CommLog bl;
    lin.backward_input(dy);
    lin.backward_weight();
    if (bl.count(CollectiveKind::all_gather, "tp") != bwd_ag || bl.count(CollectiveKind::reduce_scatter, "tp") != bwd_rs ||
        bl.count(CollectiveKind::all_reduce, "tp") != bwd_ar || bl.size() != bwd_ag + bwd_rs + bwd_ar)
      report(std::string(Style::name) + " backward issued:\n" + bl.to_string());
  });
  INFO(Style::name << " on " << to_string(shape) << ": " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

TEST_CASE("nn::Linear backward matches finite differences", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::Linear<double, NnMesh> lin("fc", mesh, IN, OUT, 5);
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    const auto e = fd_check(lin, x, r_out, fwd(lin), bwd(lin));
    INFO(e);
    REQUIRE(e.empty());
  });
}

TEST_CASE("nn::Linear in every tensor-parallel style equals the one-rank Linear", "[nn][parallel]") {
  // (forward AG, RS, AR; backward AG, RS, AR) on "tp", as parallel/tensor_parallel.hpp documents.
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    check_linear_style<ColwiseParallel<>>(shape, 0, 0, 0, 0, 0, 1);
    check_linear_style<ColwiseParallel<Shard<0>>>(shape, 1, 0, 0, 0, 1, 0);
    check_linear_style<RowwiseParallel<>>(shape, 0, 0, 1, 0, 0, 0);
    check_linear_style<RowwiseParallel<Shard<0>>>(shape, 0, 1, 0, 1, 0, 0);
    check_linear_style<nn::Replicated<>>(shape, 0, 0, 0, 0, 0, 0);
  }
}

TEST_CASE("nn::Linear checks its input", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::Linear<double, NnMesh> lin("fc", mesh, IN, OUT, 5);
    auto bad = distribute_replicated<nn::tokens<NnMesh>>(mesh, normal<double>(Shape<2>{N, IN + 1}, 1));
    try {
      lin.forward(bad);
      FAIL("no exception");
    } catch (const Error& e) {
      REQUIRE(std::string(e.what()).find("nn::Linear") != std::string::npos);
      REQUIRE(std::string(e.what()).find("[16, 9]") != std::string::npos);
    }
    REQUIRE_THROWS_AS((nn::Linear<double, NnMesh>("fc", mesh, 0, OUT, 5)), Error);
  });
}

TEST_CASE("LayerNorm and RMSNorm: finite differences, and sequence-parallel equals one rank", "[nn]") {
  ModuleRun ln_ref, rms_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    nn::LayerNorm<double, NnMesh> ln("ln", mesh, IN);
    nn::RMSNorm<double, NnMesh> rms("rms", mesh, IN);
    // Non-trivial weights so that their gradients enter dx.
    for (auto* p : {&ln.weight(), &ln.bias(), &rms.weight()})
      p->value().local() = normal<double>(Shape<1>{IN}, 21 + std::uint64_t(p == &ln.bias()));
    auto e = fd_check(ln, x, r_in, fwd(ln), bwd(ln));
    INFO(e);
    REQUIRE(e.empty());
    e = fd_check(rms, x, r_in, fwd(rms), bwd(rms));
    INFO(e);
    REQUIRE(e.empty());
    ln_ref = run_module(ln, mesh, x, r_in, fwd(ln), bwd(ln));
    rms_ref = run_module(rms, mesh, x, r_in, fwd(rms), bwd(rms));
  });
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {2, 2});
    auto x = distribute_replicated<nn::tokens<NnMesh, Shard<0>>>(mesh, x_full);
    nn::LayerNorm<double, NnMesh, Shard<0>> ln("ln", mesh, IN);
    nn::RMSNorm<double, NnMesh, Shard<0>> rms("rms", mesh, IN);
    for (auto* p : {&ln.weight(), &ln.bias(), &rms.weight()})
      p->value() = distribute_replicated<nn::params<NnMesh>>(mesh, normal<double>(Shape<1>{IN}, 21 + std::uint64_t(p == &ln.bias())));
    CommLog log;
    ln.forward(x);
    ln.release();
    if (log.size() != 0) report("a norm communicated:\n" + log.to_string());
    report(compare_runs(run_module(ln, mesh, x, r_in, fwd(ln), bwd(ln)), ln_ref));
    report(compare_runs(run_module(rms, mesh, x, r_in, fwd(rms), bwd(rms)), rms_ref));
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("MLP: finite differences, and Megatron (with and without SP) equals one rank", "[nn][parallel]") {
  ModuleRun ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    nn::MLP<double, NnMesh> mlp("mlp", mesh, IN, 4 * IN, 9, 0.3, 0.3);
    const auto e = fd_check(mlp, x, r_in, fwd(mlp), bwd(mlp));
    INFO(e);
    REQUIRE(e.empty());
    ref = run_module(mlp, mesh, x, r_in, fwd(mlp), bwd(mlp));
  });
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {2, 2});
    nn::MLP<double, NnMesh, ColwiseParallel<>, RowwiseParallel<>> tp("mlp", mesh, IN, 4 * IN, 9, 0.3, 0.3);
    report(compare_runs(run_module(tp, mesh, distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full), r_in, fwd(tp), bwd(tp)), ref));
    nn::MLP<double, NnMesh, ColwiseParallel<Shard<0>>, RowwiseParallel<Shard<0>>> sp("mlp", mesh, IN, 4 * IN, 9, 0.3, 0.3);
    report(compare_runs(
        run_module(sp, mesh, distribute_replicated<nn::tokens<NnMesh, Shard<0>>>(mesh, x_full), r_in, fwd(sp), bwd(sp)), ref));
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("Embedding: gradient is the scatter of dy; vocabulary-parallel equals one rank", "[nn][parallel]") {
  constexpr Extent V = 7, C = 4;  // 7 rows over tp = 4: 2, 2, 2, 1
  auto ids_full = randint<std::int32_t>(Shape<1>{N}, 31, 0, V);
  auto dy_full = normal<double>(Shape<2>{N, C}, 32);
  Tensor<double, 2> y_ref, g_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::Embedding<double, NnMesh> e("wte", mesh, V, C, 3);
    auto ids = distribute_replicated<nn::tokens<NnMesh>>(mesh, ids_full);
    y_ref = full_tensor(e.forward(ids));
    e.backward(distribute_replicated<nn::tokens<NnMesh>>(mesh, dy_full));
    g_ref = e.weight().grad_local();
    // The lookup is linear in the table: the gradient is the finite difference of J = sum(y * dy).
    nn::ParamList<double, 2> ps;
    e.collect(ps);
    auto J = [&] { auto s = objective(e.forward(ids), dy_full); e.release(); return s; };
    const auto err = fd_span("wte.weight", ps[0].value, std::span<const double>(ps[0].grad), J, 28);
    INFO(err);
    REQUIRE(err.empty());
  });
  for (bool sp : {false, true}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      NnMesh mesh(world, {1, 4});
      auto check = [&](auto& e, auto dy) {
        nn::ParamList<double, 2> ps;
        e.collect(ps);
        auto ids = distribute_replicated<nn::tokens<NnMesh>>(mesh, ids_full);
        CommLog log;
        auto y = e.forward(ids);
        if (log.size() != 1 || log.count(sp ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce, "tp") != 1)
          report("vocabulary-parallel lookup issued:\n" + log.to_string());
        if (!compare(full_tensor(y), y_ref, {.rtol = 1e-15})) report("lookup differs from one rank");
        e.backward(decltype(y)(mesh, y.shape(), dy));
        parallel::DataParallel<NnMesh>(mesh).all_reduce_gradients(ps);
        if (!compare(full_tensor(e.weight().grad()), g_ref, {.rtol = 1e-15})) report("table gradient differs");
      };
      if (sp) {
        nn::Embedding<double, NnMesh, parallel::VocabParallel<Shard<0>>> e("wte", mesh, V, C, 3);
        check(e, distribute_replicated<nn::tokens<NnMesh, Shard<0>>>(mesh, dy_full).to_local());
      } else {
        nn::Embedding<double, NnMesh, parallel::VocabParallel<>> e("wte", mesh, V, C, 3);
        check(e, distribute_replicated<nn::tokens<NnMesh>>(mesh, dy_full).to_local());
      }
    });
    INFO((sp ? "SP: " : "") << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("loss parallel: vocabulary-split cross-entropy equals the whole one, three all-reduces", "[nn][parallel]") {
  constexpr Extent V = 11;  // over tp = 4: 3, 3, 3, 2
  auto logits_full = normal<double>(Shape<2>{N, V}, 41, 0, 2);
  auto tgt_full = randint<std::int32_t>(Shape<1>{N}, 42, 0, V);
  double loss_ref = 0;
  Tensor<double, 2> d_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::CrossEntropyLoss<double, NnMesh> ce;
    auto logits = distribute_replicated<nn::tokens<NnMesh>>(mesh, logits_full);
    auto tgt = distribute_replicated<nn::tokens<NnMesh>>(mesh, tgt_full);
    loss_ref = full_tensor(ce.forward(logits, tgt))[0];
    d_ref = full_tensor(ce.backward(0.5));
    // d(0.5 * loss)/d(logits) by finite differences.
    auto J = [&] { auto l = 0.5 * full_tensor(ce.forward(logits, tgt))[0]; ce.release(); return l; };
    const auto err = fd_span("logits", logits.local().span(), d_ref.span(), J, 30);
    INFO(err);
    REQUIRE(err.empty());
  });
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      parallel::VocabParallelCrossEntropy<double, NnMesh> ce;
      auto logits = distribute_replicated<nn::tokens<NnMesh, Shard<1>>>(mesh, logits_full);
      auto tgt = distribute_replicated<nn::tokens<NnMesh>>(mesh, tgt_full);
      CommLog log;
      auto loss = ce.forward(logits, tgt);
      if (log.size() != 3 || log.count(CollectiveKind::all_reduce, "tp") != 3)
        report("loss parallel issued:\n" + log.to_string());
      CommLog blog;
      auto d = ce.backward(0.5);
      if (blog.size() != 0) report("loss-parallel backward communicated");
      const double l = full_tensor(loss)[0];
      if (std::abs(l - loss_ref) > 1e-13 * loss_ref) report(detail::cat("loss ", l, " vs ", loss_ref));
      if (auto c = compare(full_tensor(d), d_ref, {.rtol = 1e-12, .atol = 1e-15}); !c) report("dlogits: " + c.message);
      // A target outside the vocabulary is an error naming the op.
      auto bad = tgt_full;
      bad[3] = std::int32_t(V);
      try {
        ce.forward(logits, distribute_replicated<nn::tokens<NnMesh>>(mesh, bad));
        if (mesh.coordinate(0) == 0) report("no error for a target outside the vocabulary");
      } catch (const Error& e) {
        if (std::string(e.what()).find("VocabParallelCrossEntropy") == std::string::npos) report(e.what());
      }
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}
