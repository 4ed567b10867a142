// train::Trainer (train/trainer.hpp) on a model the library has never seen, defined only in this
// file — a token tagger: an embedding without positions, pre-norm transformer blocks, a norm and
// a per-token linear head, the plan's cross-entropy — written as a user writes one (its parts,
// nn::LayeredModel). Under DDP, ZeRO-3 over fsdp 3, TP + SP, PP (5 layers over 2 stages, and over 4 under ZB-V), CP
// (ring) and all of them at once, the Trainer's per-step losses equal a one-rank loop's (the same
// parts run by nn::Stack, AdamW and clipping written out) within 1e-9 relative, in double, with
// sizes that do not divide: vocabulary 23 over tp 2, batch 6 over dp/fsdp, 5 layers over 2 and 4 stages.
// The same spec's dry run (models::trainer_step: the Trainer's own step() on meta tensors over
// the sim communicator) equals the real trainer.step() on host tensors over rank threads, per
// rank, phase and tag, and its collectives exactly, under ZeRO-3 x TP, PP x ZeRO-2 and PP x CP
// under ZB-V. Then what a training program gets from the library beside the
// Trainer: the Trainer's flags (train/trainer_flags.hpp: their checks worded by the flags, the
// options they make, the ranks' agreement generated from the flag table) and the character corpus
// (models/text_corpus.hpp: its encoding, folds and batches).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dtensor/comm/sim.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/models/moe_flags.hpp"
#include "dtensor/models/text_corpus.hpp"
#include "dtensor/models/training_plan.hpp"  // models::trainer_step, models::phase_observer
#include "dtensor/nn/block.hpp"
#include "dtensor/nn/embedding.hpp"
#include "dtensor/nn/stack.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/sim/report.hpp"
#include "dtensor/train/loop.hpp"
#include "dtensor/train/trainer.hpp"
#include "dtensor/train/trainer_flags.hpp"
#include "support/on_ranks.hpp"

#include <unistd.h>  // getpid

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_trainer {

using namespace dtensor;

namespace {

// ---------------------------------------------------------------- the user's model

struct TaggerConfig {
  Extent vocab = 23, seq = 8, dim = 16, heads = 4, layers = 5;
  parallel::ContextKind context = parallel::ContextKind::ring;
};

/// The prologue: the token embedding alone (no positions; one unit, "embed").
template <class E>
class TaggerEmbed {
 public:
  using Emb = E;
  using In = typename Emb::Ids;
  using Out = typename Emb::Out;
  using Saved = typename Emb::Saved;
  using WeightCtx = std::tuple<typename Emb::WeightCtx>;

  template <class... Args>
    requires std::constructible_from<Emb, Args...>
  explicit TaggerEmbed(Args&&... args) : emb_(std::forward<Args>(args)...) {}
  nn::Fwd<Out, Saved> forward(const In& ids) const { return emb_.forward(ids); }
  nn::Bwd<nn::Nothing, WeightCtx> backward_input(Saved s, const Out& dy) const {
    return {nn::Nothing{}, WeightCtx{emb_.backward_input(std::move(s), dy).weight}};
  }
  void backward_weight(WeightCtx w) { nn::backward_weight_children(*this, std::move(w)); }
  auto children() { return std::tie(emb_); }
  std::string name() const { return "embed"; }

 private:
  Emb emb_;
};

/// The epilogue: a norm, then the head over the vocabulary (one unit, "head").
template <class Norm, class Lin>
class TaggerHead {
 public:
  using In = typename Norm::X;
  using Out = typename Lin::Out;
  struct Saved {
    typename Norm::Saved norm;
    typename Lin::Saved lin;
  };
  using WeightCtx = std::tuple<typename Norm::WeightCtx, typename Lin::WeightCtx>;

  TaggerHead(Norm norm, Lin lin) : norm_(std::move(norm)), lin_(std::move(lin)) {}
  nn::Fwd<Out, Saved> forward(const In& x) const {
    auto [h, ns] = norm_.forward(x);
    auto [y, ls] = lin_.forward(h);
    return {std::move(y), Saved{std::move(ns), std::move(ls)}};
  }
  nn::Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    auto [dh, lw] = lin_.backward_input(std::move(s.lin), dy);
    auto [dx, nw] = norm_.backward_input(std::move(s.norm), dh);
    return {std::move(dx), WeightCtx{std::move(nw), std::move(lw)}};
  }
  void backward_weight(WeightCtx w) { nn::backward_weight_children(*this, std::move(w)); }
  auto children() { return std::tie(norm_, lin_); }
  std::string name() const { return "head"; }

 private:
  Norm norm_;
  Lin lin_;
};

/// The tagger's parts on any mesh and plan.
template <class T, class Mesh, class Plan>
class TaggerParts {
 public:
  using Embed = TaggerEmbed<nn::Embedding<T, Mesh, typename Plan::wte, std::int32_t>>;
  using Block = nn::TransformerBlock<T, Mesh, Plan, nn::MLP<T, Mesh, typename Plan::fc1, typename Plan::fc2>,
                                     nn::LayerNorm<T, Mesh, typename Plan::between>, parallel::PlanAttention<T, Mesh, Plan>>;
  using Lin = nn::Linear<T, Mesh, typename Plan::head>;
  using Head = TaggerHead<nn::LayerNorm<T, Mesh, typename Plan::between>, Lin>;
  using Target = typename Embed::In;

  TaggerParts(const Mesh& mesh, const TaggerConfig& c) : mesh_(mesh), c_(c) {}
  const Mesh& mesh() const noexcept { return mesh_; }
  Extent block_count() const noexcept { return c_.layers; }
  Embed make_prologue() const { return Embed("tok", mesh_, c_.vocab, c_.dim, 11); }
  Block make_block(Extent l) const {
    const nn::BlockConfig b{.dim = c_.dim, .heads = c_.heads, .seq = c_.seq, .mlp_ratio = 2,
                            .out_std = 0.02, .context = {.kind = c_.context, .load_balanced = false}, .causal = true};
    return Block("h." + std::to_string(l), mesh_, b, 100 + 10 * std::uint64_t(l));
  }
  Head make_epilogue() const {
    return Head(nn::LayerNorm<T, Mesh, typename Plan::between>("norm", mesh_, c_.dim), Lin("out", mesh_, c_.dim, c_.vocab, 12));
  }
  auto make_loss() const { return typename Plan::template loss<T, Mesh, typename Lin::OutL>{}; }
  Shape<3> activation_shape(const typename Embed::In& ids) const { return {ids.extent(0), ids.extent(1), c_.dim}; }

 private:
  Mesh mesh_;
  TaggerConfig c_;
};

// ---------------------------------------------------------------- data and the oracle

constexpr Extent batch = 6;
constexpr int steps = 4;
const optim::AdamWOptions adamw{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

/// Step s's ids and targets (each target a function of its token: learnable), the same on every rank.
std::pair<Tensor<std::int32_t, 2>, Tensor<std::int32_t, 2>> batch_of(int s, const TaggerConfig& c) {
  auto ids = randint<std::int32_t>(Shape<2>{batch, c.seq}, 1000 + std::uint64_t(s), 0, std::int32_t(c.vocab));
  Tensor<std::int32_t, 2> targets(ids.shape());
  for (Extent i = 0; i < ids.numel(); ++i) targets.data()[i] = std::int32_t((ids.data()[i] * 7 + 3) % c.vocab);
  return {std::move(ids), std::move(targets)};
}

/// One rank, no parallelism: the parts run by nn::Stack, the gradients' sum resolved, clipped to
/// norm 1, AdamW — the loop a user would write without the library's Trainer.
std::vector<double> one_rank_losses(const TaggerConfig& c) {
  std::vector<double> losses;
  threads::run(1, [&](CommPtr world) {
    using Mesh = DeviceMesh<"dp">;
    using Parts = TaggerParts<double, Mesh, nn::ReplicatedPlan>;
    Mesh mesh(world, {1});
    nn::Stack<Parts> model(Parts(mesh, c), {true, 0, c.layers, true});
    nn::ParamList<double, 1, host_space> ps;
    nn::collect_on<Mesh>(model, ps);
    optim::AdamW<double, 1, host_space> opt(ps, adamw);
    parallel::DataParallel<Mesh> ddp(mesh);
    for (int s = 0; s < steps; ++s) {
      const auto [x, y] = batch_of(s, c);
      const auto ids = distribute_replicated<typename Parts::Target::layout>(mesh, x);
      const auto targets = distribute_replicated<typename Parts::Target::layout>(mesh, y);
      opt.zero_grad();
      auto [out, saved] = model.forward(std::nullopt, ids, targets);
      losses.push_back(full_tensor(*out.loss)[0]);
      model.backward(std::move(saved), std::nullopt, 1.0);
      ddp.all_reduce_gradients(ps);  // one rank: resolves the batch's pending sum
      optim::clip_grad_norm(ps, mesh, 1.0);
      opt.step();
    }
  });
  return losses;
}

using SP = parallel::MegatronPlan<true>;
template <class Space>
using Tagger = TaggerParts<double, train::StageMeshIn<Space>, SP>;

struct Case {
  train::Degrees degrees;
  int zero = 0;
  std::string schedule = "1f1b";
  int microbatches = 1;
};

std::string describe(const Case& k) {
  const auto& d = k.degrees;
  return "pp " + std::to_string(d.pp) + " dp " + std::to_string(d.dp) + " fsdp " + std::to_string(d.fsdp) + " cp " +
         std::to_string(d.cp) + " tp " + std::to_string(d.tp) + " ZeRO-" + std::to_string(k.zero) + " " + k.schedule + " x" +
         std::to_string(k.microbatches);
}

train::TrainerOptions options_of(const Case& k) {
  train::TrainerOptions o;
  o.degrees = k.degrees;
  o.zero = k.zero;
  o.schedule = k.schedule;
  o.microbatches = k.microbatches;
  o.adamw = adamw;
  o.clip_norm = 1.0;
  return o;
}

}  // namespace

TEST_CASE("train::Trainer: a model defined only in the test equals the one-rank loop under every parallelism",
          "[train][parity]") {
  const TaggerConfig cfg;
  const auto ref = one_rank_losses(cfg);
  REQUIRE(ref.size() == std::size_t(steps));
  CHECK(ref.back() < ref.front());  // it learns
  const std::vector<Case> cases{
      {.degrees = {.dp = 2}, .zero = 1},                      // DDP
      {.degrees = {.fsdp = 3}, .zero = 3},                    // ZeRO-3, units that 3 does not divide
      {.degrees = {.tp = 2}},                                 // TP + SP, vocabulary 23 over 2
      {.degrees = {.pp = 2}, .microbatches = 2},              // PP: 5 layers over 2 stages
      {.degrees = {.cp = 2}},                                 // CP: ring attention, 4 positions per rank
      {.degrees = {.pp = 2, .dp = 1, .fsdp = 2, .cp = 2, .tp = 2}, .zero = 3, .schedule = "zbv", .microbatches = 2},
  };
  for (const Case& k : cases) {
    INFO(describe(k));
    auto failures = testing::on_ranks(k.degrees.ranks(), [&](CommPtr world, auto report) {
      using Space = host_space;
      train::Trainer<Tagger<Space>> trainer(world, options_of(k), [&](const train::StageMeshIn<Space>& m) {
        return Tagger<Space>(m, cfg);
      });
      for (int s = 0; s < steps; ++s) {
        const auto [x, y] = batch_of(s, cfg);
        const auto r = trainer.step(trainer.microbatches(x, y));
        const double want = ref[std::size_t(s)];
        if (!r.updated || !(std::abs(r.loss - want) <= 1e-9 * std::abs(want)))
          report("step " + std::to_string(s) + ": loss " + std::to_string(r.loss) + " vs one rank's " + std::to_string(want));
      }
    });
    for (const auto& f : failures) UNSCOPED_INFO(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("train::Trainer: the dry run of a user's model is its real step, per rank, phase and tag", "[train][sim]") {
  // The dry run (models::trainer_step: the Trainer's step() on meta tensors over the sim
  // communicator, one micro-batch of the schedule) against the real trainer.step() on host
  // tensors over rank threads, the same options, the phases marked by the same observer: equal
  // parameters, gradients and optimizer state, activations within 1%, and the collectives exactly
  // (but for the construction's agreement, which has no peers in a dry run).
  const TaggerConfig cfg;
  for (const Case& k : {Case{.degrees = {.fsdp = 2, .tp = 2}, .zero = 3},
                        Case{.degrees = {.pp = 2, .fsdp = 2}, .zero = 2, .microbatches = 2},
                        Case{.degrees = {.pp = 2, .cp = 2}, .schedule = "zbv", .microbatches = 2}}) {
    INFO(describe(k));
    const int n = k.degrees.ranks();
    train::TrainerOptions options = options_of(k);
    options.one_microbatch = true;
    const Extent micro = batch / k.microbatches;
    auto make = [&]<class Space>(CommPtr world, Space) {
      return std::make_unique<train::Trainer<Tagger<Space>>>(
          std::move(world), options, [&](const train::StageMeshIn<Space>& m) { return Tagger<Space>(m, cfg); });
    };
    std::vector<sim::RankReport> real(static_cast<std::size_t>(n)), dry(static_cast<std::size_t>(n));
    std::vector<std::string> problems(static_cast<std::size_t>(n));
    threads::run(n, [&](CommPtr world) {
      const int rank = world->rank();
      sim::Recorder rec("host");
      rec.phase("parameters");
      auto trainer = make(std::move(world), host_space{});
      const auto [x, y] = batch_of(0, cfg);
      // The trainer's own step on the first micro-batch of real data.
      const auto r = trainer->step(trainer->microbatches(x, y),
                                   models::phase_observer(rec, models::detail::split_backward(trainer->schedule())));
      rec.phase(models::after_step);
      if (!r.updated || !std::isfinite(r.loss) || r.loss <= 0)
        problems[std::size_t(rank)] = "loss " + std::to_string(r.loss);
      real[std::size_t(rank)] = rec.finish("host");
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(problems[std::size_t(r)].empty());
      sim::Recorder rec("meta");
      rec.phase("parameters");
      auto trainer = make(sim::world(r, n), meta_space{});
      using Ids = typename Tagger<meta_space>::Target;
      const auto ids = distribute_replicated<typename Ids::layout>(
          trainer->stage_mesh(), Tensor<std::int32_t, 2, meta_space>(Shape<2>{micro, cfg.seq}));
      models::trainer_step(*trainer, ids, ids, rec);
      dry[std::size_t(r)] = rec.finish("meta");
    }
    for (int r = 0; r < n; ++r) {
      const auto& a = dry[std::size_t(r)];
      const auto& b = real[std::size_t(r)];
      // A sent activation is freed when its send finishes: at once in the dry run, when the peer
      // takes it in the real one (whenever the threads get there). Those bytes may differ.
      std::int64_t sent = 0;
      for (const auto& ph : b.phases)
        for (const auto& c : ph.collectives) sent += c.kind == CollectiveKind::send ? std::int64_t(c.bytes) : 0;
      std::vector<std::string> names;
      for (const auto& ph : a.phases) names.push_back(ph.name);
      const std::vector<std::string> want =
          k.schedule == "zbv"
              ? std::vector<std::string>{"parameters",      "forward",   "backward_input",
                                         "backward_weight", "optimizer", "after step"}
              : std::vector<std::string>{"parameters", "forward", "backward", "optimizer", "after step"};
      CHECK(names == want);
      REQUIRE(a.phases.size() == b.phases.size());
      for (std::size_t ph = 0; ph < a.phases.size(); ++ph) {
        const auto& x = a.phases[ph];
        const auto& y = b.phases[ph];
        INFO("rank " << r << ", phase " << x.name);
        CHECK(x.name == y.name);
        for (MemoryTag t : {MemoryTag::parameters, MemoryTag::gradients, MemoryTag::optimizer_state}) {
          INFO(name_of(t));
          CHECK(x.peak[std::size_t(t)] == y.peak[std::size_t(t)]);
        }
        const auto act = std::size_t(MemoryTag::activations);
        CHECK(x.peak[act] <= y.peak[act]);
        CHECK(double(x.peak[act]) ==
              Approx(double(y.peak[act])).epsilon(0.01).margin(double(std::max<std::int64_t>(256, sent))));
        // Building: the real backends agree on the schedule and settings first (an all-gather
        // a dry run has no peers for).
        if (x.name == sim::RankReport::construction_phase) continue;
        REQUIRE(x.collectives.size() == y.collectives.size());
        for (std::size_t c = 0; c < x.collectives.size(); ++c) {
          CHECK(x.collectives[c].kind == y.collectives[c].kind);
          CHECK(x.collectives[c].group == y.collectives[c].group);
          CHECK(x.collectives[c].bytes == y.collectives[c].bytes);
        }
      }
      // The step's work is the trainer's: its forward phase computes, its optimizer phase holds
      // the gradient syncs or the clip's all-reduce (every mesh here has one).
      CHECK(a.phase("forward").flops() > 0);
      CHECK(!a.phase("optimizer").collectives.empty());
    }
  }
}

TEST_CASE("train::Trainer: degrees that do not multiply to the ranks are a clear error", "[train][errors]") {
  auto failures = testing::on_ranks(4, [&](CommPtr world, auto report) {
    train::TrainerOptions o;
    o.degrees = {.pp = 1, .dp = 1, .fsdp = 3, .cp = 1, .tp = 1};
    try {
      train::Trainer<Tagger<host_space>> trainer(world, o, [&](const train::StageMeshIn<host_space>& m) {
        return Tagger<host_space>(m, TaggerConfig{});
      });
      report("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("train::Trainer") == std::string::npos || what.find("= 3 ranks") == std::string::npos ||
          what.find("has 4") == std::string::npos)
        report("unclear: " + what);
    }
  });
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

TEST_CASE("train::Trainer: ranks given different options fail together, naming the option", "[train][errors]") {
  // Without the agreement one rank would build ZeRO-3 units and the other ZeRO-1's: different
  // collectives from the first step on.
  auto failures = testing::on_ranks(2, [&](CommPtr world, auto report) {
    train::TrainerOptions o;
    o.degrees = {.fsdp = 2};
    o.zero = world->rank() == 0 ? 1 : 3;
    try {
      train::Trainer<Tagger<host_space>> trainer(world, o, [&](const train::StageMeshIn<host_space>& m) {
        return Tagger<host_space>(m, TaggerConfig{});
      });
      report("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("train::Trainer") == std::string::npos || what.find("zero") == std::string::npos)
        report("unclear: " + what);
    }
  });
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

// ---------------------------------------------------------------- deferred initialisation (issue 40, item 3)

namespace {
/// This rank's shard values (the optimizer's view: ZeRO-3's master shards, ZeRO-1/2's slice of the
/// full values), in order, as plain doubles.
template <class Tr>
std::vector<double> shard_values(Tr& trainer) {
  std::vector<double> v;
  for (const auto& p : trainer.params().template list<0>()) v.insert(v.end(), p.value.begin(), p.value.end());
  return v;
}
/// The largest unit of this rank's stages (its full flat buffer of values, bytes).
template <class Tr>
std::int64_t largest_unit_bytes(Tr& trainer) {
  std::int64_t most = 0;
  for (auto& stage : trainer.stages())
    for (auto& u : stage.units()) most = std::max(most, std::int64_t(u.group->size() * sizeof(double)));
  return most;
}
}  // namespace

TEST_CASE("train::Trainer: deferred initialisation draws each rank's shards bit for bit as the eager build, and "
          "builds within the sharded states plus one unit",
          "[train][deferred]") {
  // Construction peak per rank (the ledger over the Trainer's constructor, host space):
  //   deferred: <= what the rank holds once built (the sharded states: ZeRO-3's master and
  //             gradient shards and AdamW's moments; ZeRO-1/2's stage values too, which they keep)
  //             + one unit's full flat buffer (the largest; the shard drawn for it is smaller)
  //   eager:    the rank's stages whole (values and gradients) before FSDP shards them — over it.
  const TaggerConfig cfg;
  for (const Case& k : {Case{.degrees = {.fsdp = 3}, .zero = 3},                // units 3 does not divide
                        Case{.degrees = {.fsdp = 2, .tp = 2}, .zero = 3},       // TP pieces (Shard 0 and 1), then FSDP
                        Case{.degrees = {.pp = 2, .fsdp = 3}, .zero = 2},       // ZeRO-2 keeps the stage values: drawn whole
                        Case{.degrees = {.fsdp = 2, .cp = 2}, .zero = 3}}) {    // sharded over fsdp x cp (4)
    INFO(describe(k));
    auto failures = testing::on_ranks(k.degrees.ranks(), [&](CommPtr world, auto report) {
      using Space = host_space;
      auto make = [&](const train::StageMeshIn<Space>& m) { return Tagger<Space>(m, cfg); };
      auto eager_o = options_of(k);
      eager_o.deferred_init = false;
      std::vector<double> eager_values, deferred_values;
      std::int64_t eager_peak = 0, eager_held = 0, deferred_peak = 0, deferred_held = 0, unit = 0;
      {
        MemoryLedger ledger;
        train::Trainer<Tagger<Space>> eager(world, eager_o, make);
        eager_peak = ledger.peak("host"), eager_held = ledger.current("host");
        eager_values = shard_values(eager);
        unit = largest_unit_bytes(eager);
      }
      {
        MemoryLedger ledger;
        train::Trainer<Tagger<Space>> deferred(world, options_of(k), make);
        deferred_peak = ledger.peak("host"), deferred_held = ledger.current("host");
        deferred_values = shard_values(deferred);
        // And it trains as the eager one does (the parity test above: the same losses).
        const auto [x, y] = batch_of(0, cfg);
        if (!std::isfinite(deferred.step(deferred.microbatches(x, y)).loss)) report("deferred: a non-finite loss");
        // Its memory by phase (issue 40, item 4): construction is what the ledger saw around the
        // constructor; the schedule's temporaries are tagged activations, in the forward (saved
        // for the backward) and the backward (their gradients); the unsharded gradients appear in
        // the backward only; AdamW's moments appear in the optimizer phase (made at its first
        // step) on top of the shards.
        const auto& m = deferred.memory();
        if (m[0].name != "construction" || m[0].total != deferred_peak)
          report("construction phase " + std::to_string(m[0].total) + " B, the ledger's " + std::to_string(deferred_peak));
        for (std::size_t ph : {1, 2})
          if (m[ph].of(MemoryTag::activations) <= 0 || m[ph].of(MemoryTag::other) != 0)
            report(m[ph].name + ": activations " + std::to_string(m[ph].of(MemoryTag::activations)) + " B, untagged " +
                   std::to_string(m[ph].of(MemoryTag::other)));
        if (m[1].name != "forward" || m[2].name != "backward" || m[3].name != "optimizer") report("phase names");
        if (m[2].of(MemoryTag::gradients) <= m[0].of(MemoryTag::gradients))
          report("backward phase: gradients " + std::to_string(m[2].of(MemoryTag::gradients)) +
                 " B, no more than the shards' " + std::to_string(m[0].of(MemoryTag::gradients)));
        if (m[3].of(MemoryTag::optimizer_state) < m[0].of(MemoryTag::optimizer_state))
          report("optimizer phase holds less optimizer state than construction");
        for (std::size_t ph : {1, 2})
          if (m[ph].total < m[ph].of(MemoryTag::activations)) report(m[ph].name + ": total below its activations");
        if (m[3].total <= 0) report("optimizer phase: no total");
      }
      if (eager_values.empty()) report("no shard values on this rank");
      if (deferred_values != eager_values) report("the deferred shards differ from the eager build's");
      if (deferred_held != eager_held)
        report("held after construction: deferred " + std::to_string(deferred_held) + " B, eager " + std::to_string(eager_held));
      if (deferred_peak > deferred_held + unit)
        report("deferred construction peak " + std::to_string(deferred_peak) + " B > held " + std::to_string(deferred_held) +
               " + one unit " + std::to_string(unit));
      if (eager_peak <= eager_held + unit)  // the bound is not trivially met: the eager build exceeds it
        report("eager construction peak " + std::to_string(eager_peak) + " B within the bound");
    });
    for (const auto& f : failures) UNSCOPED_INFO(f);
    CHECK(failures.empty());
  }
}

TEST_CASE(
    "train::Trainer: DDP (ZeRO-1 over one shard rank) updates its values in place: no staging buffer of the "
    "model's size in the optimizer phase",
    "[train][memory]") {
  // ZeRO-1/2's parameter sync all-gathers each unit's updated shard from a send buffer; over one
  // shard rank that buffer would be the whole unit, every unit's issued at once: a second copy of
  // the model in the optimizer phase. The shard is the unit there, the master values are the
  // model's own, and nothing is staged. ZeRO-1 over 2 shard ranks stages two units' shards at a
  // time (before: every unit's at once).
  const TaggerConfig cfg;
  for (const Case& k : {Case{.degrees = {.dp = 2}, .zero = 1}, Case{.degrees = {.dp = 3}, .zero = 2},
                        Case{.degrees = {.fsdp = 2}, .zero = 1}}) {
    INFO(describe(k));
    const bool one_shard_rank = k.degrees.fsdp == 1;
    auto failures = testing::on_ranks(k.degrees.ranks(), [&](CommPtr world, auto report) {
      using Space = host_space;
      train::Trainer<Tagger<Space>> trainer(world, options_of(k),
                                            [&](const train::StageMeshIn<Space>& m) { return Tagger<Space>(m, cfg); });
      for (int s = 0; s < 2; ++s) {
        const auto [x, y] = batch_of(s, cfg);
        (void)trainer.step(trainer.microbatches(x, y));
      }
      const std::int64_t staged = trainer.memory()[3].of(MemoryTag::communication);
      // Over 2 shard ranks: two units' shards in flight at a time (half a unit each), not every unit's.
      if (one_shard_rank ? staged != 0 : staged <= 0 || staged > largest_unit_bytes(trainer))
        report("optimizer phase: " + std::to_string(staged) + " B of communication buffers (largest unit " +
               std::to_string(largest_unit_bytes(trainer)) + " B)");
    });
    for (const auto& f : failures) UNSCOPED_INFO(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("nn::DeferredInit: parameters from an Init wait, parameters from values do not, and a mixed group is "
          "materialised as the eager one",
          "[train][deferred]") {
  auto failures = testing::on_ranks(2, [&](CommPtr world, auto report) {
    using Mesh = DeviceMesh<"tp">;
    using L = nn::params<Mesh, Shard<1>>;
    using P = nn::Parameter<double, 2, Mesh, L>;
    struct Two {  // a leaf module of two parameters
      P& a;
      P& b;
      auto parameters() { return std::tie(a, b); }
    };
    Mesh mesh(world, {2});
    const Shape<2> shape{5, 7};  // 7 columns over 2 ranks: 4 and 3 (the short piece leaves a gap)
    const auto init = nn::Init::normal(42, 0.5, 0.1);
    P eager("w", mesh, shape, init);
    const auto want = eager.value().to_local();
    nn::DeferredInit deferred;
    P waits("w", mesh, shape, init);
    if (!waits.group()->deferred() || waits.group()->resident_bytes() != 0) report("an Init parameter allocated in the scope");
    // A window of the flat buffer drawn alone equals the eager values there (zero past them).
    std::vector<double> part(12);
    waits.group()->initial_values(5, std::span<double>(part));
    const auto all = eager.group()->values();
    for (std::size_t i = 0; i < part.size(); ++i)
      if (part[i] != (5 + i < all.size() ? all[5 + i] : 0.0)) report("window element " + std::to_string(5 + i) + " differs");
    // A parameter from a value is built now, whatever the scope; flattened with a deferred one,
    // the group is materialised (the deferred one drawn as eagerly).
    P given("v", distribute_replicated<L>(mesh, normal<double>(shape, 7)));
    if (given.group()->deferred()) report("a parameter from a value was deferred");
    Two both{waits, given};
    auto group = nn::flatten<double, 1>("g", both);
    if (group->deferred()) report("a mixed group was deferred");
    const auto a = waits.value().to_local();
    for (Extent i = 0; i < a.numel(); ++i)
      if (a[i] != want[i]) report("flattened element " + std::to_string(i) + " differs");
    // Reading a deferred parameter's value materialises its group.
    P read("r", mesh, shape, init);
    const auto c = read.value().to_local();
    if (read.group()->deferred()) report("read but still deferred");
    for (Extent i = 0; i < c.numel(); ++i)
      if (c[i] != want[i]) report("materialised element " + std::to_string(i) + " differs");
  });
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

// ---------------------------------------------------------------- the loop (train/loop.hpp; issue 41)

namespace {
/// The tagger's data as a data source: batch_of(i) for the i-th batch drawn, its position the
/// state a checkpoint keeps (a resumed run that did not restore it would draw batch 0 again).
struct CountingData {
  int drawn = 0;
  std::vector<int> evaluated;  // the steps evaluated after
  template <class Tr>
  train::FitData<Tr> hooks(Tr& trainer, const TaggerConfig& cfg) {
    train::FitData<Tr> d;
    d.batch = [this, &trainer, &cfg](int) {
      const auto [x, y] = batch_of(drawn++, cfg);
      return trainer.microbatches(x, y);
    };
    d.evaluate = [this, &trainer, &cfg](int step) {
      evaluated.push_back(step);
      const auto [x, y] = batch_of(100, cfg);
      return trainer.evaluate(trainer.microbatches(x, y));
    };
    d.state = [this] { return std::to_string(drawn); };
    d.restore = [this](const std::string& s) {
      drawn = std::stoi(s);
      return true;
    };
    return d;
  }
};
}  // namespace

TEST_CASE(
    "train::fit: the one-rank loop's losses, evaluation every N steps and at the end, a checkpoint resumed "
    "bit for bit, and the report",
    "[train][loop]") {
  const TaggerConfig cfg;
  const auto ref = one_rank_losses(cfg);  // steps 1..4 draw batch_of(0..3), as the oracle does
  const Case k{.degrees = {.fsdp = 2}, .zero = 3};
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dtensor_fit_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  auto run = [&](train::FitOptions fo, std::vector<int>* evaluated = nullptr) {
    std::vector<train::FitReport> reports(2);
    auto failures = testing::on_ranks(2, [&](CommPtr world, auto) {
      train::Trainer<Tagger<host_space>> trainer(
          world, options_of(k), [&](const train::StageMeshIn<host_space>& m) { return Tagger<host_space>(m, cfg); });
      CountingData data;
      reports[std::size_t(world->rank())] = train::fit(trainer, fo, data.hooks(trainer, cfg));
      if (evaluated && world->rank() == 0) *evaluated = data.evaluated;
    });
    REQUIRE(failures.empty());
    return reports;
  };
  std::vector<int> evaluated;
  const auto straight = run(
      {.steps = steps, .eval_every = 3, .config = {{"model", "tagger"}}, .tokens_per_step = 48, .progress_bar = false},
      &evaluated);
  const auto& r = straight[0];
  REQUIRE(r.losses.size() == std::size_t(steps));
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s + 1);
    CHECK(r.losses[std::size_t(s)] == Approx(ref[std::size_t(s)]).epsilon(1e-9));
    CHECK(straight[1].losses[std::size_t(s)] == r.losses[std::size_t(s)]);  // every rank has the loss
  }
  CHECK(evaluated == std::vector<int>{3, 4});  // every 3 steps, and after the last
  REQUIRE(r.validation.size() == 2);
  CHECK(r.validation[1].first == 4);
  CHECK(r.val_loss == r.validation[1].second);
  CHECK(r.first_step == 1);
  CHECK(r.last_step == steps);
  CHECK(r.steps_run == steps);
  CHECK(r.first_loss == r.losses.front());
  CHECK(r.train_loss == r.losses.back());
  CHECK(r.elapsed > 0);
  CHECK(r.tokens_per_second == Approx(48.0 * steps / r.elapsed));
  CHECK(r.peak_step == 2);
  CHECK(r.space == "host");
  // The largest rank's step peak holds the shards, the gradients and AdamW's moments.
  REQUIRE(r.step_peaks.size() == memory_tag_count + 1);
  for (MemoryTag t :
       {MemoryTag::parameters, MemoryTag::gradients, MemoryTag::optimizer_state, MemoryTag::activations}) {
    INFO(name_of(t));
    CHECK(r.step_peaks[std::size_t(t)] > 0);
  }
  CHECK(r.step_peaks[memory_tag_count] >= r.step_peaks[std::size_t(MemoryTag::parameters)]);
  CHECK(straight[1].step_peaks == r.step_peaks);  // reduced over the ranks
  REQUIRE(r.phases.size() == 4);
  CHECK(r.phases[0].name == "construction");
  for (const auto& p : r.phases) CHECK(p.total > 0);
  // ZeRO-3 over fsdp 2: the units' all-gathers and reduce-scatters on "fsdp" in one step.
  std::size_t on_fsdp = 0;
  for (const auto& [key, v] : r.collectives)
    if (key.ends_with(" on fsdp")) on_fsdp += v.first;
  CHECK(on_fsdp > 0);

  // Two steps saved at step 2, then a fresh trainer resumed to step 4: the same losses, bit for bit.
  const auto saved = run({.steps = 2,
                          .eval_every = 10,
                          .save_every = 2,
                          .save_dir = dir,
                          .config = {{"model", "tagger"}},
                          .progress_bar = false});
  CHECK(saved[0].losses == std::vector<double>(r.losses.begin(), r.losses.begin() + 2));
  const auto resumed =
      run({.steps = steps, .eval_every = 3, .resume_dir = dir, .config = {{"model", "tagger"}}, .progress_bar = false},
          &evaluated);
  CHECK(resumed[0].resumed);
  CHECK(resumed[0].first_step == 3);
  CHECK(resumed[0].steps_run == 2);
  CHECK(resumed[0].losses == std::vector<double>(r.losses.begin() + 2, r.losses.end()));
  CHECK(resumed[0].val_loss == r.val_loss);
  CHECK(evaluated == std::vector<int>{3, 4});

  // Resumed at the last step: an error naming it, or (allow_finished) nothing run.
  try {
    run({.steps = 2, .resume_dir = dir, .config = {{"model", "tagger"}}});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("train::fit") && Catch::Contains("is at step 2"));
  }
  const auto finished = run({.steps = 2, .resume_dir = dir, .config = {{"model", "tagger"}}, .allow_finished = true});
  CHECK(finished[0].steps_run == 0);
  CHECK(finished[0].losses.empty());
  const auto loaded = run({.steps = 0, .resume_dir = dir, .config = {{"model", "tagger"}}, .allow_finished = true});
  CHECK(loaded[0].steps_run == 0);  // only the resume: the generate program's use
  std::filesystem::remove_all(dir);
}

TEST_CASE("train::fit: ranks given different options fail together, naming the option", "[train][loop][errors]") {
  // Without the agreement rank 1 would run a fourth step alone and wait in its barrier.
  auto failures = testing::on_ranks(2, [&](CommPtr world, auto report) {
    train::Trainer<Tagger<host_space>> trainer(
        world, train::TrainerOptions{.degrees = {.fsdp = 2}},
        [&](const train::StageMeshIn<host_space>& m) { return Tagger<host_space>(m, TaggerConfig{}); });
    const TaggerConfig cfg;
    CountingData counting;
    const auto data = counting.hooks(trainer, cfg);
    try {
      train::fit(trainer, {.steps = world->rank() == 0 ? 3 : 4}, data);
      report("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("train::fit") == std::string::npos || what.find("steps") == std::string::npos)
        report("unclear: " + what);
    }
    if (trainer.steps() != 0) report("a step ran");
  });
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

TEST_CASE("train::fit: bad options are a dtensor::Error naming the op and the values", "[train][loop][errors]") {
  threads::run(1, [&](CommPtr world) {
    train::Trainer<Tagger<host_space>> trainer(
        world, train::TrainerOptions{},
        [&](const train::StageMeshIn<host_space>& m) { return Tagger<host_space>(m, TaggerConfig{}); });
    const TaggerConfig cfg;
    CountingData good;
    auto data = good.hooks(trainer, cfg);
    auto error_of = [&](const train::FitOptions& fo, const train::FitData<decltype(trainer)>& d) {
      try {
        train::fit(trainer, fo, d);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    using Catch::Contains;
    CHECK_THAT(error_of({.steps = 0}, data), Contains("train::fit") && Contains("steps >= 1") && Contains("got 0"));
    CHECK_THAT(error_of({.steps = 2, .eval_every = 0}, data),
               Contains("train::fit") && Contains("eval_every >= 1") && Contains("got 0"));
    CHECK_THAT(error_of({.steps = 2, .save_every = -1}, data), Contains("train::fit") && Contains("got -1"));
    CHECK_THAT(error_of({.steps = 2, .save_every = 3}, data),
               Contains("train::fit") && Contains("save_every 3") && Contains("save_dir"));
    CHECK_THAT(error_of({.steps = 2}, {}), Contains("train::fit") && Contains("data.batch"));
    CHECK(trainer.steps() == 0);  // nothing ran
  });
}

// ---------------------------------------------------------------- the Trainer's flags (issue 41, item 2)

namespace {
struct MyFlags : train::cli::TrainerFlags {
  Extent layers = 2, batch = 8;
};

train::cli::FlagTable<MyFlags> my_table() {
  using train::cli::integer;
  return train::cli::joined_rows<MyFlags>({train::cli::mesh_flag_rows<MyFlags>("mesh:"),
                                           {{"--layers", "N", "blocks", integer(&MyFlags::layers, 1)},
                                            {"--batch", "N", "sequences per step", integer(&MyFlags::batch, 1)}},
                                           train::cli::trainer_flag_rows<MyFlags>(),
                                           {{"--help", "", "this text"}}});
}

/// The flags of `args` (after the program's name), parsed and checked as a program does.
MyFlags parsed(std::vector<std::string> args) {
  args.insert(args.begin(), "my_trainer");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  MyFlags o;
  train::cli::parse_flags(my_table(), o, int(argv.size()), argv.data(), "my_trainer");
  train::cli::check_trainer_flags(o, {.batch = o.batch, .layers = o.layers});
  return o;
}

std::string usage_error(const std::vector<std::string>& args) {
  try {
    parsed(args);
  } catch (const train::cli::UsageError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("train::cli: the Trainer's flags make its options; the defaults resolve as the Trainer's", "[train][flags]") {
  const auto o = parsed({"--pp",         "2", "--fsdp",     "2",    "--cp",    "1",         "--tp",          "1",
                         "--steps",      "7", "--lr",       "0.01", "--sync",  "local-sgd", "--inner-steps", "3",
                         "--save-every", "2", "--save-dir", "ckpt", "--batch", "12"});
  CHECK(o.zero == 3);          // fsdp > 1: ZeRO-3
  CHECK(o.microbatches == 4);  // a pipeline: 2 x pp
  const auto t = train::cli::trainer_options(o, {.batch = o.batch});
  CHECK(t.degrees.ranks() == 4);
  CHECK(t.zero_stage() == 3);
  CHECK(t.adamw.lr == 0.01);
  CHECK(t.sync.kind == parallel::sync::SyncKind::local_sgd);
  CHECK(t.sync.inner_steps == 3);
  CHECK(t.sync.samples_per_step == 12);
  CHECK(t.offload_optimizer_dir.empty());
  CHECK_NOTHROW(t.check(4));
  const auto f = train::cli::fit_options(o);
  CHECK(f.steps == 7);
  CHECK(f.save_every == 2);
  CHECK(f.save_dir == "ckpt");
  std::map<std::string, std::string> config;
  train::cli::add_sync_config(o, config);
  CHECK(config.at("sync") == "local-sgd");
  CHECK(config.at("sync_inner_steps") == "3");
}

TEST_CASE("train::cli: flags that cannot work together are a usage error naming them", "[train][flags][errors]") {
  CHECK_THAT(usage_error({"--microbatches", "3"}), Catch::Contains("--microbatches 3 does not divide --batch 8"));
  CHECK_THAT(usage_error({"--pp", "1", "--fsdp", "4", "--microbatches", "4"}),
             Catch::Contains("a micro-batch of 2 sequences") && Catch::Contains("4 data ranks"));
  CHECK_THAT(usage_error({"--pp", "1", "--fsdp", "1", "--zero", "1", "--reshard-after-forward"}),
             Catch::Contains("--reshard-after-forward is for ZeRO-3"));
  CHECK_THAT(usage_error({"--schedule", "fastest"}), Catch::Contains("--schedule: "));
  CHECK_THAT(usage_error({"--pp", "2", "--schedule", "zbv"}),
             Catch::Contains("--schedule zbv with --pp 2 has 4 stages: --layers 2 must be at least that"));
  CHECK_THAT(usage_error({"--save-every", "2"}), Catch::Contains("--save-every needs --save-dir DIR"));
  CHECK_THAT(usage_error({"--inner-steps", "4"}),
             Catch::Contains("--inner-steps needs --sync local-sgd, diloco or fedavg"));
  CHECK_THAT(usage_error({"--dp", "2", "--fsdp", "1", "--sync", "diloco", "--inner-steps", "2", "--fragments", "3"}),
             Catch::Contains("--fragments 3 exceeds --inner-steps 2"));
  CHECK_THAT(usage_error({"--clients", "3"}), Catch::Contains("--clients 3: more clients than the 1 dp ranks"));
  CHECK_THAT(usage_error({"--offload-dir", "/tmp"}), Catch::Contains("--offload-dir needs --offload"));
  CHECK_THAT(usage_error({"--pp", "1", "--fsdp", "1", "--offload", "params", "--offload-dir", "/tmp"}),
             Catch::Contains("--offload params with --dtype f32 at ZeRO-1"));
  CHECK_THAT(usage_error({"--export", "model.bin"}),
             Catch::Contains("--export model.bin: the file name must end in .safetensors"));
  CHECK_THAT(usage_error({"--host-budget-mib", "1e-320"}),
             Catch::Contains("--host-budget-mib 1e-320 is less than one byte"));
  CHECK_THAT(usage_error({"--outer-momentum", "1"}), Catch::Contains("--outer-momentum expects a number in [0, 1)"));
  CHECK(usage_error({"--pp", "1", "--dp", "2", "--fsdp", "1", "--sync", "diloco", "--inner-steps", "4"}) == "no error");
  // A run the checks pass is one the Trainer accepts.
  const auto o = parsed({"--pp", "1", "--dp", "2", "--fsdp", "1", "--sync", "diloco", "--inner-steps", "4"});
  CHECK_NOTHROW(train::cli::trainer_options(o, {.batch = o.batch}).check(o.ranks()));
}

TEST_CASE("train::cli, models::cli: a transformer's heads and experts over the mesh, and a dry run's rank bound",
          "[train][flags][errors]") {
  train::cli::MeshFlags m;  // pp 2 x dp 1 x fsdp 2 x cp 2 x tp 2
  auto error_of = [](auto&& check) -> std::string {
    try {
      check();
    } catch (const train::cli::UsageError& e) {
      return e.what();
    }
    return "no error";
  };
  using train::cli::check_heads_over_mesh;
  CHECK_THAT(error_of([&] { check_heads_over_mesh(m, 64, 3); }),
             Catch::Contains("--dim 64 is not a multiple of --heads 3"));
  CHECK_THAT(error_of([&] { check_heads_over_mesh(m, 63, 3); }),
             Catch::Contains("--heads 3 is not a multiple of --tp 2"));
  m.cp_kind = nn::ContextKind::ulysses;
  CHECK_THAT(error_of([&] { check_heads_over_mesh(m, 60, 6); }),
             Catch::Contains("--cp-kind ulysses splits the heads over tp x cp: --heads 6 is not a multiple of 4"));
  CHECK(error_of([&] { check_heads_over_mesh(m, 64, 8); }) == "no error");
  // MoE flags without experts would train a dense model: refused, as --ep without them.
  models::cli::MoEFlags e;
  CHECK(error_of([&] { models::cli::check_moe_flags(e, m, 2); }) == "no error");
  e.tuned = true;
  CHECK_THAT(error_of([&] { models::cli::check_moe_flags(e, m, 2); }),
             Catch::Contains(
                 "--topk, --moe-every, --dense-first, --capacity, --shared-experts, --expert-groups, --topk-groups and "
                 "--ep-node-size have no effect without --experts E"));
  e.experts = 5, m.ep = 3;  // 5 experts over 3 of the 4 token ranks
  CHECK_THAT(error_of([&] { models::cli::check_moe_flags(e, m, 2); }),
             Catch::Contains("--ep 3 does not divide the token ranks --dp x --fsdp x --cp = 4"));
  // The node-level dispatch: nodes of --ep-node-size expert ranks dividing --ep, each with an expert.
  e.experts = 7, m.ep = 4, e.ep_node_size = 3;
  CHECK_THAT(error_of([&] { models::cli::check_moe_flags(e, m, 2); }),
             Catch::Contains("--ep-node-size 3 does not divide --ep 4"));
  e.ep_node_size = 2;
  CHECK(error_of([&] { models::cli::check_moe_flags(e, m, 2); }) == "no error");
  CHECK(models::cli::moe_layers_config(e).node_size == 2);
  e.experts = 3;  // 3 over 4 ranks: 1, 1, 1, 0 — nodes of 2 own 2 and 1
  CHECK(error_of([&] { models::cli::check_moe_flags(e, m, 2); }) == "no error");
  e.ep_node_size = 1;  // the last rank, a node of its own, owns none
  CHECK_THAT(error_of([&] { models::cli::check_moe_flags(e, m, 2); }),
             Catch::Contains("--ep-node-size 1: ") && Catch::Contains("leave node 3 (ranks 3..3) without an expert"));
  // The threads backend's bound, or a dry run's (one rank per class runs).
  train::cli::MeshFlags big;
  big.pp = 64, big.fsdp = 64, big.cp = 1, big.tp = 8;  // 32,768 ranks
  CHECK_THAT(error_of([&] { train::cli::check_mesh_flags(big, 1 << 20); }),
             Catch::Contains("pp x dp x fsdp x cp x tp = 32768 ranks, more than 4096"));
  CHECK(error_of([&] { train::cli::check_mesh_flags(big, 1 << 20, 1LL << 31); }) == "no error");
}

TEST_CASE("train::cli: the ranks' settings are the flag table's, one per flag, named by it", "[train][flags]") {
  const auto a = parsed({"--lr", "3e-3", "--sync", "async", "--dp", "2", "--fsdp", "1", "--staleness", "2"});
  const auto settings = train::cli::settings_of(my_table(), a);
  std::size_t flags = 0;
  for (const auto& row : my_table()) flags += !row.name.empty() && row.set ? 1 : 0;
  CHECK(settings.size() == flags);  // every flag but --help, none twice
  auto value = [&](const std::string& name) {
    for (const auto& s : settings)
      if (s.name == name) return s.value;
    return std::string("(missing)");
  };
  CHECK(value("--lr") == "0.003");  // 3e-3 and 0.003 agree: the shortest exact text
  CHECK(value("--sync") == "async");
  CHECK(value("--staleness") == "2");
  CHECK(value("--sp") == "on");
  CHECK(value("--no-sp") == "off");
  CHECK(value("--reshard-after-forward") == "off");
  CHECK(value("--cp-kind") == "ring");
  CHECK(value("--zero") == "1");
  CHECK(value("--layers") == "2");
  // Ranks given another --lr are told which flag differs, on every rank, before anything is built.
  auto failures = testing::on_ranks(3, [&](CommPtr world, auto report) {
    const auto mine = parsed({"--lr", world->rank() == 2 ? "0.0030001" : "0.003"});
    try {
      require_same_settings(*world, "my_trainer", train::cli::settings_of(my_table(), mine));
      report("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("--lr: ranks 0, 1 '0.003'; rank 2 '0.0030001'") == std::string::npos ||
          what.find("--steps") != std::string::npos)
        report("unclear: " + what);
    }
  });
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
  // A hand-written setter without its value would be a flag the ranks do not compare.
  train::cli::FlagTable<MyFlags> broken{
      {"--odd", "N", "a row", [](MyFlags&, const std::string&, const std::string&) {}}};
  CHECK_THROWS_AS(train::cli::settings_of(broken, a), std::logic_error);
}

// ---------------------------------------------------------------- the character corpus

namespace {
/// A stand-in Trainer for text_batches: its micro-batches are the whole batch's ids and targets.
struct BatchTrainer {
  using Microbatches = std::pair<Tensor<std::int32_t, 2>, Tensor<std::int32_t, 2>>;
  Microbatches microbatches(const Tensor<std::int32_t, 2>& ids, const Tensor<std::int32_t, 2>& targets) {
    return {ids, targets};
  }
  double evaluate(const Microbatches& m) { return double(m.first.shape()[0]); }
};

bool same(const Tensor<std::int32_t, 2>& a, const Tensor<std::int32_t, 2>& b) {
  return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.numel(), b.data());
}
}  // namespace

TEST_CASE("models::encode: sorted character ids, 90% to train, the rest to validate", "[models][text]") {
  const std::string text = "hello world, the quick brown fox jumps over the lazy dog; " + std::string(40, 'z');
  const auto c = models::encode(text, 4);
  CHECK(std::is_sorted(c.chars.begin(), c.chars.end()));
  CHECK(c.train.size() == text.size() * 9 / 10);
  CHECK(c.train.size() + c.val.size() == text.size());
  CHECK(models::decode(c.train, c) + models::decode(c.val, c) == text);
  CHECK(models::decode(models::encode_prompt("the fox", c), c) == "the fox");
  CHECK_THROWS_WITH(models::encode_prompt("the \xc3\xa9", c, "--prompt"),
                    Catch::Contains("--prompt: the character '\xc3\xa9' (2 bytes in UTF-8") &&
                        Catch::Contains("is not in the training text's"));
  CHECK_THROWS_WITH(models::encode("abcdefgh", 8), Catch::Contains("too short"));
  // The same size, other characters: another vocabulary; one token changed: other contents.
  auto other = text;
  other[0] = 'H';
  CHECK(models::vocabulary_id(models::encode(other, 4)) != models::vocabulary_id(c));
  auto swapped = text;
  std::swap(swapped[1], swapped[2]);
  CHECK(models::vocabulary_id(models::encode(swapped, 4)) == models::vocabulary_id(c));
  CHECK(models::content_id(models::encode(swapped, 4)) != models::content_id(c));
}

TEST_CASE("models::fold_of: k folds whose validation blocks partition the text", "[models][text]") {
  std::string text;
  for (int i = 0; i < 997; ++i) text += char('a' + (i * 7) % 26);  // 997 tokens: blocks that do not divide
  const auto c = models::encode(text, 3);
  std::size_t val = 0;
  for (int f = 0; f < 3; ++f) {
    const auto fold = models::fold_of(c, 3, f, /*seed=*/5, 3);
    CHECK(fold.train.size() + fold.val.size() == text.size());  // every token once
    CHECK(fold.chars == c.chars);
    val += fold.val.size();
  }
  CHECK(val == text.size());  // each block validates in exactly one fold
}

TEST_CASE("models::text_batches: the sequences and next characters, FedAvg's slices, the data position",
          "[models][text]") {
  std::string text;
  std::mt19937 letters(11);  // 8 random letters repeat nowhere in 2000: each row's start is unique
  for (int i = 0; i < 2000; ++i) text += char('a' + letters() % 26);
  const Extent seq = 8;
  const auto c = models::encode(text, seq);
  BatchTrainer trainer;
  std::mt19937_64 rng(3);
  const models::TextBatchOptions o{.batch = 4, .seq = seq, .microbatches = 1, .dp = 2, .fedavg = true};
  auto data = models::text_batches(c, trainer, o, rng);
  const auto state = data.state();
  const auto batch = data.batch(1);
  const auto& ids = batch.first;
  const std::size_t span = c.train.size() - std::size_t(seq) - 1;
  for (Extent b = 0; b < 4; ++b) {
    std::size_t start = 0;  // where the row starts in the training text
    for (; start <= span; ++start) {
      bool here = true;
      for (Extent t = 0; t < seq && here; ++t) here = c.train[start + std::size_t(t)] == ids(b, t);
      if (here) break;
    }
    REQUIRE(start <= span);
    for (Extent t = 0; t < seq; ++t) CHECK(batch.second(b, t) == c.train[start + std::size_t(t) + 1]);
    // FedAvg: rows 0 and 1 are client 0's, the first half of the text; rows 2 and 3 client 1's.
    CHECK((b < 2 ? start < span / 2 : start >= span / 2));
  }
  // The data position: restored, the same batch again; the next one differs.
  REQUIRE(data.restore(state));
  CHECK(same(data.batch(1).first, ids));
  CHECK_FALSE(same(data.batch(2).first, ids));
  CHECK(data.evaluate(1) == 4);
  // Ring attention's order: the same tokens, load-balanced over cp 2.
  std::mt19937_64 rng2(3);
  auto balanced =
      models::text_batches(c, trainer, {.batch = 4, .seq = 4, .microbatches = 1, .cp = 2, .load_balanced = true}, rng2);
  std::mt19937_64 rng3(3);
  auto plain = models::text_batches(c, trainer, {.batch = 4, .seq = 4, .microbatches = 1}, rng3);
  CHECK(same(balanced.batch(1).first, parallel::load_balance(plain.batch(1).first, 1, 2)));
}

}  // namespace test_trainer
