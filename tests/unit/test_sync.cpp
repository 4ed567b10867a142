// Beyond lock-step data parallelism (parallel/sync/): local SGD and DiLoCo, delayed gradients,
// federated averaging and the data splits, each against a one-rank oracle in double, on the
// threads backend. The model and the cases shared with MPI: tests/support/sync_cases.hpp; the
// GPT cases use the parity GPT of tests/parity/gpt_parity.hpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <filesystem>
#include <unistd.h>
#include <set>
#include <vector>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/sync/data_split.hpp"
#include "dtensor/parallel/sync/delayed_gradients.hpp"
#include "dtensor/parallel/sync/diloco.hpp"
#include "dtensor/parallel/sync/fed_avg.hpp"
#include "dtensor/parallel/sync/kfold_parallel.hpp"
#include "dtensor/parallel/sync/traffic.hpp"
#include "dtensor/parallel/sync/local_gradients.hpp"
#include "parity/gpt_parity.hpp"
#include "support/on_ranks.hpp"
#include "support/sync_cases.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_sync {

using namespace dtensor;
using namespace dtensor::testing::sync_cases;
using testing::on_ranks;
using testing::summary;

TEST_CASE("local SGD with H = 1 and an outer SGD step of rate 1 equals DDP (TP inside each replica)") {
  const optim::SGDOptions inner{.lr = 0.3, .momentum = 0.9};
  for (std::array<int, 2> shape : {std::array{2, 2}, std::array{4, 1}}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      Mesh m(world, shape);
      const Full want = run_ddp(m, 6, inner);
      Model model(m);
      auto ps = model.params();
      optim::SGD<double, 2> opt(ps, inner);
      parallel::sync::DiLoCo<double, Mesh> local(m, ps, parallel::sync::DiLoCoOptions::local_sgd(1));
      for (long t = 0; t < 6; ++t) {
        model.backward(m, batch(m.coordinate(0), m.size(0), t), false);
        opt.step();
        if (local.step() != 1) report("no sync at H = 1");
      }
      const Full got = full_tensor(model.w.value());
      if (!compare(got, want, {.rtol = 1e-12, .atol = 1e-12})) report("local SGD H=1 differs from DDP: " + diff(got, want));
    });
    INFO(shape[0] << " x " << shape[1] << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("DiLoCo matches its one-rank oracle: H inner steps per replica, Nesterov outer step on the mean pseudo-gradient") {
  for (bool bf16 : {false, true}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) { diloco_case(world, bf16, report); });
    INFO((bf16 ? "bf16: " : "f64: ") << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("DiLoCo with H = 50 issues H times fewer all-reduce bytes than DDP, and streams in fragments") {
  const int H = 50;
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    Mesh m(world, {2, 1});
    Logged ddp;
    run_ddp(m, 2 * H, {.lr = 0.1}, &ddp);
    Model model(m);
    auto ps = model.params();
    optim::SGD<double, 2> opt(ps, {.lr = 0.1});
    parallel::sync::DiLoCo<double, Mesh> diloco(m, ps, {.inner_steps = H});
    CommLog log;
    for (long t = 0; t < 2 * H; ++t) {
      model.backward(m, batch(m.coordinate(0), 2, t), false);
      opt.step();
      diloco.step();
    }
    const auto ar = log.count(CollectiveKind::all_reduce, "dp");
    if (ar != 2 || ddp.all_reduces != std::size_t(2 * H) || ddp.bytes != std::size_t(H) * log.bytes())
      report(detail::cat("DiLoCo ", ar, " all-reduces, ", log.bytes(), " B; DDP ", ddp.all_reduces, ", ", ddp.bytes, " B"));
    const double modelled = parallel::sync::payload_bytes_per_step(parallel::sync::SyncKind::diloco, 30, 8, {.inner_steps = H});
    if (std::abs(modelled * 2 * H - double(log.bytes())) > 1e-9 || diloco.payload_bytes_per_step() != modelled)
      report(detail::cat("modelled ", modelled, " B/step, logged ", log.bytes(), " B in ", 2 * H, " steps"));
    // Fragments need a parameter each: one parameter, two fragments is an error.
    try {
      parallel::sync::DiLoCo<double, Mesh> bad(m, ps, {.inner_steps = H, .fragments = 2});
      report("fragments > parameters accepted");
    } catch (const Error&) {
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("the dry run's figure per strategy: mean and peak all-reduce bytes per step equal the CommLog's; the time model") {
  // Each strategy runs 8 steps on dp = 2 with a CommLog read after every step; the mean of the
  // per-step bytes and their maximum must be traffic.hpp's payload_bytes and peak_payload_bytes
  // (E local elements of 8 bytes; Streaming DiLoCo on two parameters of equal size, so the two
  // fragments are exact halves).
  using parallel::sync::SyncKind;
  using VL = replicated_layout<2>;
  struct Two {
    W w;
    nn::Parameter<double, 1, Mesh, VL> v;
    explicit Two(const Mesh& m)
        : w("w", distribute_replicated<WL>(m, theta0())), v("v", distribute_replicated<VL>(m, normal<double>(Shape<1>{30}, 3))) {}
    auto parameters() { return std::tie(w, v); }
  };
  const long steps = 8;
  const std::vector<parallel::sync::SyncSetting> settings = {
      {.kind = SyncKind::ddp},
      {.kind = SyncKind::async, .staleness = 2},
      {.kind = SyncKind::local_sgd, .inner_steps = 4},
      {.kind = SyncKind::diloco, .inner_steps = 4, .bf16_reduce = true},
      {.kind = SyncKind::diloco, .inner_steps = 4, .fragments = 2, .overlap_steps = 1},
      {.kind = SyncKind::fedavg, .inner_steps = 2},
  };
  for (const auto& k : settings) {
    const bool two = k.fragments > 1;
    const std::size_t elements = two ? 60 : 30;
    const auto want = parallel::sync::sync_step_cost(k, elements, sizeof(double), {.reduce_seconds = 1});
    auto f = on_ranks(2, [&](CommPtr world, auto report) {
      Mesh m(world, {2, 1});
      Model model(m);
      Two both(m);
      nn::ParamList<double, 2> ps;
      if (two) nn::collect(both, ps);
      else nn::collect(model, ps);
      optim::SGD<double, 2> opt(ps, {.lr = 0.1});
      parallel::DataParallel<Mesh> ddp(m);
      std::optional<parallel::sync::DiLoCo<double, Mesh>> diloco;
      std::optional<parallel::sync::DelayedGradients<double, Mesh>> delayed;
      std::optional<parallel::sync::FedAvg<double, Mesh>> fed;
      if (k.kind == SyncKind::local_sgd) diloco.emplace(m, ps, parallel::sync::DiLoCoOptions::local_sgd(k.inner_steps));
      if (k.kind == SyncKind::diloco)
        diloco.emplace(m, ps, parallel::sync::DiLoCoOptions{.inner_steps = k.inner_steps, .bf16_reduce = k.bf16_reduce,
                                                            .fragments = k.fragments, .overlap_steps = k.overlap_steps});
      if (k.kind == SyncKind::async) delayed.emplace(m, ps, k.staleness);
      if (k.kind == SyncKind::fedavg) fed.emplace(m, ps, parallel::sync::FedAvgOptions{});
      if (fed) fed->begin_round();
      CommLog log;
      std::size_t total = 0, peak = 0;
      for (long t = 1; t <= steps; ++t) {
        const std::size_t before = log.bytes();
        const bool partial = k.kind == SyncKind::ddp || k.kind == SyncKind::async;
        if (two) {
          for (auto& p : ps) {
            for (std::size_t i = 0; i < p.value.size(); ++i) p.grad[i] = p.value[i] - double(m.coordinate(0) + 1);
            *p.has_grad = true;
          }
        } else {
          model.backward(m, batch(m.coordinate(0), 2, t), partial);
        }
        bool update = true;
        if (k.kind == SyncKind::ddp) ddp.all_reduce_gradients(ps);
        if (delayed) update = delayed->exchange();
        if (update) opt.step();
        if (diloco) diloco->step();
        if (fed && t % k.inner_steps == 0) fed->end_round(2.0), fed->begin_round();
        const std::size_t now = log.bytes() - before;
        total += now;
        peak = std::max(peak, now);
      }
      if (delayed) delayed->drain();
      if (diloco) diloco->finish();
      if (log.count(CollectiveKind::all_reduce) != log.records().size()) report("collectives other than all-reduce:\n" + log.to_string());
      if (double(total) / double(steps) != want.payload_bytes || double(peak) != want.peak_payload_bytes)
        report(detail::cat(parallel::sync::to_string(k.kind), ": logged ", total, " B in ", steps, " steps, peak ", peak,
                           " B; modelled ", want.payload_bytes, " B/step, peak ", want.peak_payload_bytes));
    });
    INFO(parallel::sync::to_string(k.kind) << " H " << k.inner_steps << " F " << k.fragments << ": " << summary(f));
    REQUIRE(f.empty());
  }

  // The time model (E = 100 floats): DDP's all-reduce takes 1 s, 0.25 s of it exposed; 0.5 s of
  // compute per step.
  const parallel::sync::SyncTiming t{.reduce_seconds = 1, .exposed_seconds = 0.25, .compute_seconds = 0.5};
  auto cost = [&](parallel::sync::SyncSetting k) { return parallel::sync::sync_step_cost(k, 100, 4, t); };
  CHECK(cost({.kind = SyncKind::ddp}).step_seconds == 0.75);
  CHECK(cost({.kind = SyncKind::async, .staleness = 0}).exposed_seconds == 0.25);  // s = 0 is DDP
  CHECK(cost({.kind = SyncKind::async, .staleness = 1}).exposed_seconds == 0.5);   // 1 s behind one 0.5 s step
  CHECK(cost({.kind = SyncKind::async, .staleness = 2}).exposed_seconds == 0);     // behind two: hidden
  CHECK(cost({.kind = SyncKind::local_sgd, .inner_steps = 100}).comm_seconds == 0.01);  // H = 100: 1/100 of the time
  CHECK(cost({.kind = SyncKind::local_sgd, .inner_steps = 100}).payload_bytes == 4);    // ... and of the bytes
  const auto stream = cost({.kind = SyncKind::diloco, .inner_steps = 4, .fragments = 2});
  CHECK(stream.peak_payload_bytes == 200);  // two halves of 400 B
  CHECK(stream.exposed_seconds == 0.25);    // two blocking 0.5 s syncs per 4 steps
  CHECK(cost({.kind = SyncKind::diloco, .inner_steps = 4, .fragments = 2, .overlap_steps = 1}).exposed_seconds == 0);
  CHECK(cost({.kind = SyncKind::diloco, .inner_steps = 4, .bf16_reduce = true}).comm_seconds == 0.125);  // half of 1 s / 4
  CHECK_THROWS_AS(cost({.kind = SyncKind::diloco, .inner_steps = 2, .fragments = 3}), Error);
  CHECK_THROWS_AS(cost({.kind = SyncKind::diloco, .inner_steps = 2, .overlap_steps = 2}), Error);
}

namespace {
struct GptRun {
  double val_loss = 0;
  std::size_t dp_all_reduces = 0, dp_bytes = 0;
};

/// The parity GPT (tests/parity/gpt_parity.hpp) on dp = 2, 8 sequences per step (4 per
/// replica), AdamW: DDP (H = 0) or DiLoCo with H inner steps; the validation loss is the mean
/// over 4 held-out batches after the last step.
GptRun train_gpt(int steps, int H) {
  GptRun out;
  threads::run(2, [&](CommPtr world) {
    testing::GptMesh mesh(world, {2, 1});
    const auto cfg = testing::parity_config();
    models::GPT<double, testing::GptMesh, nn::ReplicatedPlan> model(mesh, cfg);
    using Ids = decltype(model)::Ids;
    nn::ParamList<double, 2> ps;
    model.collect(ps);
    optim::AdamW<double, 2> opt(ps, testing::parity_adamw());
    parallel::DataParallel<testing::GptMesh> ddp(mesh);
    std::optional<parallel::sync::DiLoCo<double, testing::GptMesh>> diloco;
    if (H > 0) diloco.emplace(mesh, ps, parallel::sync::DiLoCoOptions{.inner_steps = H});
    CommLog log;
    for (int s = 0; s < steps; ++s) {
      auto [ids, tgt] = testing::parity_batch_of<Ids>(mesh, s, cfg, 8);
      opt.zero_grad();
      auto [loss, saved] = model.forward(ids, tgt);
      model.backward(std::move(saved));
      if (diloco) parallel::sync::keep_local_gradients(ps, mesh);
      else ddp.all_reduce_gradients(ps);
      opt.step();
      if (diloco) diloco->step();
    }
    const std::size_t ar = log.count(CollectiveKind::all_reduce, "dp"), bytes = log.bytes();
    double val = 0;
    for (int b = 0; b < 4; ++b) {
      auto [ids, tgt] = testing::parity_batch_of<Ids>(mesh, 100000 + b, cfg, 8);
      val += full_tensor(model.evaluate(ids, tgt))[0] / 4;
    }
    if (world->rank() == 0) out = {val, ar, bytes};
  });
  return out;
}
}  // namespace

TEST_CASE("DiLoCo with H = 50 on the small GPT: close to DDP's validation loss at equal tokens, with H times fewer all-reduce bytes") {
  // 100 steps = 2 DiLoCo rounds (measured at 21:20 UTC, 2026-11-25: untrained 3.39, DDP 0.043, DiLoCo 0.0073;
  // at 50 steps 0.47 and 0.43; at 200 steps 0.0021 and 1.7e-6). The stated margin: DiLoCo's
  // validation loss at most DDP's + 0.1 nats at equal tokens (the paper's claim is "close to",
  // on this easy rule DiLoCo's outer Nesterov step even helps).
  const int steps = 100, H = 50;
  const GptRun ddp = train_gpt(steps, 0), diloco = train_gpt(steps, H);
  const GptRun untrained = train_gpt(0, 0);
  INFO("validation loss: untrained " << untrained.val_loss << ", DDP " << ddp.val_loss << ", DiLoCo H = 50 " << diloco.val_loss
                                     << "; all-reduce bytes on dp: DDP " << ddp.dp_bytes << ", DiLoCo " << diloco.dp_bytes);
  REQUIRE(diloco.dp_all_reduces == std::size_t(steps / H));
  REQUIRE(ddp.dp_bytes == std::size_t(H) * diloco.dp_bytes);
  REQUIRE(ddp.val_loss < 0.5 * untrained.val_loss);  // DDP learned something ...
  REQUIRE(diloco.val_loss <= ddp.val_loss + 0.1);     // ... and DiLoCo as much, within the margin
}

TEST_CASE("local SGD with H = 1 over FSDP inside each replica (reduce_replicas = false) equals HSDP") {
  // The parity GPT on dp 2 x fsdp 2, ZeRO-3, SGD with momentum (linear in the gradient, so
  // averaging after the step equals stepping on the average): the master shards after 4 steps.
  using FMesh = DeviceMesh<"dp", "fsdp", "tp">;
  auto run = [](CommPtr world, bool local, std::vector<double>& shards, std::size_t& dp_all_reduces) {
    FMesh mesh(world, {2, 2, 1});
    const auto cfg = testing::parity_config();
    models::GPT<double, FMesh, nn::ReplicatedPlan> model(mesh, cfg);
    auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3, .reduce_replicas = !local});
    optim::SGD<double, 3> opt(fsdp.params(), {.lr = 0.05, .momentum = 0.9});
    std::optional<parallel::sync::DiLoCo<double, FMesh, "dp">> outer;
    if (local) outer.emplace(mesh, fsdp.params(), parallel::sync::DiLoCoOptions::local_sgd(1));
    CommLog log;
    for (int s = 0; s < 4; ++s) {
      auto [ids, tgt] = testing::parity_batch_of<decltype(model)::Ids>(mesh, s, cfg, 8);
      opt.zero_grad();
      auto [loss, saved] = model.forward(ids, tgt);
      model.backward(std::move(saved));
      fsdp.finish_gradient_sync();
      if (local) parallel::sync::keep_local_gradients<FMesh, "dp">(fsdp.params(), mesh);
      opt.step();
      if (outer) outer->step();
    }
    dp_all_reduces = log.count(CollectiveKind::all_reduce, "dp");
    shards.clear();
    for (const auto& p : fsdp.params()) shards.insert(shards.end(), p.value.begin(), p.value.end());
  };
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    std::vector<double> hsdp, local;
    std::size_t hsdp_ar = 0, local_ar = 0;
    run(world, false, hsdp, hsdp_ar);
    run(world, true, local, local_ar);
    if (local_ar != 4 || hsdp_ar <= 4) report(detail::cat("all-reduces on dp: HSDP ", hsdp_ar, ", local SGD ", local_ar));
    if (hsdp.size() != local.size() || hsdp.empty()) report("different shards");
    double worst = 0;
    for (std::size_t i = 0; i < std::min(hsdp.size(), local.size()); ++i)
      worst = std::max(worst, std::abs(hsdp[i] - local[i]) / std::max(1.0, std::abs(hsdp[i])));
    if (worst > 1e-12) report(detail::cat("local SGD differs from HSDP by ", worst));
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("Streaming DiLoCo: fragments sync staggered, each with its own outer step, one all-reduce each") {
  // Two parameters (w and a bias-like v), F = 2, H = 4: fragment 0 syncs at t = 2, 6, ...,
  // fragment 1 at t = 4, 8, ...; the oracle runs the same schedule on whole tensors.
  using VL = replicated_layout<2>;
  struct Two {
    W w;
    nn::Parameter<double, 1, Mesh, VL> v;
    explicit Two(const Mesh& m)
        : w("w", distribute_replicated<WL>(m, theta0())), v("v", distribute_replicated<VL>(m, normal<double>(Shape<1>{7}, 3))) {}
    auto parameters() { return std::tie(w, v); }
  };
  const int H = 4, steps = 8, R = 2;
  const double lr = 0.1;
  // Oracle: replica r's parameters decay towards r-dependent targets (gradient θ − c_r).
  auto target = [](int r, long t, Extent i) { return double(r + 1) * 0.5 + 0.01 * double(t) + 0.001 * double(i); };
  Full aw = theta0();
  Tensor<double, 1> av = normal<double>(Shape<1>{7}, 3);
  std::vector<Full> rw(R, aw);
  std::vector<Tensor<double, 1>> rv(R, av);
  OracleSGD ow{0.7, 0.9, true, {}};
  OracleSGD ov{0.7, 0.9, true, {}};
  auto step_oracle = [&](auto& reps, auto& anchor, OracleSGD& outer) {
    Full d(Shape<2>{1, anchor.numel()});
    for (int r = 0; r < R; ++r)
      for (Extent i = 0; i < anchor.numel(); ++i) d[i] += (anchor[i] - reps[std::size_t(r)][i]) / R;
    Full a(Shape<2>{1, anchor.numel()});
    for (Extent i = 0; i < anchor.numel(); ++i) a[i] = anchor[i];
    outer.step(a, d);
    for (Extent i = 0; i < anchor.numel(); ++i) anchor[i] = a[i];
    for (auto& rep : reps)
      for (Extent i = 0; i < anchor.numel(); ++i) rep[i] = anchor[i];
  };
  for (long t = 1; t <= steps; ++t) {
    for (int r = 0; r < R; ++r) {
      for (Extent i = 0; i < aw.numel(); ++i) rw[std::size_t(r)][i] -= lr * (rw[std::size_t(r)][i] - target(r, t, i));
      for (Extent i = 0; i < av.numel(); ++i) rv[std::size_t(r)][i] -= lr * (rv[std::size_t(r)][i] - target(r, t, i));
    }
    if (t % H == 2) step_oracle(rw, aw, ow);  // fragment 0 (w) at (0 + 1)·4/2 = 2
    if (t % H == 0) step_oracle(rv, av, ov);  // fragment 1 (v) at 4
  }
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    Mesh m(world, {R, 2});
    Two model(m);
    nn::ParamList<double, 2> ps;
    nn::collect(model, ps);
    const int r = m.coordinate(0);
    optim::SGD<double, 2> opt(ps, {.lr = lr});
    parallel::sync::DiLoCo<double, Mesh> diloco(m, ps, {.inner_steps = H, .fragments = 2});
    if (diloco.fragment(0) != std::pair<std::size_t, std::size_t>{0, 1}) report("fragment 0 is not {w}");
    CommLog log;
    int synced = 0;
    for (long t = 1; t <= steps; ++t) {
      // The gradient θ − c_r on the local pieces (w sharded on tp rows: global element index).
      for (auto& p : ps) {
        const bool is_w = p.name == "w";
        const Extent base = is_w ? Extent(m.coordinate(1)) * 3 * 5 : 0;
        for (std::size_t i = 0; i < p.value.size(); ++i) p.grad[i] = p.value[i] - target(r, t, base + Extent(i));
        *p.has_grad = true;
      }
      opt.step();
      synced += diloco.step();
    }
    if (synced != 4 || log.count(CollectiveKind::all_reduce, "dp") != 4) report("syncs:\n" + log.to_string());
    // w last synced at t = 6 and drifted for two steps since (each replica its own way); v synced at t = 8.
    const Full w = full_tensor(model.w.value()), &want_w = rw[std::size_t(r)];
    if (!compare(w, want_w, {.rtol = 1e-12, .atol = 1e-12})) report("w differs from the oracle: " + diff(w, want_w));
    if (!compare(full_tensor(model.v.value()), av, {.rtol = 1e-12, .atol = 1e-12})) report("v differs from the oracle");
    if (!compare(rv[std::size_t(r)], av, {.rtol = 0, .atol = 0})) report("the oracle's v replicas are not the anchor");
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("overlapped Streaming DiLoCo: tau = 0 is the blocking form exactly; tau > 0 applies the outer update tau steps late") {
  const int H = 3, steps = 9, R = 2;
  const double lr = 0.2;
  for (int tau : {0, 1, 2}) {
    // Oracle (alpha = 0): at t ≡ 0 (mod H) the mean Δ is taken; at t + tau the outer Nesterov
    // step moves θ_sync and every replica restarts from it.
    Full anchor = theta0();
    OracleSGD outer{0.7, 0.9, true, {}};
    std::vector<Full> reps(R, anchor);
    std::optional<std::pair<long, Full>> in_flight;
    for (long t = 1; t <= steps; ++t) {
      for (int r = 0; r < R; ++r) {
        const Full g = grad(reps[std::size_t(r)], batch(r, R, t - 1));
        for (Extent i = 0; i < g.numel(); ++i) reps[std::size_t(r)][i] -= lr * g[i];
      }
      if (t % H == 0) {
        Full d(wshape);
        for (int r = 0; r < R; ++r)
          for (Extent i = 0; i < d.numel(); ++i) d[i] += (anchor[i] - reps[std::size_t(r)][i]) / R;
        in_flight.emplace(t + tau, d);
      }
      if (in_flight && in_flight->first == t) {
        outer.step(anchor, in_flight->second);
        for (auto& rep : reps) rep = anchor;
        in_flight.reset();
      }
    }
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      Mesh m(world, {R, 2});
      auto run = [&](int overlap, Logged& logged) {
        Model model(m);
        auto ps = model.params();
        optim::SGD<double, 2> opt(ps, {.lr = lr});
        parallel::sync::DiLoCo<double, Mesh> diloco(m, ps, {.inner_steps = H, .overlap_steps = overlap});
        CommLog log;
        for (long t = 0; t < steps; ++t) {
          model.backward(m, batch(m.coordinate(0), R, t), false);
          opt.step();
          diloco.step();
          const long done = t + 1;  // an all-reduce issued at a multiple of H stays in flight for tau steps
          if (diloco.in_flight() != (overlap > 0 && done >= H && done % H < overlap ? 1u : 0u))
            report(detail::cat("tau ", overlap, " step ", t + 1, ": ", diloco.in_flight(), " in flight"));
        }
        logged = {log.count(CollectiveKind::all_reduce, "dp"), log.bytes()};
        return full_tensor(model.w.value());
      };
      Logged blocking, overlapped;
      const Full want = run(0, blocking), got = run(tau, overlapped);
      if (tau == 0 && !compare(got, want, {.rtol = 0, .atol = 0})) report("tau = 0 differs from the blocking form: " + diff(got, want));
      const Full& oracle = reps[std::size_t(m.coordinate(0))];  // the anchor after a completed sync
      if (!compare(got, oracle, {.rtol = 1e-12, .atol = 1e-12})) report(detail::cat("tau ", tau, " differs from the oracle: ", diff(got, oracle)));
      if (overlapped.all_reduces != blocking.all_reduces || overlapped.bytes != blocking.bytes)
        report(detail::cat("tau ", tau, ": ", overlapped.all_reduces, " all-reduces, ", overlapped.bytes, " B; blocking ",
                           blocking.all_reduces, ", ", blocking.bytes, " B"));
    });
    INFO("tau " << tau << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("delayed gradients: staleness 0 is DDP; staleness s applies step t's reduced gradient at t + s") {
  const double lr = 0.3;
  for (int s : {0, 1, 3}) {
    // Oracle: the gradient of the global batch at step t, at the parameters of step t, applied at t + s.
    const long steps = 8;
    Full theta = theta0();
    std::vector<Full> queue;
    for (long t = 0; t < steps; ++t) {
      queue.push_back(grad(theta, global_batch(2, t)));
      if (long(queue.size()) > s) {
        const Full g = queue.front();
        queue.erase(queue.begin());
        for (Extent i = 0; i < g.numel(); ++i) theta[i] -= lr * g[i];
      }
    }
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      Mesh m(world, {2, 2});
      Model model(m);
      auto ps = model.params();
      optim::SGD<double, 2> opt(ps, {.lr = lr});
      parallel::sync::DelayedGradients<double, Mesh> delayed(m, ps, s);
      CommLog log;
      long applied = 0;
      for (long t = 0; t < steps; ++t) {
        model.backward(m, batch(m.coordinate(0), 2, t), true);
        if (delayed.exchange()) {
          opt.step();
          ++applied;
        }
      }
      if (applied != steps - s || delayed.in_flight() != std::size_t(s)) report(detail::cat(applied, " updates"));
      if (delayed.drain() != std::size_t(s)) report("drain");
      if (log.count(CollectiveKind::all_reduce, "dp") != std::size_t(steps)) report("one all-reduce per step:\n" + log.to_string());
      const Full got = full_tensor(model.w.value());
      if (!compare(got, theta, {.rtol = 1e-12, .atol = 1e-12})) report("differs from the oracle: " + diff(got, theta));
      if (s == 0) {
        const Full ddp = run_ddp(m, steps, {.lr = lr});
        if (!compare(got, ddp, {.rtol = 1e-12, .atol = 1e-12})) report("staleness 0 differs from DDP: " + diff(got, ddp));
      }
    });
    INFO("staleness " << s << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("FedAvg: one local SGD step, every client, equal IID shards equals DDP with SGD") {
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    Mesh m(world, {2, 2});
    const Full want = run_ddp(m, 5, {.lr = 0.3});
    Model model(m);
    auto ps = model.params();
    parallel::sync::FedAvg<double, Mesh> fed(m, ps, {.seed = 7});
    CommLog log;
    for (long round = 0; round < 5; ++round) {
      optim::SGD<double, 2> opt(ps, {.lr = 0.3});  // a fresh client optimizer each round
      if (!fed.begin_round()) report("a client left out at full participation");
      model.backward(m, batch(m.coordinate(0), 2, round), false);
      opt.step();
      fed.end_round(2.0);
    }
    if (log.count(CollectiveKind::all_reduce, "dp") != 5) report("one all-reduce per round:\n" + log.to_string());
    const Full got = full_tensor(model.w.value());
    if (!compare(got, want, {.rtol = 1e-12, .atol = 1e-12})) report("FedAvg differs from DDP: " + diff(got, want));
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("FedAvg: sampled clients, E local epochs on non-IID shards, weighted by sample count, vs the oracle") {
  auto f = on_ranks(4, [&](CommPtr world, auto report) { fedavg_case(world, report); });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("checkpoints resume mid-round: DiLoCo, delayed gradients, FedAvg equal the uninterrupted run exactly") {
  for (int kind : {0, 1, 2}) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("dtensor-sync-resume-" + std::to_string(::getpid()) + "-" + std::to_string(kind));
    auto f = on_ranks(4, [&](CommPtr world, auto report) { resume_case(world, kind, dir, report); });
    std::filesystem::remove_all(dir);
    INFO("strategy " << kind << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("data splits: k-fold folds partition the indices exactly; stratified, IID and Dirichlet splits; deterministic") {
  for (std::size_t n : {2u, 7u, 10u, 101u})
    for (std::size_t k : {2u, 3u, 5u}) {
      if (k > n) continue;
      const auto folds = parallel::sync::kfold(n, k, 42);
      REQUIRE(folds.size() == k);
      std::vector<int> seen(n, 0);
      for (const auto& s : folds) {
        REQUIRE(s.val.size() + s.train.size() == n);
        REQUIRE((s.val.size() == n / k || s.val.size() == n / k + 1));
        std::set<std::size_t> v(s.val.begin(), s.val.end()), tr(s.train.begin(), s.train.end());
        REQUIRE(v.size() == s.val.size());
        for (auto i : s.val) {
          REQUIRE(i < n);
          REQUIRE(!tr.count(i));
          ++seen[i];
        }
      }
      for (int c : seen) REQUIRE(c == 1);  // every index validates exactly once
      REQUIRE(parallel::sync::kfold(n, k, 42)[0].val == folds[0].val);
    }
  REQUIRE(parallel::sync::kfold(100, 5, 1)[0].val != parallel::sync::kfold(100, 5, 2)[0].val);

  std::vector<int> labels;
  for (int i = 0; i < 97; ++i) labels.push_back(i % 7 == 0 ? 1 : (i % 3 == 0 ? 2 : 0));
  const auto strat = parallel::sync::stratified_kfold(labels, 4, 3);
  std::vector<int> seen(labels.size(), 0);
  for (int c = 0; c <= 2; ++c) {
    const auto total = std::count(labels.begin(), labels.end(), c);
    for (const auto& s : strat) {
      const auto in = std::count_if(s.val.begin(), s.val.end(), [&](std::size_t i) { return labels[i] == c; });
      REQUIRE(std::abs(double(in) - double(total) / 4) <= 1.0);
    }
  }
  for (const auto& s : strat)
    for (auto i : s.val) ++seen[i];
  for (int c : seen) REQUIRE(c == 1);

  const auto iid = parallel::sync::iid_shards(10, 3, 1);
  REQUIRE(iid[0].size() == 4);
  REQUIRE(iid[2].size() == 3);
  for (double alpha : {0.1, 1.0, 100.0}) {
    const auto shards = parallel::sync::dirichlet_shards(labels, 5, alpha, 9);
    std::vector<int> cover(labels.size(), 0);
    for (const auto& s : shards)
      for (auto i : s) ++cover[i];
    for (int c : cover) REQUIRE(c == 1);
    REQUIRE(parallel::sync::dirichlet_shards(labels, 5, alpha, 9) == shards);
  }
  // Small alpha skews: some client's label mix is far from the whole's.
  {
    std::vector<int> many;
    for (int i = 0; i < 1000; ++i) many.push_back(i % 4);
    auto skew = [&](double alpha) {
      double worst = 0;
      for (const auto& s : parallel::sync::dirichlet_shards(many, 4, alpha, 2)) {
        if (s.empty()) continue;
        const double share = double(std::count_if(s.begin(), s.end(), [&](std::size_t i) { return many[i] == 0; })) / double(s.size());
        worst = std::max(worst, std::abs(share - 0.25));
      }
      return worst;
    };
    REQUIRE(skew(0.1) > 0.2);
    REQUIRE(skew(1000) < 0.1);
  }
  const auto h = parallel::sync::holdout(100, 0.1, 4);
  REQUIRE(h.val.size() == 10);
  REQUIRE(h.train.size() == 90);

  const parallel::sync::SplitSpec spec{.kind = "kfold", .seed = 3, .k = 5, .fold = 2};
  REQUIRE(spec.to_string() == "kfold seed=3 k=5 fold=2");
  REQUIRE(parallel::sync::SplitSpec::parse(spec.to_string()) == spec);
  const parallel::sync::SplitSpec dir{.kind = "dirichlet", .seed = 1, .clients = 8, .alpha = 0.5};
  REQUIRE(parallel::sync::SplitSpec::parse(dir.to_string()) == dir);
  const auto [mean, sd] = parallel::sync::mean_std({1.0, 2.0, 3.0});
  REQUIRE(mean == 2.0);
  REQUIRE(sd == 1.0);
}

TEST_CASE("k-fold with the k models at once on a mesh dimension equals k sequential runs; mean and std over one all-gather") {
  const std::size_t n = 18;  // 4 folds of 5, 5, 4, 4 samples: uneven
  const int k = 4, epochs = 2;
  const double lr = 0.1;
  auto val_loss = [&](const Full& theta, const parallel::sync::Indices& val) {
    double l = 0;
    for (std::size_t s : val) {
      const Full x = sample(s);
      for (Extent i = 0; i < x.numel(); ++i) l += 0.5 * (theta[i] - x[i]) * (theta[i] - x[i]) / double(val.size());
    }
    return l;
  };
  // k sequential runs on whole tensors: one-sample SGD steps over each fold's training indices.
  const auto splits = parallel::sync::kfold(n, k, 9);
  std::vector<double> want;
  for (const auto& sp : splits) {
    Full theta = theta0();
    for (int e = 0; e < epochs; ++e)
      for (std::size_t s : sp.train) {
        const Full g = grad(theta, {s});
        for (Extent i = 0; i < g.numel(); ++i) theta[i] -= lr * g[i];
      }
    want.push_back(val_loss(theta, sp.val));
  }
  const auto [want_mean, want_sd] = parallel::sync::mean_std(want);
  auto f = on_ranks(k * 2, [&](CommPtr world, auto report) {
    Mesh m(world, {k, 2});  // folds on "dp", TP 2 inside each model
    parallel::sync::KFoldParallel<Mesh> cv(m, n, 9);
    if (cv.split().val != splits[std::size_t(cv.fold())].val) report("the fold's split is not kfold's");
    Model model(m);
    auto ps = model.params();
    optim::SGD<double, 2> opt(ps, {.lr = lr});
    for (int e = 0; e < epochs; ++e)
      for (std::size_t s : cv.split().train) {
        model.backward(m, {s}, false);  // the fold's own gradient: never reduced on "dp"
        opt.step();
      }
    CommLog log;
    const double mine = val_loss(full_tensor(model.w.value()), cv.split().val);
    const auto losses = cv.losses(mine);
    const auto [mean, sd] = parallel::sync::mean_std(losses);
    for (int fo = 0; fo < k; ++fo)
      if (std::abs(losses[std::size_t(fo)] - want[std::size_t(fo)]) > 1e-12 * want[std::size_t(fo)])
        report(detail::cat("fold ", fo, ": ", losses[std::size_t(fo)], " vs its sequential run ", want[std::size_t(fo)]));
    if (std::abs(mean - want_mean) > 1e-12 * want_mean || std::abs(sd - want_sd) > 1e-12 * want_mean)
      report(detail::cat("mean ", mean, " +- ", sd, " vs ", want_mean, " +- ", want_sd));
    if (log.count(CollectiveKind::all_gather, "dp") != 1 || log.count(CollectiveKind::all_reduce, "dp") != 0)
      report("one all-gather on dp:\n" + log.to_string());
  });
  INFO(summary(f));
  REQUIRE(f.empty());
  // k < 2 (a fold dimension of size 1) or k > samples: kfold's errors, named.
  auto bad = on_ranks(2, [&](CommPtr world, auto report) {
    for (auto [shape, samples] : {std::pair{std::array{1, 2}, std::size_t(10)}, std::pair{std::array{2, 1}, std::size_t(1)}}) {
      Mesh m(world, shape);
      try {
        parallel::sync::KFoldParallel<Mesh> cv(m, samples, 1);
        report("accepted");
      } catch (const Error& e) {
        if (std::string(e.what()).find("KFoldParallel") == std::string::npos) report(e.what());
      }
    }
  });
  REQUIRE(bad.empty());
}

TEST_CASE("bad input: H = 0, staleness < 0, more clients than ranks, k < 2 or k > samples, a replica-sharded parameter") {
  // The error's message, or "" when there was none.
  auto error_of = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    auto expect = [&](auto fn, const std::string& word) {
      const std::string e = error_of(fn);
      if (e.find(word) == std::string::npos) report("expected an error naming \"" + word + "\", got \"" + e + "\"");
    };
    Mesh m(world, {2, 1});
    Model model(m);
    auto ps = model.params();
    expect([&] { parallel::sync::DiLoCo<double, Mesh>(m, ps, {.inner_steps = 0}); }, "inner_steps H = 0");
    expect([&] { parallel::sync::DelayedGradients<double, Mesh>(m, ps, -1); }, "staleness s = -1");
    expect([&] { parallel::sync::FedAvg<double, Mesh>(m, ps, {.clients_per_round = 3}); }, "has 2 clients");
    // A weight sharded on "dp" has no twin on the other replica.
    using SL = nn::layout_on<Mesh, Shard<0>, nn::On<"tp", Replicate>>;
    nn::Parameter<double, 2, Mesh, SL> sharded("s", distribute_replicated<SL>(m, theta0()));
    struct One {
      nn::Parameter<double, 2, Mesh, SL>& p;
      auto parameters() { return std::tie(p); }
    } one{sharded};
    nn::ParamList<double, 2> sp;
    nn::collect(one, sp);
    expect([&] { parallel::sync::DiLoCo<double, Mesh>(m, sp, {}); }, "not Replicate on the replica dimension");
    // exchange() on a gradient that is not Partial on "dp".
    parallel::sync::DelayedGradients<double, Mesh> delayed(m, ps, 1);
    model.backward(m, {0}, false);
    expect([&] { delayed.exchange(); }, "not Partial on the data dimension");
  });
  INFO(summary(f));
  REQUIRE(f.empty());
  auto expect = [&](auto fn, const std::string& word) {
    const std::string e = error_of(fn);
    INFO(e);
    REQUIRE(e.find(word) != std::string::npos);
  };
  expect([] { parallel::sync::kfold(10, 1, 0); }, "k = 1 folds for 10 samples");
  expect([] { parallel::sync::kfold(10, 11, 0); }, "k = 11 folds for 10 samples");
  expect([] { parallel::sync::stratified_kfold({0, 1}, 3, 0); }, "k = 3");
  expect([] { parallel::sync::iid_shards(3, 4, 0); }, "4 clients for 3 samples");
  expect([] { parallel::sync::dirichlet_shards({0, 1}, 2, 0.0, 0); }, "alpha = 0");
  expect([] { parallel::sync::parse_sync("lockstep"); }, "unknown synchronization");
  expect([] { parallel::sync::SplitSpec::parse("kfold k=x"); }, "bad value");
}

}  // namespace test_sync
