// tests/support/sync_cases.hpp — the parallel/sync/ checks that run on any communicator: the
// threads backend (tests/unit/test_sync.cpp) and MPI (tests/mpi/test_dtensor_mpi.cpp), the same
// code, each against its one-rank oracle in double.
//
// The model: one weight [6, 5] sharded on "tp" rows, replicated on "dp" (the replica / client
// dimension); the loss of sample s is ½‖θ − x_s‖², so a batch's gradient is θ − mean(x_s): it
// depends on the parameters (staleness and drift matter) and the oracle is a few lines on whole
// tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/checkpoint/sync_state.hpp"
#include "dtensor/comm/comm_log.hpp"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/sync/data_split.hpp"
#include "dtensor/parallel/sync/delayed_gradients.hpp"
#include "dtensor/parallel/sync/diloco.hpp"
#include "dtensor/parallel/sync/fed_avg.hpp"

namespace dtensor::testing::sync_cases {

using Mesh = DeviceMesh<"dp", "tp">;

using WL = nn::layout_on<Mesh, Replicate, nn::On<"tp", Shard<0>>>;
using PW = nn::layout_on<Mesh, Partial<ReduceOp::avg>, nn::On<"tp", Shard<0>>>;
using W = nn::Parameter<double, 2, Mesh, WL>;
using Full = Tensor<double, 2>;

inline const Shape<2> wshape{6, 5};
inline Full theta0() { return normal<double>(wshape, 1); }
inline Full sample(std::size_t s) { return normal<double>(wshape, 1000 + s, 0.5, 1); }

struct Model {
  W w;
  explicit Model(const Mesh& m) : w("w", distribute_replicated<WL>(m, theta0())) {}
  auto parameters() { return std::tie(w); }
  nn::ParamList<double, 2> params() {
    nn::ParamList<double, 2> ps;
    nn::collect(*this, ps);
    return ps;
  }
  /// This rank's gradient of its samples' mean loss: Partial<avg> on "dp" (a share of the
  /// global batch, for DDP) or marked Replicate (the replica's own gradient, never reduced).
  void backward(const Mesh& m, const std::vector<std::size_t>& samples, bool partial) {
    Full g = w.value().to_local();  // a copy of the local piece
    const double inv = 1.0 / double(samples.size());
    Full local = g;
    for (Extent i = 0; i < g.numel(); ++i) g[i] = 0;
    for (std::size_t s : samples) {
      const auto x = distribute_replicated<WL>(m, sample(s)).to_local();
      for (Extent i = 0; i < g.numel(); ++i) g[i] += (local[i] - x[i]) * inv;
    }
    w.zero_grad();
    if (partial) w.accumulate_grad(from_local<PW>(m, g, wshape));
    else w.accumulate_grad(from_local<WL>(m, g, wshape));
  }
};

/// The oracle's gradient on whole tensors.
inline Full grad(const Full& theta, const std::vector<std::size_t>& samples) {
  Full g(wshape);
  for (std::size_t s : samples) {
    const Full x = sample(s);
    for (Extent i = 0; i < g.numel(); ++i) g[i] += (theta[i] - x[i]) / double(samples.size());
  }
  return g;
}

/// Samples of replica r (of n) at step t, `per` each: disjoint across replicas and steps.
inline std::vector<std::size_t> batch(int r, int n, long t, int per = 2) {
  std::vector<std::size_t> out;
  for (int j = 0; j < per; ++j) out.push_back(std::size_t((t * n + r) * per + j));
  return out;
}
inline std::vector<std::size_t> global_batch(int n, long t, int per = 2) {
  std::vector<std::size_t> out;
  for (int r = 0; r < n; ++r)
    for (auto s : batch(r, n, t, per)) out.push_back(s);
  return out;
}

/// One-rank SGD with momentum / Nesterov on a whole tensor (PyTorch's rule; b = g at first).
struct OracleSGD {
  double lr, mu;
  bool nesterov;
  Full buf;
  bool first = true;
  void step(Full& p, const Full& g) {
    if (mu > 0) {
      if (first) buf = g;
      else
        for (Extent i = 0; i < g.numel(); ++i) buf[i] = mu * buf[i] + g[i];
      first = false;
    }
    for (Extent i = 0; i < g.numel(); ++i) {
      const double d = mu > 0 ? (nesterov ? g[i] + mu * buf[i] : buf[i]) : g[i];
      p[i] -= lr * d;
    }
  }
};

/// What a run's CommLog saw: all-reduces on "dp" and all bytes.
struct Logged {
  std::size_t all_reduces = 0, bytes = 0;
};

/// DDP with SGD for `steps` steps on this rank's mesh: the reference of the exactness cases.
inline Full run_ddp(const Mesh& m, long steps, optim::SGDOptions o, Logged* logged = nullptr) {
  Model model(m);
  auto ps = model.params();
  optim::SGD<double, 2> opt(ps, o);
  parallel::DataParallel<Mesh> ddp(m);
  const int dp = m.coordinate(0), n = m.size(0);
  CommLog log;
  for (long t = 0; t < steps; ++t) {
    model.backward(m, batch(dp, n, t), true);
    ddp.all_reduce_gradients(ps);
    opt.step();
  }
  if (logged) *logged = {log.count(CollectiveKind::all_reduce, "dp"), log.bytes()};
  return full_tensor(model.w.value());
}

inline std::string diff(const Full& a, const Full& b) {
  double worst = 0;
  for (Extent i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return detail::cat("max |difference| ", worst);
}


/// DiLoCo (H = 3, Nesterov outer step) on a (n / 2, 2) mesh for 3 rounds against R = n / 2
/// replicas on whole tensors: one all-reduce on "dp" per round, the parameters the oracle's.
template <class Report>
void diloco_case(CommPtr world, bool bf16, Report&& report) {
  const int H = 3, rounds = 3, R = world->size() / 2;
  const parallel::sync::DiLoCoOptions o{.inner_steps = H, .outer_lr = 0.7, .outer_momentum = 0.9, .nesterov = true,
                                        .bf16_reduce = bf16};
  const double lr = 0.2;
  Full anchor = theta0();
  OracleSGD outer{o.outer_lr, o.outer_momentum, true, {}};
  std::vector<Full> reps(std::size_t(R), anchor);
  for (long t = 1; t <= H * rounds; ++t) {
    for (int r = 0; r < R; ++r) {
      const Full g = grad(reps[std::size_t(r)], batch(r, R, t - 1));
      for (Extent i = 0; i < g.numel(); ++i) reps[std::size_t(r)][i] -= lr * g[i];
    }
    if (t % H == 0) {
      Full delta(wshape);
      for (int r = 0; r < R; ++r)
        for (Extent i = 0; i < delta.numel(); ++i) delta[i] += (anchor[i] - reps[std::size_t(r)][i]) / R;
      outer.step(anchor, delta);
      for (auto& rep : reps) rep = anchor;
    }
  }
  Mesh m(world, {R, 2});
  Model model(m);
  auto ps = model.params();
  optim::SGD<double, 2> opt(ps, {.lr = lr});
  parallel::sync::DiLoCo<double, Mesh> diloco(m, ps, o);
  CommLog log;
  for (long t = 0; t < H * rounds; ++t) {
    model.backward(m, batch(m.coordinate(0), R, t), false);
    opt.step();
    diloco.step();
  }
  // One all-reduce on "dp" per round, of this rank's 3 x 5 elements (in double, or bf16).
  const std::size_t bytes = 3 * 5 * (bf16 ? 2 : 8);
  if (log.count(CollectiveKind::all_reduce, "dp") != std::size_t(rounds) || log.bytes() != rounds * bytes)
    report("collectives:\n" + log.to_string());
  const Full got = full_tensor(model.w.value());
  const double tol = bf16 ? 2e-2 : 1e-12;  // bf16: Δ rounded to 8 bits of mantissa, |Δ| ~ 1
  if (!compare(got, anchor, {.rtol = tol, .atol = tol})) report("DiLoCo differs from the oracle: " + diff(got, anchor));
  if (diloco.rounds() != rounds || diloco.inner_step() != H * rounds) report("counters");
}

/// FedAvg over n clients (a (n, 1) mesh), n / 2 sampled per round, 2 local epochs of one-sample
/// SGD steps on Dirichlet (alpha 0.5) shards of 40 labelled samples, weights by sample count,
/// 3 rounds, against the oracle on whole tensors.
template <class Report>
void fedavg_case(CommPtr world, Report&& report) {
  const int clients = world->size(), per_round = clients / 2, epochs = 2, rounds = 3;
  std::vector<int> labels;
  for (int i = 0; i < 40; ++i) labels.push_back(i % 5);
  const auto shards = parallel::sync::dirichlet_shards(labels, std::size_t(clients), 0.5, 11);
  const double lr = 0.05;
  // FedAvg's documented sampling: the first per_round of a permutation drawn from (seed, round).
  auto oracle_sampled = [&](long r) {
    const auto p = parallel::sync::permutation(std::size_t(clients), 5 * 0x9E3779B97F4A7C15ull + std::uint64_t(r));
    std::vector<int> out(p.begin(), p.begin() + per_round);
    std::sort(out.begin(), out.end());
    return out;
  };
  Full global = theta0();
  for (long r = 0; r < rounds; ++r) {
    Full sum(wshape);
    double wsum = 0;
    for (int c : oracle_sampled(r)) {
      Full local = global;
      for (int e = 0; e < epochs; ++e)
        for (std::size_t s : shards[std::size_t(c)]) {
          const Full g = grad(local, {s});
          for (Extent i = 0; i < g.numel(); ++i) local[i] -= lr * g[i];
        }
      const double w = double(shards[std::size_t(c)].size());
      for (Extent i = 0; i < sum.numel(); ++i) sum[i] += w * local[i];
      wsum += w;
    }
    if (wsum > 0)
      for (Extent i = 0; i < sum.numel(); ++i) global[i] = sum[i] / wsum;
  }
  Mesh m(world, {clients, 1});
  Model model(m);
  auto ps = model.params();
  parallel::sync::FedAvg<double, Mesh> fed(m, ps, {.clients_per_round = per_round, .seed = 5});
  const auto& mine = shards[std::size_t(fed.client())];
  CommLog log;
  for (long r = 0; r < rounds; ++r) {
    if (fed.sampled(r) != oracle_sampled(r)) report("sampling differs");
    if (fed.begin_round()) {
      optim::SGD<double, 2> opt(ps, {.lr = lr});
      for (int e = 0; e < epochs; ++e)
        for (std::size_t s : mine) {
          model.backward(m, {s}, false);
          opt.step();
        }
    }
    fed.end_round(double(mine.size()));
  }
  if (log.count(CollectiveKind::all_reduce, "dp") != std::size_t(rounds) || log.size() != std::size_t(rounds))
    report("one all-reduce per round:\n" + log.to_string());
  const Full got = full_tensor(model.w.value());
  if (!compare(got, global, {.rtol = 1e-12, .atol = 1e-12})) report("FedAvg differs from the oracle: " + diff(got, global));
}

/// Checkpoints resume mid-round: `kind` 0 DiLoCo (H = 3, Nesterov outer step), 1 delayed
/// gradients (s = 2), 2 FedAvg (1 of 2 clients per round, 3 local steps), each with an inner SGD
/// with momentum, on a (n / 2, 2) mesh. A run stopped after step 4 (one step into the second
/// round; two reduced gradients pending), saved at `dir`, and resumed from scratch equals the
/// uninterrupted run exactly, on every rank (each replica its own parameters).
template <class Report>
void resume_case(CommPtr world, int kind, const std::filesystem::path& dir, Report&& report) {
  const int H = 3, s = 2, R = world->size() / 2;
  const long stop = 4, steps = 9;
  Mesh m(world, {R, 2});
  const int dp = m.coordinate(0);
  // Steps [from, to): fresh objects, loaded from `dir` when from > 0, saved there when `save`.
  auto run = [&](long from, long to, bool save) {
    Model model(m);
    auto ps = model.params();
    optim::SGD<double, 2> inner(ps, {.lr = 0.2, .momentum = 0.9});
    std::optional<parallel::sync::DiLoCo<double, Mesh>> diloco;
    std::optional<parallel::sync::DelayedGradients<double, Mesh>> delayed;
    std::optional<parallel::sync::FedAvg<double, Mesh>> fed;
    if (kind == 0) diloco.emplace(m, ps, parallel::sync::DiLoCoOptions{.inner_steps = H});
    if (kind == 1) delayed.emplace(m, ps, s);
    if (kind == 2) fed.emplace(m, ps, parallel::sync::FedAvgOptions{.clients_per_round = 1, .seed = 3});
    // What is saved and loaded: this replica's parameters and inner momentum, its inner step
    // count, and the strategy's state (counters set from the step).
    double inner_steps = 0;
    auto slots_of = [&](const std::vector<std::span<double>>& pending) {
      checkpoint::Slots<double> slots;
      checkpoint::append(slots, checkpoint::list_slots(ps, m));
      checkpoint::append(slots, checkpoint::sgd_slots(ps, inner, m));
      slots.push_back(checkpoint::count_slot("sgd.steps", inner_steps, inner.steps(), m));
      if (diloco) checkpoint::append(slots, checkpoint::diloco_slots(*diloco, m));
      if (delayed) checkpoint::append(slots, checkpoint::delayed_slots(*delayed, pending, m));
      return slots;
    };
    if (from > 0) {
      if (diloco) diloco->set_inner_step(from);
      if (fed) fed->set_round(from / H);
      std::vector<std::span<double>> pending;
      if (delayed) pending = delayed->restore(from);
      auto slots = slots_of(pending);
      const auto meta = checkpoint::load_same_mesh(dir, m, slots);
      if (meta.step != from) report(detail::cat("resumed at step ", meta.step, ", saved at ", from));
      inner.set_steps(long(inner_steps));
    }
    bool participating = !fed || fed->begin_round();
    for (long t = from; t < to; ++t) {
      model.backward(m, batch(dp, R, t), delayed.has_value());
      const bool update = delayed ? delayed->exchange() : participating;
      if (update) inner.step();
      if (diloco) diloco->step();
      if (fed && (t + 1) % H == 0) {
        fed->end_round(2.0);
        participating = fed->begin_round();
      }
    }
    if (save) {
      std::vector<std::span<double>> pending;
      if (delayed) pending = delayed->settle();
      const auto slots = slots_of(pending);
      checkpoint::save(dir, m, slots, {.step = to});
    }
    return full_tensor(model.w.value());
  };
  const Full straight = run(0, steps, false);
  run(0, stop, true);
  const Full resumed = run(stop, steps, false);
  if (!compare(resumed, straight, {.rtol = 0, .atol = 0}))
    report(detail::cat("strategy ", kind, ": the resumed run differs from the straight one: ", diff(resumed, straight)));
  // The per-rank state is read back by the rank that wrote it: another mesh shape is refused.
  if (R > 1) {
    Mesh other(world, {1, world->size()});
    Model model(other);
    auto ps = model.params();
    auto slots = checkpoint::list_slots(ps, other);
    try {
      checkpoint::load_same_mesh(dir, other, slots);
      report("a per-rank checkpoint loaded on another mesh shape");
    } catch (const Error& e) {
      if (std::string(e.what()).find("same mesh") == std::string::npos) report(std::string("unclear error: ") + e.what());
    }
  }
}

}  // namespace dtensor::testing::sync_cases
