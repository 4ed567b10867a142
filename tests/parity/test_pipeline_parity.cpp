// Pipeline training parity on the threads backend: every schedule (GPipe, 1F1B, interleaved 1F1B
// with 2 stages per rank, ZB-H1, ZB-V; DualPipeV within 1e-12) on PP = 2 and PP = 4 with M = 4 and 8 micro-batches, and
// PP = 2 x DP = 2 x TP = 2 (+SP) on 8 threads, trained 20 steps, give the per-step losses of the
// one-rank run within 1e-5 relative (double). On the same runs: the activations each rank holds
// after each action equal the validator's count, and the idle fraction the executor counts is
// the simulator's and the formula's; the allocation ledger's activation peak per rank follows
// the validator's count of micro-batches held. Bad input is a clear error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <unistd.h>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pipeline_parity.hpp"
#include "dtensor/nn/classification_loss.hpp"
#include "dtensor/nn/mlp.hpp"
#include "dtensor/ops/reduce.hpp"
#include "dtensor/ops/shape.hpp"
#include "dtensor/nn/stack.hpp"
#include "dtensor/checkpoint/pipeline_state.hpp"
#include "dtensor/nn/param_groups.hpp"
#include "dtensor/ops/pointwise.hpp"
#include "dtensor/optim/param_set.hpp"
#include "dtensor/parallel/moe.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "support/on_ranks.hpp"
#include "support/scratch_dir.hpp"

// This file's own namespace: the parity test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_pipeline_parity {

using namespace dtensor;
using namespace dtensor::testing;
namespace pp = dtensor::parallel::pipeline;

namespace {

const std::vector<double>& reference() {
  static const std::vector<double> ref = [] {
    std::vector<double> losses;
    threads::run(1, [&](CommPtr w) { losses = pipeline_reference(w); });
    return losses;
  }();
  return ref;
}

/// The bubble formula of a schedule with F = I = W = 1 (docs/pipeline.md), where it is exact.
std::optional<double> formula(pp::ScheduleKind kind, int p, int m) {
  switch (kind) {
    case pp::ScheduleKind::gpipe:
    case pp::ScheduleKind::one_f_one_b: return double(p - 1) / double(m + p - 1);
    case pp::ScheduleKind::interleaved: return double(p - 1) / double(2 * m + p - 1);
    case pp::ScheduleKind::zero_bubble_h1:
      if (m >= p) return double(p - 1) / double(3 * m + p - 1);
      return std::nullopt;
    case pp::ScheduleKind::zero_bubble_v:
    case pp::ScheduleKind::dual_pipe_v:  // DualPipeV refuses m < 2p
      if (m >= 2 * p) return double(p - 1) / double(6 * m + p - 1);
      return std::nullopt;
  }
  return std::nullopt;
}

template <class Plan = nn::ReplicatedPlan>
void check_pipeline(const std::string& name, PipelineShape shape, int microbatches, double rtol = 1e-5) {
  const auto& ref = reference();
  const auto kind = pp::parse_schedule_kind(name);
  auto failures = on_ranks(shape.pp * shape.dp * shape.tp, [&](CommPtr world, auto report) {
    auto run = run_pipeline_parity<Plan>(world, shape, kind, microbatches);
    report(compare_losses(run.losses, ref, rtol));
    // Memory: what the stages hold after every action is the validator's count.
    const auto rank = std::size_t(run.pipeline_rank);
    if (run.first.saved_after != run.memory.saved[rank])
      report("activations held per action differ from the validator's (peak " + std::to_string(run.first.peak_saved()) +
             " vs " + std::to_string(run.memory.peak_saved[rank]) + ")");
    if (run.first.weight_pending_after != run.memory.weight_pending[rank])
      report("weight contexts held per action differ from the validator's");
    // Bubble: the counted idle fraction against the simulator and the formula, within 5%.
    const double simulated = pp::simulate(run.schedule).bubble();
    if (std::abs(run.bubble - simulated) > 0.05 * simulated)
      report("bubble " + std::to_string(run.bubble) + ", simulated " + std::to_string(simulated));
    if (auto expected = formula(kind, shape.pp, microbatches); expected && std::abs(run.bubble - *expected) > 0.05 * *expected)
      report("bubble " + std::to_string(run.bubble) + ", formula " + std::to_string(*expected));
  });
  INFO(name << " pp " << shape.pp << " dp " << shape.dp << " tp " << shape.tp << " M " << microbatches << ": "
            << summary(failures));
  REQUIRE(failures.empty());
}

}  // namespace

TEST_CASE("pipeline parity: the reference run trains", "[parity][pipeline]") {
  const auto& ref = reference();
  REQUIRE(ref.size() == std::size_t(parity_steps));
  REQUIRE(ref.back() < ref.front() - 0.3);
}

TEST_CASE("pipeline parity: every schedule, PP = 2 and 4, M = 4 and 8", "[parity][pipeline]") {
  for (const char* name : {"gpipe", "1f1b", "interleaved", "zb", "zbv"})
    for (int p : {2, 4})
      for (int m : {4, 8}) check_pipeline(name, {.pp = p}, m);
}

TEST_CASE("pipeline parity: DualPipeV, PP = 2 and 4, and inside TP, losses within 1e-12", "[parity][pipeline]") {
  // PyTorch's ScheduleDualPipeV order (m >= 2p), its overlapped F;B pairs run one after the other.
  check_pipeline("dualpipev", {.pp = 2}, 4, 1e-12);
  check_pipeline("dualpipev", {.pp = 2}, 8, 1e-12);
  check_pipeline("dualpipev", {.pp = 4}, 8, 1e-12);
  check_pipeline<parallel::MegatronPlan<true>>("dualpipev", {.pp = 2, .dp = 1, .tp = 2}, 4, 1e-12);
}

TEST_CASE("pipeline parity: PP = 2 x DP = 2 x TP = 2 on 8 threads", "[parity][pipeline]") {
  check_pipeline<parallel::MegatronPlan<false>>("1f1b", {.pp = 2, .dp = 2, .tp = 2}, 4);
  check_pipeline<parallel::MegatronPlan<true>>("zbv", {.pp = 2, .dp = 2, .tp = 2}, 4);
  // Micro-batches of one sequence: one data-parallel rank of each stage holds none.
  check_pipeline<parallel::MegatronPlan<true>>("interleaved", {.pp = 2, .dp = 2, .tp = 2}, 8);
}

TEST_CASE("pipeline memory: the ledger's activation peak is the validator's count of micro-batches held",
          "[parity][pipeline][memory]") {
  // On each pipeline rank, peak activation bytes = held x S + T, with S the bytes one micro-batch
  // leaves saved on that rank's stage and T what one forward or backward allocates on top. GPipe
  // holds all M micro-batches, so two GPipe runs (M = 4 and 8, one sequence per micro-batch, so
  // that S is the same) give S and T; 1F1B, holding p - rank (the validator's peak_saved), must
  // then land on the same line, up to the tensors in flight between the stages at the peak (a
  // received activation, a gradient going back: 3 to 5 KB here, depending on the threads'
  // timing) — within S / 2, so one micro-batch more or less held would show.
  // (ZB-H1 also keeps weight contexts for its deferred W: another term, not on this line.)
  const PipelineShape shape{.pp = 2};
  const auto peaks = [&](const char* name, int m) {
    std::vector<std::pair<int, std::int64_t>> held_and_peak(2);
    threads::run(2, [&](CommPtr world) {
      auto run = run_pipeline_parity<nn::ReplicatedPlan>(world, shape, pp::parse_schedule_kind(name), m, 0, 1, m);
      const auto r = std::size_t(run.pipeline_rank);
      held_and_peak[r] = {run.memory.peak_saved[r], run.activation_peak};
    });
    return held_and_peak;
  };
  const auto gpipe4 = peaks("gpipe", 4), gpipe8 = peaks("gpipe", 8), one_f_one_b = peaks("1f1b", 8);
  const std::int64_t received = parity_config().seq * parity_config().dim * std::int64_t(sizeof(double));
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("pipeline rank " << r);
    REQUIRE(gpipe4[r].first == 4);
    REQUIRE(gpipe8[r].first == 8);
    REQUIRE(one_f_one_b[r].first == 2 - int(r));
    const std::int64_t per_microbatch = (gpipe8[r].second - gpipe4[r].second) / 4;
    const std::int64_t transient = gpipe4[r].second - 4 * per_microbatch;
    CHECK(per_microbatch > 4 * received);
    const std::int64_t predicted = one_f_one_b[r].first * per_microbatch + transient;
    INFO("S = " << per_microbatch << " B, T = " << transient << " B");
    CHECK(std::abs(one_f_one_b[r].second - predicted) < per_microbatch / 2);
  }
}

TEST_CASE("activation offload through a pipeline: 1F1B and interleaved with 4 micro-batches, each one's saved state on "
          "disk, bit for bit", "[parity][pipeline][offload]") {
  // Each micro-batch's saved state holds its own tickets, so the micro-batches a stage holds at
  // once (1F1B: p - rank of them) are all on disk together: the tier's peak is held x blocks x
  // one block's bytes (the formula of docs/offload.md: 17 b·s·h elements + (4 + a) doubles per
  // token, b = 2 sequences a micro-batch). The losses are the in-memory run's exactly.
  ScratchDir dir("act-offload-pp");
  const PipelineShape shape{.pp = 2};
  const auto cfg = parity_config();
  const Extent b = pipeline_batch / 4;
  const auto block = std::int64_t(17 * b * cfg.seq * cfg.dim * 8 + b * cfg.seq * (4 + cfg.heads) * 8);
  for (const char* name : {"1f1b", "interleaved"}) {
    const auto kind = pp::parse_schedule_kind(name);
    std::vector<PipelineRun> memory(2), disk(2);
    threads::run(2, [&](CommPtr world) {
      auto a = run_pipeline_parity<nn::ReplicatedPlan>(world, shape, kind, 4, 0, 3);
      auto d = run_pipeline_parity<nn::ReplicatedPlan>(world, shape, kind, 4, 0, 3, pipeline_batch,
                                                       nn::ActivationOffloadOptions{.dir = dir.path.string()});
      memory[std::size_t(a.pipeline_rank)] = std::move(a);
      disk[std::size_t(d.pipeline_rank)] = std::move(d);
    });
    for (std::size_t r = 0; r < 2; ++r) {
      INFO(name << " pipeline rank " << r);
      CHECK(disk[r].losses == memory[r].losses);
      CHECK(compare_losses(disk[r].losses, std::vector<double>(reference().begin(), reference().begin() + 3), 1e-5) == "");
      const auto held = std::int64_t(disk[r].memory.peak_saved[r]);
      CAPTURE(held, disk[r].blocks_here, block, disk[r].offload_peak, memory[r].activation_peak, disk[r].activation_peak);
      if (kind == pp::ScheduleKind::one_f_one_b)  // one stage a rank: every micro-batch held has its blocks
        CHECK(disk[r].offload_peak == held * std::int64_t(disk[r].blocks_here) * block);
      CHECK(disk[r].offload_peak > 0);
      CHECK(disk[r].activation_peak < memory[r].activation_peak);
      CHECK(disk[r].offload.entries == 3 * 4 * disk[r].blocks_here);
      CHECK(disk[r].offload.bytes_written == std::size_t(3 * 4 * std::int64_t(disk[r].blocks_here) * block));
    }
  }
  CHECK(dir.files() == 0);
}

TEST_CASE("pipeline: bad input is a clear error", "[pipeline]") {
  using Model = models::GptParts<double, GptMesh>;
  using Stage = pp::Stage<Model>;
  SECTION("more stages than layers") {
    REQUIRE_THROWS_WITH(pp::stage_layers(2, 4), Catch::Contains("cannot split 2 layers into 4 pipeline stages"));
    threads::run(1, [](CommPtr w) {
      GptMesh mesh(w, {1, 1});
      auto cfg = parity_config();  // 2 layers
      REQUIRE_THROWS_WITH(pp::split(Model(mesh, cfg), pp::StageLayout::looped(3), 0),
                          Catch::Contains("cannot split 2 layers into 3"));
    });
  }
  SECTION("uneven layer counts") {
    const auto layers = pp::stage_layers(9, 4);
    REQUIRE(layers == std::vector<std::pair<Extent, Extent>>{{0, 3}, {3, 5}, {5, 7}, {7, 9}});
  }
  SECTION("micro-batches that do not divide the batch") {
    threads::run(1, [](CommPtr w) {
      GptMesh mesh(w, {1, 1});
      auto [ids, targets] = parity_tokens(0, parity_config(), 6);
      REQUIRE_THROWS_WITH(pp::split_microbatches<Stage::Input>(mesh, ids, targets, 4),
                          Catch::Contains("4 micro-batches do not divide the batch [6, "));
    });
  }
  SECTION("a pipeline size that does not divide the ranks") {
    REQUIRE_THROWS_WITH(pp::pipeline_mesh_shape(6, 4, 1), Catch::Contains("--pp 4"));
    REQUIRE_THROWS_WITH(pp::pipeline_mesh_shape(8, 2, 3), Catch::Contains("--tp 3"));
    REQUIRE(pp::pipeline_mesh_shape(8, 2, 2) == std::array<int, 3>{2, 2, 2});
  }
  SECTION("a schedule for another number of pipeline ranks") {
    threads::run(2, [](CommPtr w) {
      PipelineMesh mesh(w, {2, 1, 1});
      auto stages = pp::split(Model(pp::stage_mesh_of(mesh), parity_config()), pp::StageLayout::looped(2), mesh.coordinate(0));
      REQUIRE_THROWS_WITH((pp::Executor<Stage, PipelineMesh>(mesh, pp::one_f_one_b(4, 4), std::move(stages))),
                          Catch::Contains("the schedule is for 4 pipeline ranks"));
    });
  }
  SECTION("a broken schedule is rejected before it runs") {
    threads::run(2, [](CommPtr w) {
      PipelineMesh mesh(w, {2, 1, 1});
      auto stages = pp::split(Model(pp::stage_mesh_of(mesh), parity_config()), pp::StageLayout::looped(2), mesh.coordinate(0));
      auto broken = pp::one_f_one_b(2, 2);
      std::erase(broken.actions[0], pp::parse_action("0SEND_F1"));
      REQUIRE_THROWS_WITH((pp::Executor<Stage, PipelineMesh>(mesh, broken, std::move(stages))),
                          Catch::Contains("1RECV_F1"));
    });
  }
}

// ---------------------------------------------------------------- a model that is not a GPT

namespace {

/// A toy classifier, written only against the public API as a user would: features [B, S, F]
/// -> Linear -> MLP blocks -> mean over S -> Linear -> logits [B, C], cross-entropy against
/// labels [B]. Its parts (nn::LayeredModel) are all pipeline::split needs; no stage code.
template <MeshType Mesh>
class ToyHead {  // the epilogue: mean-pool over the set, then the classifier
 public:
  using Fc = nn::Linear<double, Mesh>;
  using In = typename Fc::In;
  using Out = typename nn::ClassificationCrossEntropy<double, Mesh>::Logits;
  struct Saved {
    In x;
    typename Fc::Saved fc;
    typename Fc::Out y;
  };
  using WeightCtx = typename Fc::WeightCtx;

  explicit ToyHead(Fc fc) : fc_(std::move(fc)) {}
  nn::Fwd<Out, Saved> forward(const In& x) const {
    auto [y, fs] = fc_.forward(ops::mean<1>(x));  // [B, 1, C]
    auto logits = ops::reshape<typename Out::layout>(y, Shape<2>{y.extent(0), y.extent(2)});
    return {std::move(logits), Saved{x, std::move(fs), std::move(y)}};
  }
  nn::Bwd<In, WeightCtx> backward_input(Saved s, const Out& dlogits) const {
    auto [dpooled, w] = fc_.backward_input(std::move(s.fc), ops::reshape_backward(dlogits, s.y));
    return {ops::mean_backward<1>(dpooled, s.x), std::move(w)};
  }
  void backward_weight(WeightCtx w) { fc_.backward_weight(std::move(w)); }
  auto children() { return std::tie(fc_); }

 private:
  Fc fc_;
};

template <MeshType Mesh>
class ToyClassifier {
 public:
  using Input = typename nn::Linear<double, Mesh>::In;  // [B, S, F]
  using Target = typename nn::ClassificationCrossEntropy<double, Mesh>::Labels;
  static constexpr Extent features = 5, dim = 6, classes = 7, blocks = 5;

  explicit ToyClassifier(const Mesh& mesh) : mesh_(mesh) {}
  const Mesh& mesh() const { return mesh_; }
  Extent block_count() const { return blocks; }
  nn::Linear<double, Mesh> make_prologue() const { return {"in", mesh_, features, dim, 1, {.init_std = 0.4}}; }
  nn::MLP<double, Mesh> make_block(Extent i) const {
    return {"block" + std::to_string(i), mesh_, dim, 2 * dim, 10 + 2 * std::uint64_t(i), 0.4, 0.4};
  }
  ToyHead<Mesh> make_epilogue() const { return ToyHead<Mesh>({"out", mesh_, dim, classes, 3, {.init_std = 0.4}}); }
  nn::ClassificationCrossEntropy<double, Mesh> make_loss() const { return {}; }
  Shape<3> activation_shape(const Input& x) const { return {x.extent(0), x.extent(1), dim}; }

 private:
  Mesh mesh_;
};

constexpr Extent toy_batch = 12, toy_set = 3;
constexpr int toy_steps = 3;

std::pair<Tensor<double, 3>, Tensor<std::int32_t, 1>> toy_batch_of(int step) {
  using Toy = ToyClassifier<GptMesh>;
  return {normal<double>(Shape<3>{toy_batch, toy_set, Toy::features}, 500 + std::uint64_t(step)),
          randint<std::int32_t>(Shape<1>{toy_batch}, 600 + std::uint64_t(step), 0, Toy::classes)};
}

struct ToyRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;  // this rank's parameters after the run, by name
};

template <class Model>
void record_params(Model& m, ToyRun& run) {
  nn::for_each_parameter(m, [&](auto& p) {
    if (!p.defined()) return;
    const auto whole = full_tensor(p.value());
    run.params[p.name()] = std::vector<double>(whole.data(), whole.data() + whole.numel());
  });
}

/// The one-rank oracle: the whole model (nn::Stack over every part), the whole batch.
const ToyRun& toy_reference() {
  static const ToyRun ref = [] {
    ToyRun run;
    threads::run(1, [&](CommPtr w) {
      GptMesh mesh(w, {1, 1});
      using Toy = ToyClassifier<GptMesh>;
      Toy toy(mesh);
      nn::Stack<Toy> model(toy, nn::Stack<Toy>::all(toy));
      nn::ParamList<double, 2> ps;
      nn::collect(model, ps);
      optim::AdamW<double, 2> opt(ps, parity_adamw());
      for (int step = 0; step < toy_steps; ++step) {
        auto [x, labels] = toy_batch_of(step);
        opt.zero_grad();
        auto [out, saved] = model.forward(std::nullopt, distribute_replicated<Toy::Input::layout>(mesh, x),
                                          distribute_replicated<Toy::Target::layout>(mesh, labels));
        run.losses.push_back(full_tensor(*out.loss)[0]);
        model.backward(std::move(saved), std::nullopt, 1.0);
        parallel::DataParallel<GptMesh>(mesh).all_reduce_gradients(ps);  // the one-rank "dp"'s pending Partial
        optim::clip_grad_norm(ps, mesh, 1.0);
        opt.step();
      }
      record_params(model, run);
    });
    return run;
  }();
  return ref;
}

/// The toy classifier split into stages and run by a schedule on (pp = 2, dp = 2): 12 samples in
/// 4 micro-batches of 3, each split 2 + 1 over "dp"; 5 blocks over 2 or 4 stages (uneven).
void check_toy_pipeline(const std::string& name, std::vector<Extent> blocks_per_stage = {}) {
  const ToyRun& ref = toy_reference();
  auto failures = on_ranks(4, [&](CommPtr world, auto report) {
    PipelineMesh mesh(world, {2, 2, 1});
    const GptMesh stage_mesh = pp::stage_mesh_of(mesh);
    using Toy = ToyClassifier<GptMesh>;
    auto schedule = pp::make_schedule(pp::parse_schedule_kind(name), 2, 4);
    auto stages = blocks_per_stage.empty()
                      ? pp::split(Toy(stage_mesh), schedule.layout, mesh.coordinate(0))
                      : pp::split(Toy(stage_mesh), schedule.layout, mesh.coordinate(0),
                                  pp::stage_layers(Toy::blocks, blocks_per_stage));
    pp::Executor exec(mesh, schedule, std::move(stages));
    nn::ParamList<double, 2> ps;
    for (auto& stage : exec.stages()) nn::collect(stage, ps);
    optim::AdamW<double, 2> opt(ps, parity_adamw());
    parallel::DataParallel<GptMesh> ddp(stage_mesh);
    ToyRun run;
    for (int step = 0; step < toy_steps; ++step) {
      auto [x, labels] = toy_batch_of(step);
      opt.zero_grad();
      auto stats = exec.step(pp::split_microbatches<Toy::Input, Toy::Target>(stage_mesh, x, labels, 4));
      ddp.all_reduce_gradients(ps);
      pp::clip_grad_norm(ps, stage_mesh, mesh.group(0), 1.0);
      opt.step();
      double loss = stats.loss.value_or(-1e300);
      mesh.group(0).all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
      run.losses.push_back(loss);
    }
    for (auto& stage : exec.stages()) record_params(stage, run);
    report(compare_losses(run.losses, ref.losses, 1e-12));
    std::size_t compared = 0;
    for (const auto& [param, values] : run.params) {
      const auto& expected = ref.params.at(param);
      double worst = 0;
      for (std::size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(values[i] - expected[i]));
      if (values.size() != expected.size() || worst > 1e-12) report(param + " differs from the one-rank run by " + std::to_string(worst));
      ++compared;
    }
    if (compared == 0) report("this rank holds no parameters");
  });
  REQUIRE(failures.empty());
}

}  // namespace

TEST_CASE("pipeline split of a non-GPT model: 1F1B, interleaved, ZB-H1, ZB-V, DualPipeV against one rank", "[pipeline][split]") {
  SECTION("1F1B, blocks 3 + 2") { check_toy_pipeline("1f1b"); }
  SECTION("1F1B, blocks 1 + 4 given") { check_toy_pipeline("1f1b", {1, 4}); }
  SECTION("interleaved, 4 stages, the first holding the input layer alone") { check_toy_pipeline("interleaved", {0, 2, 2, 1}); }
  SECTION("ZB-H1") { check_toy_pipeline("zb"); }
  SECTION("ZB-V, 4 stages (2 + 1 + 1 + 1)") { check_toy_pipeline("zbv"); }
  SECTION("DualPipeV, 4 stages (1 + 2 + 1 + 1)") { check_toy_pipeline("dualpipev", {1, 2, 1, 1}); }
}

// ------------------------------------------- a user's mixture of experts, on a second mesh

namespace {

using ToyPipeMesh = DeviceMesh<"pp", "dp", "fsdp", "tp">;
using ToyExperts = DeviceMesh<"edp", "ep", "tp">;

/// A user's MoE-ish layer: x + mixture(x), the mixture's experts on an expert mesh. Its members
/// are its own (no models::MoELayers, DenseOrMoE or expert_params): the library finds the experts
/// by the mesh their parameters live on, which the model declares (parameter_meshes()).
template <MeshType Mesh, MeshType EMesh>
class ToySwitch {
 public:
  using Mixture = nn::MoE<double, Mesh, EMesh>;
  using In = typename Mixture::In;
  using Out = In;
  using Saved = typename Mixture::Saved;
  using WeightCtx = typename Mixture::WeightCtx;

  ToySwitch(std::string name, Mixture mixture) : name_(std::move(name)), mixture_(std::move(mixture)) {}
  const std::string& name() const { return name_; }
  nn::Fwd<Out, Saved> forward(const In& x) const {
    auto [y, s] = mixture_.forward(x);
    return {ops::add(x, y), std::move(s)};
  }
  nn::Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    auto [dx, w] = mixture_.backward_input(std::move(s), dy);
    return {ops::add(dy, dx), std::move(w)};
  }
  void backward_weight(WeightCtx w) { mixture_.backward_weight(std::move(w)); }
  auto children() { return std::tie(mixture_); }

 private:
  std::string name_;
  Mixture mixture_;
};

/// The toy classifier with a ToySwitch in every block: 3 blocks, 4 experts top-2 (dropless; the
/// load-balancing and z losses on, collected by the library, not the model), the experts on `emesh`. `seed` moves every initial value (a wrong start
/// for the checkpoint round trip to overwrite).
template <MeshType Mesh, MeshType EMesh>
class ToyMixtureClassifier {
 public:
  using Input = typename nn::Linear<double, Mesh>::In;
  using Target = typename nn::ClassificationCrossEntropy<double, Mesh>::Labels;
  static constexpr Extent features = 5, dim = 6, classes = 7, blocks = 3, experts = 4;

  ToyMixtureClassifier(const Mesh& mesh, const EMesh& emesh, std::uint64_t seed = 0)
      : mesh_(mesh), emesh_(emesh), seed_(seed) {}
  const Mesh& mesh() const { return mesh_; }
  Extent block_count() const { return blocks; }
  nn::Linear<double, Mesh> make_prologue() const { return {"in", mesh_, features, dim, 1 + seed_, {.init_std = 0.4}}; }
  ToySwitch<Mesh, EMesh> make_block(Extent i) const {
    nn::MoEConfig c;
    c.dim = dim, c.hidden = 2 * dim;
    c.router.experts = experts, c.router.topk = 2, c.router.capacity_factor = std::nullopt;
    c.router.aux_loss_coeff = 0.01, c.router.z_loss_coeff = 1e-3;  // collected by the library (nn/aux_losses.hpp)
    c.init_std = 0.4, c.out_std = 0.4;
    const std::string name = "mix" + std::to_string(i);
    return {name, typename ToySwitch<Mesh, EMesh>::Mixture(name, mesh_, emesh_, c, 10 + 2 * std::uint64_t(i) + seed_)};
  }
  ToyHead<Mesh> make_epilogue() const { return ToyHead<Mesh>({"out", mesh_, dim, classes, 3 + seed_, {.init_std = 0.4}}); }
  nn::ClassificationCrossEntropy<double, Mesh> make_loss() const { return {}; }
  Shape<3> activation_shape(const Input& x) const { return {x.extent(0), x.extent(1), dim}; }
  /// The other mesh this model's parameters live on: the one declaration parameter groups need.
  std::tuple<nn::OnMesh<EMesh>> parameter_meshes() const { return {nn::on_mesh("bank", emesh_)}; }

 private:
  Mesh mesh_;
  EMesh emesh_;
  std::uint64_t seed_;
};

constexpr int mixture_steps = 4;

/// The one-rank oracle: the whole model, one optimizer and one clip over both meshes.
const std::vector<double>& toy_mixture_reference() {
  static const std::vector<double> ref = [] {
    std::vector<double> losses;
    threads::run(1, [&](CommPtr w) {
      GptMesh mesh(w, {1, 1});
      auto emesh = parallel::make_expert_mesh<ToyExperts>(mesh, 1);
      using Toy = ToyMixtureClassifier<GptMesh, ToyExperts>;
      Toy toy(mesh, emesh);
      nn::Stack<Toy> model(toy, nn::Stack<Toy>::all(toy));
      auto all = nn::parameter_set(model);
      if (all.list<1>().size() != 4 * std::size_t(Toy::blocks))  // every block's expert fc1/fc2 weights and biases
        throw std::runtime_error("nn::parameter_set: the experts are not a group of their own");
      auto opt = optim::make_adamw(all, parity_adamw());
      parallel::DataParallel<GptMesh> ddp(mesh);  // one rank: marks every group's gradients reduced
      ddp.attach(model);
      for (int step = 0; step < mixture_steps; ++step) {
        auto [x, labels] = toy_batch_of(step);
        opt.zero_grad();
        auto [out, saved] = model.forward(std::nullopt, distribute_replicated<Toy::Input::layout>(mesh, x),
                                          distribute_replicated<Toy::Target::layout>(mesh, labels));
        losses.push_back(full_tensor(*out.loss)[0]);
        model.backward(std::move(saved), std::nullopt, 1.0);
        ddp.finish_gradient_sync();
        optim::clip_grad_norm(all, 1.0);
        opt.step();
      }
    });
    return losses;
  }();
  return ref;
}

/// The toy without its declaration: its experts' mesh is neither the model's nor declared.
template <MeshType Mesh, MeshType EMesh>
struct UndeclaredToy : ToyMixtureClassifier<Mesh, EMesh> {
  using ToyMixtureClassifier<Mesh, EMesh>::ToyMixtureClassifier;
  void parameter_meshes() const = delete;
};

}  // namespace

TEST_CASE("pipeline: a parameter on a mesh the model does not declare is a clear error", "[pipeline][split][moe]") {
  threads::run(1, [&](CommPtr w) {
    GptMesh mesh(w, {1, 1});
    auto emesh = parallel::make_expert_mesh<ToyExperts>(mesh, 1);
    using U = UndeclaredToy<GptMesh, ToyExperts>;
    U toy(mesh, emesh);
    CHECK_THROWS_WITH(nn::Stack<U>(toy, nn::Stack<U>::all(toy)),
                      Catch::Contains("part mix0 has 4 parameters on a mesh that is neither the model's nor one it declares"));
  });
}

TEST_CASE("pipeline: a user's MoE layer (experts on a second mesh) through ShardedPipeline, one AdamW, one clip and a "
          "checkpoint round trip, against one rank",
          "[pipeline][split][moe]") {
  const auto& ref = toy_mixture_reference();
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor-toy-mixture-" + std::to_string(::getpid()));
  auto failures = on_ranks(4, [&](CommPtr world, auto report) {
    ToyPipeMesh mesh(world, {2, 1, 2, 1});  // pp 2 x fsdp 2 (ZeRO-3); the experts over ep 2
    const auto stage_mesh = pp::stage_mesh_of(mesh);
    using StageMesh = std::remove_cvref_t<decltype(stage_mesh)>;
    const auto emesh = parallel::make_expert_mesh<ToyExperts>(stage_mesh, 2);
    using Toy = ToyMixtureClassifier<StageMesh, ToyExperts>;
    using Run = pp::ShardedPipeline<pp::Stage<Toy>, ToyPipeMesh>;
    const auto schedule = pp::make_schedule(pp::ScheduleKind::one_f_one_b, 2, 4);
    auto make = [&](std::uint64_t seed) {
      return std::make_unique<Run>(mesh, schedule, pp::split(Toy(stage_mesh, emesh, seed), schedule.layout, mesh.coordinate(0)),
                                   parallel::FsdpOptions{.stage = 3});
    };
    // Trains steps [first, end) (the loss of each on every rank); saves after step `save_after`.
    auto train = [&](Run& run, auto& opt, int first, int end, int save_after) {
      std::vector<double> losses;
      for (int step = first; step < end; ++step) {
        auto [x, labels] = toy_batch_of(step);
        run.zero_grad();
        auto stats = run.step(pp::split_microbatches<Toy::Input, Toy::Target>(stage_mesh, x, labels, 4));
        run.clip_grad_norm(1.0);
        opt.step();
        run.sync_parameters();
        double loss = stats.loss.value_or(-1e300);
        mesh.group(0).all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
        losses.push_back(loss);
        if (step == save_after) checkpoint::save_pipeline_state(dir, run, opt, {.step = step + 1});
      }
      return losses;
    };

    auto run = make(0);
    // The experts are a group of their own, found by their mesh: one unit per block of this rank's stage.
    auto& stage = run->executor().stages().front();
    auto groups = nn::parameter_groups(stage);
    std::vector<std::string> names;
    for (auto& u : *std::get<1>(groups).units) names.push_back(u.group->name());
    const std::vector<std::string> expected =
        mesh.coordinate(0) == 0 ? std::vector<std::string>{"mix0.bank", "mix1.bank"} : std::vector<std::string>{"mix2.bank"};
    if (names != expected) report("the expert units are not one per block of the stage");
    if (run->params().template list<1>().size() != 4 * expected.size()) report("params() lacks the experts");
    auto opt = optim::make_adamw(run->params(), parity_adamw());
    const auto losses = train(*run, opt, 0, mixture_steps, 1);
    report(compare_losses(losses, ref, 1e-12));

    // Resume from the checkpoint after step 2 into a pipeline started elsewhere (other seeds):
    // the dense shards, the experts and both moments come back, so the last steps are the same.
    auto resumed = make(1000);
    auto opt2 = optim::make_adamw(resumed->params(), parity_adamw());
    const auto meta = checkpoint::load_pipeline_state(dir, *resumed, opt2, {});
    if (meta.step != 2) report("the checkpoint's step is " + std::to_string(meta.step));
    const auto tail = train(*resumed, opt2, 2, mixture_steps, -1);
    report(compare_losses(tail, std::vector<double>(ref.begin() + 2, ref.end()), 1e-12));
  });
  std::filesystem::remove_all(dir);
  REQUIRE(failures.empty());
}

TEST_CASE("pipeline split: bad input is a clear error", "[pipeline][split]") {
  REQUIRE_THROWS_WITH(pp::stage_layers(5, std::vector<Extent>{2, 0, 3}), Catch::Contains("stage 1 of 3 holds 0 blocks"));
  REQUIRE_THROWS_WITH(pp::stage_layers(5, std::vector<Extent>{2, 2}), Catch::Contains("sum to 4 over 2 stages; the model has 5"));
  threads::run(1, [](CommPtr w) {
    GptMesh mesh(w, {1, 1});
    using Toy = ToyClassifier<GptMesh>;
    REQUIRE_THROWS_WITH(pp::split(Toy(mesh), pp::StageLayout::looped(1, 2), 0, pp::stage_layers(5, std::vector<Extent>{5})),
                        Catch::Contains("1 block ranges for the layout's 2 stages"));
    Tensor<double, 3> x(Shape<3>{6, 2, 5});
    Tensor<std::int32_t, 1> labels(Shape<1>{5});
    REQUIRE_THROWS_WITH((pp::split_microbatches<Toy::Input, Toy::Target>(mesh, x, labels, 2)),
                        Catch::Contains("differ in their first extent"));
    REQUIRE_THROWS_WITH((pp::split_microbatches<Toy::Input>(mesh, x, 4)), Catch::Contains("4 micro-batches do not divide the batch [6, 2, 5]"));
    // A stage's protocol is checked: a forward twice, a backward without a forward.
    auto stages = pp::split(Toy(mesh), pp::StageLayout::looped(1), 0);
    auto mb = pp::split_microbatches<Toy::Input, Toy::Target>(mesh, x, Tensor<std::int32_t, 1>(Shape<1>{6}), 1);
    REQUIRE_FALSE(stages[0].forward(0, std::nullopt, mb[0].first, mb[0].second).has_value());  // one stage: the loss
    REQUIRE_THROWS_WITH(stages[0].forward(0, std::nullopt, mb[0].first, mb[0].second), Catch::Contains("already holds micro-batch 0"));
    REQUIRE_THROWS_WITH(stages[0].backward_input(1, std::nullopt, 1.0), Catch::Contains("holds no forward of micro-batch 1"));
  });
}

}  // namespace test_pipeline_parity
