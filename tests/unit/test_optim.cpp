// Optimizers, gradient clipping and the data-parallel gradient sync, each against its one-rank
// twin: the same parameters and gradients held whole on one rank.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>
#include <tuple>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/optim/param_set.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_optim {

using namespace dtensor;
using Mesh = DeviceMesh<"dp", "tp">;
using testing::on_ranks;
using testing::summary;

namespace {

// Weight [6, 5] sharded on "tp" rows (uneven over 4), bias [6] replicated.
using WL = nn::layout_on<Mesh, Replicate, nn::On<"tp", Shard<0>>>;
using BL = replicated_layout<2>;
using W = nn::Parameter<double, 2, Mesh, WL>;
using B = nn::Parameter<double, 1, Mesh, BL>;

const Shape<2> wshape{6, 5};
const Shape<1> bshape{6};

Tensor<double, 2> w0() { return normal<double>(wshape, 1); }
Tensor<double, 1> b0() { return normal<double>(bshape, 2); }
// Gradient of step s, the same logical values whatever the mesh.
Tensor<double, 2> gw(int s) { return normal<double>(wshape, 100 + std::uint64_t(s)); }
Tensor<double, 1> gb(int s) { return normal<double>(bshape, 200 + std::uint64_t(s)); }

struct Model {
  W w;
  B b;
  /// flat: w and b moved into one flat group (adjacent gradients), else a group each.
  explicit Model(const Mesh& m, bool flat = false)
      : w("w", distribute_replicated<WL>(m, w0())), b("b", distribute_replicated<BL>(m, b0()), /*decay=*/false) {
    if (flat) nn::flatten<double, 2>("model", *this);
  }
  auto parameters() { return std::tie(w, b); }
  nn::ParamList<double, 2> params() {
    nn::ParamList<double, 2> ps;
    nn::collect(*this, ps);
    return ps;
  }
  // Replicated gradients (as after a sync).
  void set_grads(const Mesh& m, int s) {
    w.zero_grad();
    b.zero_grad();
    w.accumulate_grad(distribute_replicated<WL>(m, gw(s)));
    b.accumulate_grad(distribute_replicated<BL>(m, gb(s)));
  }
};

/// Five steps; inspect(opt) sees the optimizer after them.
template <class Opt, class Opts, class Inspect = void (*)(const Opt&)>
std::pair<Tensor<double, 2>, Tensor<double, 1>> train(CommPtr world, std::array<int, 2> shape, Opts o,
                                                      Inspect inspect = [](const Opt&) {}) {
  Mesh m(world, shape);
  Model model(m);
  Opt opt(model.params(), o);
  for (int s = 0; s < 5; ++s) {
    model.set_grads(m, s);
    opt.step();
  }
  inspect(opt);
  return {full_tensor(model.w.value()), full_tensor(model.b.value())};
}

}  // namespace

TEST_CASE("SGD with momentum and nesterov follows PyTorch's update, elementwise") {
  // The scalar twin of torch.optim.SGD, run on one element.
  for (bool nesterov : {false, true}) {
    optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0, .weight_decay = 0.01, .nesterov = nesterov};
    threads::run(1, [&](CommPtr world) {
      auto [w, b] = train<optim::SGD<double, 2>>(world, {1, 1}, o);
      const auto init = w0();
      for (Extent i = 0; i < w.numel(); i += 7) {
        double p = init[i], buf = 0;
        for (int s = 0; s < 5; ++s) {
          double g = gw(s)[i] + o.weight_decay * p;
          buf = s == 0 ? g : o.momentum * buf + g;
          g = nesterov ? g + o.momentum * buf : buf;
          p -= o.lr * g;
        }
        REQUIRE(w[i] == Approx(p).epsilon(1e-14));
      }
      // The bias does not decay.
      double p = b0()[0], buf = 0;
      for (int s = 0; s < 5; ++s) {
        double g = gb(s)[0];
        buf = s == 0 ? g : o.momentum * buf + g;
        p -= o.lr * (nesterov ? g + o.momentum * buf : buf);
      }
      REQUIRE(b[0] == Approx(p).epsilon(1e-14));
    });
  }
}

TEST_CASE("AdamW: decoupled decay and bias correction, elementwise") {
  optim::AdamWOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  threads::run(1, [&](CommPtr world) {
    std::vector<double> exp_avg, exp_avg_sq;  // the weight's moments (flat state, parameter 0)
    auto [w, b] = train<optim::AdamW<double, 2>>(world, {1, 1}, o, [&](const optim::AdamW<double, 2>& opt) {
      REQUIRE(opt.steps() == 5);
      exp_avg.assign(opt.exp_avg(0).begin(), opt.exp_avg(0).end());
      exp_avg_sq.assign(opt.exp_avg_sq(0).begin(), opt.exp_avg_sq(0).end());
    });
    const auto init = w0();
    REQUIRE(exp_avg.size() == std::size_t(w.numel()));
    for (Extent i = 0; i < w.numel(); i += 5) {
      double p = init[i], m = 0, v = 0;
      for (int t = 1; t <= 5; ++t) {
        const double g = gw(t - 1)[i];
        p *= 1 - o.lr * o.weight_decay;
        m = o.beta1 * m + (1 - o.beta1) * g;
        v = o.beta2 * v + (1 - o.beta2) * g * g;
        p -= o.lr * (m / (1 - std::pow(o.beta1, t))) / (std::sqrt(v / (1 - std::pow(o.beta2, t))) + o.eps);
      }
      REQUIRE(w[i] == Approx(p).epsilon(1e-13));
      REQUIRE(exp_avg[std::size_t(i)] == Approx(m).epsilon(1e-14));
      REQUIRE(exp_avg_sq[std::size_t(i)] == Approx(v).epsilon(1e-14));
    }
  });
}

TEST_CASE("optimizers on sharded parameters equal the one-rank run, without communication") {
  Tensor<double, 2> w1;
  Tensor<double, 1> b1;
  optim::AdamWOptions o{.lr = 0.05};
  threads::run(1, [&](CommPtr world) { std::tie(w1, b1) = train<optim::AdamW<double, 2>>(world, {1, 1}, o); });
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
      Mesh m(world, shape);
      Model model(m);
      optim::AdamW<double, 2> opt(model.params(), o);
      for (int s = 0; s < 5; ++s) {
        model.set_grads(m, s);
        CommLog log;
        opt.step();
        if (log.size() != 0) report("the optimizer step communicated:\n" + log.to_string());
      }
      if (!equal(full_tensor(model.w.value()), w1)) report("weight differs from the one-rank run");
      if (!equal(full_tensor(model.b.value()), b1)) report("bias differs from the one-rank run");
    });
    INFO(summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("an optimizer step on a Partial gradient throws, naming the parameter") {
  // Catch2 is not thread-safe: ranks report, the test thread asserts.
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    Mesh m(world, {2, 1});
    Model model(m);
    optim::SGD<double, 2> opt(model.params(), {.lr = 0.1});
    model.w.zero_grad();
    model.w.accumulate_grad(distribute_replicated<Layout<Partial<ReduceOp::avg>, Shard<0>>>(m, gw(0)));
    try {
      opt.step();
      report("no exception from the step");
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.find("parameter w") == std::string::npos || msg.find("P(avg)") == std::string::npos)
        report("message lacks the parameter or the placement: " + msg);
    }
    try {
      (void)model.w.grad();
      report("no exception from grad()");
    } catch (const Error&) {
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("optimizer options are checked") {
  threads::run(1, [&](CommPtr world) {
    Mesh m(world, {1, 1});
    Model model(m);
    REQUIRE_THROWS_AS((optim::SGD<double, 2>(model.params(), {.lr = -1})), Error);
    REQUIRE_THROWS_AS((optim::SGD<double, 2>(model.params(), {.lr = 0.1, .nesterov = true})), Error);
    REQUIRE_THROWS_AS((optim::AdamW<double, 2>(model.params(), {.beta1 = 1.0})), Error);
  });
}

TEST_CASE("nn::flatten and nn::collect of a parameter of another element type throw, naming it; nothing moves") {
  threads::run(1, [&](CommPtr world) {
    Mesh m(world, {1, 1});
    struct Mixed {
      W w;
      nn::Parameter<float, 1, Mesh, BL> f;
      auto parameters() { return std::tie(w, f); }
    } mixed{W("w", distribute_replicated<WL>(m, w0())),
            nn::Parameter<float, 1, Mesh, BL>("f", distribute_replicated<BL>(m, ones<float>(bshape)))};
    const auto* w_group = mixed.w.group().get();
    REQUIRE_THROWS_WITH((nn::flatten<double, 2>("mixed", mixed)),
                        Catch::Contains("nn::flatten") && Catch::Contains("parameter f is not of the group's"));
    CHECK(mixed.w.group().get() == w_group);  // the check comes before any parameter is moved
    CHECK(equal(mixed.w.value().to_local(), w0()));
    nn::ParamList<double, 2> list;
    REQUIRE_THROWS_WITH(nn::collect(mixed, list),
                        Catch::Contains("nn::collect") && Catch::Contains("parameter f is not of the list's"));
  });
}

TEST_CASE("clip_grad_norm: the norm of the logical gradients, one all-reduce, every layout") {
  // One-rank twin.
  double want = 0;
  const auto gw3 = gw(3);
  const auto gb3 = gb(3);
  for (double v : gw3.span()) want += v * v;
  for (double v : gb3.span()) want += v * v;
  want = std::sqrt(want);
  for (std::array<int, 2> shape : {std::array{1, 1}, std::array{1, 4}, std::array{2, 2}, std::array{4, 1}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
      Mesh m(world, shape);
      Model model(m);
      auto ps = model.params();
      model.set_grads(m, 3);
      CommLog log;
      const double norm = optim::clip_grad_norm(ps, m, want / 2);
      if (std::abs(norm - want) > 1e-12 * want) report(detail::cat("mesh ", to_string(shape), " norm ", norm, ", expected ", want));
      if (log.count(CollectiveKind::all_reduce) != 1 || log.size() != 1)
        report("expected exactly one all-reduce:\n" + log.to_string());
      // Clipped to half: every gradient scaled by 1/2 (up to the 1e-6 guard).
      auto g = full_tensor(model.w.grad());
      auto ref = gw(3);
      for (Extent i = 0; i < ref.numel(); ++i) ref[i] *= 0.5;
      if (auto c = compare(g, ref, {.rtol = 1e-6}); !c) report("clipped gradient is not half the original: " + c.message);
      const double after = optim::grad_norm(ps, m);
      if (std::abs(after - want / 2) > 1e-6 * want) report(detail::cat("norm after clipping ", after));
    });
    INFO(summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("clip_grad_norm refuses a Partial gradient") {
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    Mesh m(world, {2, 1});
    Model model(m);
    auto ps = model.params();
    model.set_grads(m, 0);
    model.b.zero_grad();
    model.b.accumulate_grad(distribute_replicated<Layout<Partial<ReduceOp::avg>, Replicate>>(m, gb(0)));
    try {
      optim::clip_grad_norm(ps, m, 1.0);
      report("no exception");
    } catch (const Error& e) {
      if (std::string(e.what()).find("gradient of b") == std::string::npos) report(e.what());
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("DataParallel: bucketed all-reduce on dp averages the gradients in place, one collective per bucket") {
  // flat: w and b adjacent in one group, so a large bucket takes both; separate groups never
  // share a bucket (a bucket is one span, reduced in place: nothing is copied either way).
  for (bool flat : {false, true})
    for (std::size_t bucket_bytes : {std::size_t(1), std::size_t(8 * 8), std::size_t(1) << 20}) {
      auto f = on_ranks(4, [&](CommPtr world, auto report) {
        Mesh m(world, {2, 2});
        const int dp = m.coordinate(0);
        Model model(m, flat);
        auto ps = model.params();
        if (flat && ps[1].grad.data() != ps[0].grad.data() + ps[0].grad.size()) report("flat gradients not adjacent");
        model.w.zero_grad();
        model.b.zero_grad();
        // Each dp rank's gradient is the step-dp gradient: the average is (gw(0) + gw(1)) / 2.
        using PW = nn::layout_on<Mesh, Partial<ReduceOp::avg>, nn::On<"tp", Shard<0>>>;
        using PB = Layout<Partial<ReduceOp::avg>, Replicate>;
        model.w.accumulate_grad(from_local<PW>(m, distribute_replicated<WL>(m, gw(dp)).to_local(), wshape));
        model.b.accumulate_grad(from_local<PB>(m, gb(dp), bshape));
        parallel::DataParallel<Mesh> ddp(m, {.bucket_bytes = bucket_bytes});
        // b (48 bytes) is visited first; w's local piece is 3 x 5 doubles (120 bytes).
        const std::size_t expect = flat && bucket_bytes == (std::size_t(1) << 20) ? 1 : 2;
        if (ddp.num_buckets(ps) != expect) report(detail::cat(ddp.num_buckets(ps), " buckets, expected ", expect));
        CommLog log;
        const auto nb = ddp.all_reduce_gradients(ps);
        if (nb != expect || log.count(CollectiveKind::all_reduce, "dp") != nb || log.size() != nb)
          report(detail::cat(nb, " buckets but the log has:\n", log.to_string()));
        if (ddp.copied_bytes() != 0) report(detail::cat("DDP copied ", ddp.copied_bytes(), " bytes"));
        auto want_w = gw(0), g1 = gw(1);
        for (Extent i = 0; i < want_w.numel(); ++i) want_w[i] = (want_w[i] + g1[i]) / 2;
        auto want_b = gb(0), h1 = gb(1);
        for (Extent i = 0; i < want_b.numel(); ++i) want_b[i] = (want_b[i] + h1[i]) / 2;
        if (!compare(full_tensor(model.w.grad()), want_w, {.rtol = 1e-15})) report("weight gradient not averaged");
        if (!compare(full_tensor(model.b.grad()), want_b, {.rtol = 1e-15})) report("bias gradient not averaged");
        // A second sync finds nothing pending: an error, not a silent double reduction.
        try {
          ddp.all_reduce_gradients(ps);
          report("second sync did not throw");
        } catch (const Error&) {
        }
      });
      INFO((flat ? "flat, " : "") << bucket_bytes << " bytes: " << summary(f));
      REQUIRE(f.empty());
    }
}

TEST_CASE("one optimizer and one clip over parameters on two meshes (nn::ParamSet)") {
  // The same model twice: on the (dp, tp) mesh, and on a 3-D mesh of the same ranks (as an MoE's
  // experts live on (edp, ep, tp)). One clip over both must give the norm of all gradients; one
  // AdamW over both must update each as its own AdamW would.
  using Mesh3 = DeviceMesh<"edp", "ep", "tp">;
  using W3L = nn::layout_on<Mesh3, Replicate, nn::On<"ep", Shard<0>>>;
  double want = 0;
  for (double v : gw(3).span()) want += 2 * v * v;
  for (double v : gb(3).span()) want += v * v;
  want = std::sqrt(want);
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    Mesh m(world, {2, 2});
    Mesh3 m3(world, {1, 2, 2});
    Model model(m), twin(m);
    struct Expert {
      nn::Parameter<double, 2, Mesh3, W3L> w;
      auto parameters() { return std::tie(w); }
    } expert{{"w3", distribute_replicated<W3L>(m3, w0())}};
    auto& w3 = expert.w;
    nn::ParamList<double, 3> ps3;
    nn::collect(expert, ps3);
    auto all = nn::param_set(nn::on(m, model.params()), nn::on(m3, ps3));
    auto opt = optim::make_adamw(all, {.lr = 0.01});
    optim::AdamW<double, 2> single(twin.params(), {.lr = 0.01});
    for (int s = 0; s < 3; ++s) {
      model.set_grads(m, s);
      twin.set_grads(m, s);
      w3.zero_grad();
      w3.accumulate_grad(distribute_replicated<W3L>(m3, gw(s)));
      opt.step();
      single.step();
    }
    if (auto c = compare(full_tensor(model.w.value()), full_tensor(twin.w.value()), {.rtol = 0}); !c)
      report("the set's AdamW differs from one AdamW over the list: " + c.message);
    if (auto c = compare(full_tensor(w3.value()), full_tensor(twin.w.value()), {.rtol = 0}); !c)
      report("the set's AdamW on the second mesh differs: " + c.message);
    model.set_grads(m, 3);
    w3.zero_grad();
    w3.accumulate_grad(distribute_replicated<W3L>(m3, gw(3)));
    CommLog log;
    const double norm = optim::clip_grad_norm(all, want / 2);
    if (std::abs(norm - want) > 1e-12 * want) report(detail::cat("norm ", norm, ", expected ", want));
    if (log.count(CollectiveKind::all_reduce) != 2 || log.size() != 2) report("expected one all-reduce per mesh:\n" + log.to_string());
    const double after = std::hypot(optim::grad_norm(all.list<0>(), m), optim::grad_norm(all.list<1>(), m3));
    if (std::abs(after - want / 2) > 1e-6 * want) report(detail::cat("norm after clipping ", after));
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

}  // namespace test_optim
