// Five parallelisms at once (issue 18's parity): the GPT trained 20 steps on the trainer's mesh
// (pp, dp, fsdp, cp, tp) — size-1 dimensions where a parallelism is off — through
// parallel::pipeline::ShardedPipeline (pipeline stages, each FSDP-sharded, context and tensor +
// sequence parallel inside, MoE blocks with expert parallelism) gives the per-step losses of the
// one-rank run within 1e-5 relative (double): PP x FSDP x CP x TP + SP on 16 threads, PP x FSDP x
// TP + SP x EP, all of them — PP x FSDP x CP x TP + SP x EP — on 16 threads, and 3- and 4-D combinations with every ZeRO stage, HSDP, ring / all-gather /
// Ulysses attention and several schedules (sharded_pipeline_parity.hpp).
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <tuple>

#include <unistd.h>

#include "dtensor/checkpoint/pipeline_state.hpp"
#include "dtensor/models/gpt_config.hpp"
#include "sharded_pipeline_parity.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the parity test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_5d_parity {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

/// The one-rank run: the dense GPT's, or the MoE GPT's with `experts` experts.
const std::vector<double>& reference(bool moe, Extent experts) {
  static const std::vector<double> dense = [] {
    std::vector<double> losses;
    threads::run(1, [&](CommPtr w) { losses = dense_reference(w); });
    return losses;
  }();
  static std::map<Extent, std::vector<double>> by_experts;
  if (!moe) return dense;
  auto& losses = by_experts[experts];
  if (losses.empty()) threads::run(1, [&](CommPtr w) { losses = moe_reference(w, experts); });
  return losses;
}

template <class Plan, bool MoE = false>
void check(const Combo& c) {
  INFO(describe(c) +
       (MoE ? ", MoE " + std::to_string(c.experts) + " experts over ep " + std::to_string(c.ep) : std::string()));
  const auto& ref = reference(MoE, c.experts);
  auto failures = on_ranks(c.ranks(), [&](CommPtr world, auto report) {
    const Run5d run = run_5d<Plan, MoE>(world, c);
    report(compare_losses(run.losses, ref, 1e-5));
    // FSDP inside the stages: one reduction per unit per step, during the stage's last backward
    // (not one per micro-batch); ZeRO-3 kept gathered: one all-gather per unit (UNSHARD);
    // ZeRO-3 resharded after forward: one per unit for each micro-batch's forward and one for
    // its backward; ZeRO-1/2 one after the optimizer (sync_parameters).
    // Zero-bubble schedules split the backward: a unit gathered for a micro-batch's I stays until
    // its W (which frees it), so a forward in between finds it resident: fewer, never more.
    // ZeRO-1/2 over one shard rank (fsdp x cp = 1: DDP) gather nothing: the shard is the unit.
    const bool split = c.schedule == "zb" || c.schedule == "zbv" || c.schedule == "dualpipev";
    const std::size_t gathers = c.zero == 3 && !run.kept_gathered  ? 2 * run.units * std::size_t(c.microbatches)
                                : c.zero < 3 && c.fsdp * c.cp == 1 ? 0
                                                                   : run.units;
    if (run.fsdp_reductions != run.units)
      report("FSDP reduced " + std::to_string(run.fsdp_reductions) + " times for " + std::to_string(run.units) + " units");
    if (split && c.zero == 3 && !run.kept_gathered ? run.fsdp_gathers > gathers || run.fsdp_gathers < gathers / 2
                                                   : run.fsdp_gathers != gathers)
      report("FSDP all-gathered " + std::to_string(run.fsdp_gathers) + " times, expected " + std::to_string(gathers) +
             " for " + std::to_string(run.units) + " units");
    // Under context parallelism FSDP shards over the flattened "fsdp*cp" group (the counts above
    // are on it): its reduce-scatter resolves "cp" too, so no gradient is all-reduced on "cp"
    // (a dense model's parameters are all FSDP's; MoE's router sums its counts over "cp").
    if (!MoE && run.cp_all_reduces != 0)
      report(std::to_string(run.cp_all_reduces) + " all-reduces on \"cp\"; FSDP over \"fsdp*cp\" leaves none");
    // The experts are sharded over "edp" as the dense units over "fsdp" (fully_shard's policy):
    // this rank holds at most each expert unit's ceil(size / edp) in params(), not the whole units.
    if (MoE && run.expert_shards > run.expert_shard_bound)
      report("the experts' shards hold " + std::to_string(run.expert_shards) + " elements of " +
             std::to_string(run.expert_elements) +
             ", more than ceil(size / edp) per unit = " + std::to_string(run.expert_shard_bound));
    if (MoE && run.expert_gap != 0)
      report("the expert units hold " + std::to_string(run.expert_gap) + " elements of gap");
  });
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

using SP = parallel::MegatronPlan<true>;
using TP = parallel::MegatronPlan<false>;

}  // namespace

TEST_CASE("5-D: PP x FSDP x CP x TP + SP on 16 threads equals the one-rank run", "[parity][5d]") {
  check<SP>({.pp = 2, .fsdp = 2, .cp = 2, .tp = 2});
}

TEST_CASE("4-D combinations equal the one-rank run", "[parity][5d]") {
  // HSDP inside pipeline stages with TP + SP (ZeRO-2).
  check<SP>({.pp = 2, .dp = 2, .fsdp = 2, .tp = 2, .zero = 2, .microbatches = 2});
  // FSDP x CP (all-gather KV) x TP without a pipeline, GPipe over the micro-batches (ZeRO-1).
  check<TP>({.fsdp = 2, .cp = 2, .tp = 2, .zero = 1, .schedule = "gpipe", .cp_kind = parallel::ContextKind::allgather});
  // DDP (an "fsdp" of 1) x CP (Ulysses) x PP, interleaved with two stages per rank.
  check<TP>({.pp = 2, .dp = 2, .cp = 2, .zero = 1, .schedule = "interleaved", .cp_kind = parallel::ContextKind::ulysses});
}

TEST_CASE("FSDP over fsdp x cp: the context ranks shard too, at fsdp 2 x cp 2 and fsdp 3 x cp 2, every ZeRO stage",
          "[parity][5d][fsdp][cp]") {
  // Issue 40 item 2 (torchtitan's dp_shard_cp): each unit's flat buffer is split over the 4 or 6
  // ranks of the flattened "fsdp*cp" group (uneven at 6: the units' sizes do not divide), gathered
  // and reduce-scattered there, with no all-reduce on "cp" (check() asserts the counts).
  for (int zero : {1, 2, 3})
    for (int fsdp : {2, 3}) check<TP>({.fsdp = fsdp, .cp = 2, .zero = zero, .schedule = "gpipe", .microbatches = 2});
  // Pipelines (each stage's units over "fsdp*cp"), and HSDP: replicated on "dp", sharded over fsdp x cp.
  for (int zero : {1, 3}) check<TP>({.pp = 2, .fsdp = 3, .cp = 2, .zero = zero, .microbatches = 2});
  check<TP>({.dp = 2, .fsdp = 2, .cp = 2, .zero = 3, .microbatches = 1});
}

TEST_CASE("ZeRO-1 and ZeRO-2 inside pipeline stages, units that fsdp 3 does not divide, equal the one-rank run",
          "[parity][5d]") {
  // Regression: a ZeRO-1/2 unit whose flat size is not a multiple of the shard count (the
  // embedding's 29 x 32 + 8 x 32 = 1184 elements over 3 ranks) lost its values when fully_shard
  // grew its buffer for the padded all-gather; inside ShardedPipeline ZeRO-1 gave NaN.
  for (int zero : {1, 2}) check<TP>({.pp = 2, .fsdp = 3, .zero = zero, .schedule = "gpipe", .microbatches = 1});
}

TEST_CASE("3-D combinations equal the one-rank run", "[parity][5d]") {
  check<SP>({.pp = 2, .fsdp = 2, .tp = 2, .schedule = "zbv"});          // FSDP inside zero-bubble V stages
  check<TP>({.pp = 2, .fsdp = 2, .cp = 2, .schedule = "zb"});           // ZB-H1 (split backward) with FSDP and CP
  check<SP>({.dp = 2, .cp = 2, .tp = 2, .zero = 1, .microbatches = 1});  // DDP x CP x TP + SP, one micro-batch
}

TEST_CASE("MoE: expert parallelism with PP, FSDP and TP equals the one-rank MoE run", "[parity][5d][moe]") {
  check<TP, true>({.fsdp = 2, .tp = 2, .ep = 2, .microbatches = 1});                      // 3-D: FSDP x TP x EP
  check<TP, true>({.dp = 2, .fsdp = 2, .tp = 2, .ep = 4, .zero = 2, .microbatches = 1});   // 4-D: HSDP x TP x EP
  // Pipelines: the auxiliary losses of both stages, over 2 micro-batches.
  check<TP, true>({.pp = 2, .fsdp = 2, .tp = 2, .ep = 2, .microbatches = 2});              // 4-D: PP x FSDP x TP x EP
  check<TP, true>({.pp = 2, .dp = 2, .ep = 2, .zero = 1, .schedule = "gpipe", .microbatches = 2});  // 3-D: PP x DP x EP
  // Experts that do not divide over ep (5 over 2: 3 + 2) in the pipeline's sharded stages: each
  // expert rank's units hold its own experts, no gap up to the largest share (nn::FlatEntry::slot).
  check<TP, true>({.pp = 2, .fsdp = 2, .ep = 2, .experts = 5, .microbatches = 2});  // ZeRO-3, edp 1
  // edp 2 (4 token ranks: one micro-batch of the 4 sequences, one each).
  check<TP, true>({.pp = 2, .fsdp = 4, .ep = 2, .experts = 5, .zero = 3, .microbatches = 1});  // ZeRO-3
  check<TP, true>(
      {.pp = 2, .dp = 4, .ep = 2, .experts = 5, .zero = 1, .schedule = "gpipe", .microbatches = 1});  // HSDP 4 x 1
  // ZeRO-3 with every expert on every expert rank (ep 1): each block's experts sharded over edp 2,
  // gathered with their block and reduce-scattered as its backward ends.
  check<TP, true>({.pp = 2, .fsdp = 2, .microbatches = 2});
}

namespace {

namespace fs = std::filesystem;
using MoEParts = models::GptParts<double, StageMesh, TP, std::int32_t, models::MoELayers<double, ExpertMesh>>;
using Snapshot = std::map<std::string, std::vector<double>>;  // a slot's name and box -> the values this rank holds

/// The MoE pipeline of combination c, loaded from `from` when given, trained over steps
/// [first, last) and saved to `to` when given: its per-step losses, and every slot this rank
/// holds (its shards of the parameters, the experts included, and of the AdamW moments) at the end.
std::pair<std::vector<double>, Snapshot> moe_checkpoint_run(CommPtr world, const Combo& c, int first, int last,
                                                            const fs::path& from, const fs::path& to) {
  Mesh5 mesh(world, {c.pp, c.dp, c.fsdp, c.cp, c.tp});
  const StageMesh stage_mesh = pp::stage_mesh_of(mesh);
  const auto cfg = parity_config();
  const models::MoELayers<double, ExpertMesh> layers(parallel::make_expert_mesh<ExpertMesh>(stage_mesh, c.ep),
                                                     moe_config(c.experts));
  auto schedule = pp::make_schedule(pp::parse_schedule_kind(c.schedule), c.pp, c.microbatches);
  auto stages = pp::split(MoEParts(stage_mesh, cfg, layers), schedule.layout, mesh.coordinate(0));
  pp::ShardedPipeline<pp::Stage<MoEParts>, Mesh5> run(mesh, schedule, std::move(stages), {.stage = c.zero}, 4096);
  auto opt = optim::make_adamw(run.params(), parity_adamw());
  const auto config = models::config_of(cfg);
  if (!from.empty()) checkpoint::load_pipeline_state(from, run, opt, config);
  std::vector<double> losses;
  for (int step = first; step < last; ++step) {
    auto [ids, targets] = parity_tokens(step, cfg, moe_batch);
    run.zero_grad();
    auto stats =
        run.step(pp::split_microbatches<typename pp::Stage<MoEParts>::Input>(stage_mesh, ids, targets, c.microbatches));
    run.clip_grad_norm(1.0);
    opt.step();
    run.sync_parameters();
    double loss = stats.loss.value_or(-std::numeric_limits<double>::infinity());  // on the last stage's ranks
    mesh.group(0).all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
    losses.push_back(loss);
  }
  if (!to.empty())
    checkpoint::save_pipeline_state(to, run, opt, checkpoint::TrainingMeta{.step = last, .config = config});
  Snapshot held;
  for (const auto& s : checkpoint::detail::pipeline_slots(run, opt))
    held[s.name + " " + to_string(s.box)].assign(s.data, s.data + s.box.numel());
  return {std::move(losses), std::move(held)};
}

}  // namespace

TEST_CASE(
    "MoE checkpoint: 5 experts over ep 2 on edp 2, saved from the sharded stages, resume on ep 1 and ep 4 "
    "bit for bit",
    "[parity][5d][moe][checkpoint]") {
  // Saved after 3 steps at fsdp 4 with the experts 3 + 2 over ep 2 (edp 2: the 2-expert ranks'
  // units hold 2 experts, no gap), then (a) resumed on ep 1 (every expert on each rank, edp 4)
  // and on ep 4 (2 + 2 + 1 + 0, edp 1: a rank with no expert): 3 more steps give the one-rank
  // run's losses within the 5-D tolerance; (b) loaded there and saved at once, then loaded on the
  // saving mesh: every slot of every rank (parameter and moment shards) equals what the saving
  // run held, bit for bit (the state passed through the other mesh's flat layout unchanged).
  const Combo saving{.fsdp = 4, .ep = 2, .experts = 5, .zero = 3, .microbatches = 1};
  const auto& ref = reference(true, saving.experts);
  constexpr int save_at = 3, total = 6;
  const fs::path root = fs::temp_directory_path() / ("dtensor-5d-moe-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(root);
  std::vector<Snapshot> saved(4);
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    const int rank = world->rank();
    auto [losses, held] = moe_checkpoint_run(world, saving, 0, save_at, {}, root / "ep2");
    report(compare_losses(losses, {ref.begin(), ref.begin() + save_at}, 1e-5));
    if (held.empty()) report("no slots to compare");
    saved[std::size_t(rank)] = std::move(held);
  });
  for (const auto& e : f) UNSCOPED_INFO(e);
  REQUIRE(f.empty());
  for (const int ep : {1, 4}) {
    INFO("resumed on ep " << ep);
    const Combo resuming{.fsdp = 4, .ep = ep, .experts = 5, .zero = 3, .microbatches = 1};
    f = on_ranks(4, [&](CommPtr world, auto report) {
      auto [losses, held] = moe_checkpoint_run(world, resuming, save_at, total, root / "ep2", {});
      report(compare_losses(losses, {ref.begin() + save_at, ref.begin() + total}, 1e-5));
    });
    const fs::path again = root / ("through-ep" + std::to_string(ep));
    if (f.empty())
      f = on_ranks(
          4, [&](CommPtr world, auto) { moe_checkpoint_run(world, resuming, save_at, save_at, root / "ep2", again); });
    if (f.empty())
      f = on_ranks(4, [&](CommPtr world, auto report) {
        const int rank = world->rank();
        auto [losses, held] = moe_checkpoint_run(world, saving, save_at, save_at, again, {});
        if (held != saved[std::size_t(rank)]) report("the state saved through ep " + std::to_string(ep) + " differs");
      });
    for (const auto& e : f) UNSCOPED_INFO(e);
    CHECK(f.empty());
  }
  fs::remove_all(root);
}

TEST_CASE("MoE x CP: dropless routing over context ranks equals the one-rank MoE run", "[parity][5d][moe]") {
  // The capacity of the parity config is the sequence's length, which never binds: the routing is
  // dropless, and the aux loss's per-sequence counts are summed over "cp" (nn/router.hpp). The
  // experts' ranks factor data x context: ep 4 spans both.
  check<TP, true>({.fsdp = 2, .cp = 2, .ep = 4, .microbatches = 1});                      // 3-D: FSDP x CP x EP
  check<TP, true>({.dp = 2, .cp = 2, .tp = 2, .ep = 2, .zero = 1, .microbatches = 1,
                   .cp_kind = parallel::ContextKind::allgather});                          // 4-D: DDP x CP x TP x EP
}

TEST_CASE("All five at once: PP x FSDP x CP x TP + SP x EP on 16 threads equals the one-rank MoE run", "[parity][5d][moe]") {
  check<SP, true>({.pp = 2, .fsdp = 2, .cp = 2, .tp = 2, .ep = 2, .microbatches = 2});
}

TEST_CASE("The five: PP x FSDP x TP + SP x EP equals the one-rank MoE run", "[parity][5d][moe]") {
  check<SP, true>({.pp = 2, .fsdp = 2, .tp = 2, .ep = 2, .microbatches = 2});
  check<SP, true>({.pp = 2, .dp = 2, .fsdp = 2, .tp = 2, .ep = 4, .zero = 2, .schedule = "gpipe", .microbatches = 1});
}

TEST_CASE("5-D: the trainer's DDP path (ZeRO-1 over fsdp 1) holds what DataParallel holds", "[parity][5d]") {
  // Issue 27: train_gpt --fsdp 1 --dp N goes through ShardedPipeline's ZeRO-1 over a size-1
  // "fsdp" dimension; with the model's type the master type its master values are the model's
  // values and its gradient shard the model's gradients, so it holds DataParallel's model states:
  // values, gradients and AdamW's two moments, 4 x 8 bytes per parameter in double (measured
  // for DataParallel itself on the ledger in test_fsdp_parity, "FSDP memory on the ledger").
  for (const Combo& c : {Combo{.dp = 2, .zero = 1, .microbatches = 2}, Combo{.pp = 2, .dp = 2, .zero = 1, .microbatches = 2}}) {
    INFO(describe(c));
    auto failures = on_ranks(c.ranks(), [&](CommPtr world, auto report) {
      const Run5d run = run_5d<TP>(world, c);
      const double want = 4 * sizeof(double) * run.psi;
      if (run.psi == 0 || std::abs(run.state_bytes - want) > 1e-3 * want)
        report(std::to_string(run.state_bytes) + " bytes of model states for " + std::to_string(run.psi) +
               " parameters; DataParallel holds " + std::to_string(want));
    });
    CHECK(failures.empty());
    for (const auto& f : failures) UNSCOPED_INFO(f);
  }
}

TEST_CASE("FSDP inside stages: ZeRO-3 resharded after forward and kept gathered both equal the one-rank run",
          "[parity][5d][fsdp]") {
  // pp 1: the default reshards per micro-batch (fully_shard's own behaviour), kept gathered on request.
  check<TP>({.fsdp = 2, .microbatches = 2});
  check<TP>({.fsdp = 3, .microbatches = 2, .reshard_after_forward = false});
  // Pipelines: the default keeps each stage gathered; resharded per micro-batch on request, with
  // 1F1B and with ZB-H1's split backward (each unit's reduction during the last W).
  check<SP>({.pp = 2, .fsdp = 2, .tp = 2, .microbatches = 4, .reshard_after_forward = true});
  check<TP>({.pp = 2, .fsdp = 2, .cp = 2, .schedule = "zb", .reshard_after_forward = true});
}

TEST_CASE("FSDP inside stages: each rank's step peak is the formula's; ZeRO-3 < ZeRO-2 < ZeRO-1 < DDP during the step",
          "[parity][5d][fsdp][memory]") {
  // docs/fsdp.md, "Memory during the step". Per rank, in elements of the model's type (S bytes),
  // with Psi this rank's parameters, N the shard ranks (fsdp x cp: the context ranks shard too), P the largest two neighbouring units
  // (padded), one micro-batch: ZeRO-3 resharded after forward holds its shards (Psi / N values,
  // Psi / N gradients) plus at most P gathered values and P full gradients (the unit computing and
  // the one prefetched or still reducing); kept gathered it holds the whole stage (Psi) from the
  // first forward to the last backward. The optimizer's 2 Psi / N moments are the same in all;
  // ZeRO-3's separate master shard (Psi / N) is tagged optimizer state on the ledger.
  constexpr double S = sizeof(double);
  struct Peaks {
    Run5d run;
    int zero;
  };
  // fsdp 4; 3: shards that do not divide; 2 x cp 2: N = 4 (the states shard over "fsdp*cp", not
  // over "fsdp" alone: half of what the context ranks held before, when they replicated them);
  // 3 x cp 2: N = 6, uneven. fsdp 4 and 2 x cp 2 again with activation checkpointing: the model
  // states' formulas are the same (a block's recomputation runs inside its unit's backward, on
  // the unit gathered for it), the activations smaller — issue 40's table had ZeRO-3 above
  // ZeRO-1 there (150.0 against 133.2 MiB).
  std::map<std::pair<int, int>, std::int64_t> total_without_checkpointing;
  for (const auto& [fsdp, cp, checkpoint] : {std::tuple{4, 1, false}, std::tuple{3, 1, false}, std::tuple{2, 2, false},
                                             std::tuple{3, 2, false}, std::tuple{4, 1, true}, std::tuple{2, 2, true}}) {
    std::vector<Peaks> peaks;
    for (int zero : {3, 2, 1}) {
      const Combo c{.fsdp = fsdp, .cp = cp, .zero = zero, .microbatches = 1, .checkpoint = checkpoint};
      std::vector<Run5d> runs(std::size_t(c.ranks()));
      auto failures = on_ranks(c.ranks(), [&](CommPtr world, auto) { runs[std::size_t(world->rank())] = run_5d<TP>(world, c); });
      REQUIRE(failures.empty());
      // The largest rank's (rank 0's shards are the largest under torch.chunk).
      peaks.push_back({runs.front(), zero});
    }
    const Run5d& z3 = peaks[0].run;
    INFO("fsdp " << fsdp << ", cp " << cp << (checkpoint ? ", activation checkpointing" : "") << ": psi " << z3.psi
                  << ", adjacent pair " << z3.adjacent_pair());
    if (!checkpoint) total_without_checkpointing[{fsdp, cp}] = z3.peak_total;
    else CHECK(z3.peak_total < total_without_checkpointing.at({fsdp, cp}));  // the activations, smaller
    REQUIRE_FALSE(z3.kept_gathered);
    const double n = fsdp * cp;  // N' = the ranks of the shard group
    double shards = 0;
    for (double e : z3.unit_elements) shards += e / n;
    // On the ledger the master shard is optimizer state (ZeRO's K = 12 in fp32: master + 2 moments).
    const double params_formula = S * z3.adjacent_pair();
    const double grads_formula = S * (shards + z3.adjacent_pair());
    CHECK(double(z3.peak_parameters) <= 1.05 * params_formula);
    CHECK(double(z3.peak_parameters) >= 0.95 * params_formula);
    CHECK(double(z3.peak_gradients) <= 1.05 * grads_formula);
    CHECK(double(z3.peak_gradients) >= 0.95 * S * z3.adjacent_pair());
    CHECK(double(z3.peak_optimizer) <= 1.05 * 3 * S * shards);
    CHECK(double(z3.peak_optimizer) >= 0.95 * 3 * S * shards);
    // The whole model is never resident on a rank during the step (it was, before: 221.6 MiB
    // against 182.2 for ZeRO-3 at N = 2 in issue 40's table).
    CHECK(double(z3.peak_parameters) < S * z3.psi);
    // ZeRO-2 keeps the full values (S Psi) and only two units' full gradients; ZeRO-1 every full gradient too.
    const Run5d& z2 = peaks[1].run;
    const Run5d& z1 = peaks[2].run;
    CHECK(double(z2.peak_parameters) >= S * z2.psi);
    CHECK(double(z2.peak_gradients) <= 1.05 * grads_formula);
    CHECK(double(z1.peak_gradients) >= S * z1.psi);
    // Where the formulas say so by more than 5 % of ZeRO-2's states: ZeRO-3's states are
    // S (P + Psi/N + P + 3 Psi/N) (with its separate master), ZeRO-2's S (Psi + Psi/N + P + 2 Psi/N):
    // ZeRO-3 saves when P + Psi/N < Psi (not at fsdp 2 of this 3-unit model, where P is half of it).
    const double pair = z3.adjacent_pair(), psi = z3.psi;
    const double states3 = 2 * pair + 4 * psi / n, states2 = psi + pair + 3 * psi / n;
    if (states3 < 0.95 * states2) CHECK(z3.peak_total < z2.peak_total);
    CHECK(z2.peak_total < z1.peak_total);
    // And ZeRO-1 < DDP: the same ranks replicating every state ("dp", nothing sharded).
    if (cp == 1 && !checkpoint) {
      const Combo ddp{.dp = fsdp, .zero = 1, .microbatches = 1};
      std::vector<Run5d> runs(std::size_t(ddp.ranks()));
      auto failures = on_ranks(ddp.ranks(), [&](CommPtr world, auto) { runs[std::size_t(world->rank())] = run_5d<TP>(world, ddp); });
      REQUIRE(failures.empty());
      INFO("DDP over " << fsdp << " ranks: step peak " << runs.front().peak_total << " B, ZeRO-1's " << z1.peak_total << " B");
      CHECK(z1.peak_total < runs.front().peak_total);
    }
  }
  // bf16 values with FSDP's mixed precision (float master values, gradient shards and AdamW
  // moments; docs/fsdp.md): parameters 2 P bytes, gradients at most 2 P + 4 Psi/N (the units'
  // bf16 gradients and the float shards), optimizer state 12 Psi/N (master + two moments).
  for (int fsdp : {4, 3}) {
    const Combo c{.fsdp = fsdp, .zero = 3, .microbatches = 1};
    std::vector<Run5d> runs(std::size_t(c.ranks()));
    auto failures = on_ranks(c.ranks(), [&](CommPtr world, auto) {
      runs[std::size_t(world->rank())] = dtensor::testing::run_5d<TP, false, dtensor::host_space, dtensor::bfloat16, float>(world, c);
    });
    REQUIRE(failures.empty());
    const Run5d& r = runs.front();
    double shards = 0;
    for (double e : r.unit_elements) shards += e / fsdp;
    INFO("bf16, fsdp " << fsdp << ": psi " << r.psi << ", adjacent pair " << r.adjacent_pair() << "; peaks: parameters "
                       << r.peak_parameters << " B, gradients " << r.peak_gradients << " B, optimizer " << r.peak_optimizer << " B");
    CHECK(double(r.peak_parameters) <= 1.05 * 2 * r.adjacent_pair());
    CHECK(double(r.peak_parameters) >= 0.95 * 2 * r.adjacent_pair());
    CHECK(double(r.peak_gradients) <= 1.05 * (2 * r.adjacent_pair() + 4 * shards));
    CHECK(double(r.peak_gradients) >= 0.95 * 2 * r.adjacent_pair());
    CHECK(double(r.peak_optimizer) <= 1.05 * 12 * shards);
    CHECK(double(r.peak_optimizer) >= 0.95 * 12 * shards);
    CHECK(double(r.peak_parameters) < 2 * r.psi);  // never the whole model
  }
  // A pipeline stage kept gathered holds its whole stage; resharded per micro-batch it does not.
  for (bool reshard : {true, false}) {
    const Combo c{.pp = 2, .fsdp = 2, .microbatches = 2, .reshard_after_forward = reshard};
    std::vector<Run5d> runs(std::size_t(c.ranks()));
    auto failures = on_ranks(c.ranks(), [&](CommPtr world, auto) { runs[std::size_t(world->rank())] = run_5d<TP>(world, c); });
    REQUIRE(failures.empty());
    for (const Run5d& r : runs) {
      INFO("reshard_after_forward " << reshard << ": parameters peak " << r.peak_parameters << " B, stage psi " << r.psi);
      CHECK(r.kept_gathered == !reshard);
      if (reshard) CHECK(double(r.peak_parameters) <= 1.05 * S * r.adjacent_pair());
      else CHECK(double(r.peak_parameters) >= S * r.psi);
    }
  }
}

}  // namespace test_5d_parity
