// Ranks that disagree about their setup, detected at setup in every build type (whatever the
// collective check's switch): a pipeline executor built with another schedule or micro-batch
// count, a MoE layer built with another top-k or capacity. Every rank throws the same Error,
// naming the setting and which ranks hold which value — before any step moves data.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/parallel/moe.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_agreement {

using namespace dtensor;
using namespace dtensor::hardening;
using Catch::Contains;
namespace pp = dtensor::parallel::pipeline;

namespace {
using PipelineMesh = DeviceMesh<"pp", "dp", "tp">;
using StageMesh = DeviceMesh<"dp", "tp">;
using Model = models::GptParts<float, StageMesh, nn::ReplicatedPlan>;
using Stage = pp::Stage<Model>;

/// Builds an executor on 4 ranks (pp 2 x dp 2), each rank with the schedule `schedule_of(rank)`,
/// under the collective check `check`; each rank's outcome.
template <class ScheduleOf>
std::vector<Outcome> build_pipelines(bool check, ScheduleOf schedule_of) {
  return outcomes(4, [&](CommPtr world) {
    world->set_check_collectives(check);
    world->set_timeout(long_timeout);
    PipelineMesh mesh(world, {2, 2, 1});
    const StageMesh stage_mesh = pp::stage_mesh_of(mesh);
    const models::GPTConfig cfg{.vocab = 11, .seq = 4, .dim = 8, .heads = 2, .layers = 2, .mlp_ratio = 2, .seed = 3};
    const pp::Schedule schedule = schedule_of(world->rank());
    std::vector<Stage> stages = pp::split(Model(stage_mesh, cfg), schedule.layout, mesh.coordinate(0));
    pp::Executor<Stage, PipelineMesh> exec(mesh, schedule, std::move(stages));
  });
}
}  // namespace

TEST_CASE("pipeline ranks given different micro-batch counts or schedules fail at setup", "[hardening][agreement]") {
  for (bool check : {false, true}) {
    INFO("collective check " << check);
    const Stopwatch clock;
    auto out = build_pipelines(check, [](int rank) {
      return pp::make_schedule(pp::ScheduleKind::one_f_one_b, 2, rank == 1 ? 8 : 4);
    });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << out[std::size_t(r)].message);
      CHECK(out[std::size_t(r)].is_error);
      CHECK_THAT(out[std::size_t(r)].message, Contains("pipeline::Executor") && Contains("different settings") &&
                                                  Contains("micro-batches: ranks 0, 2, 3 '4'; rank 1 '8'"));
    }
    out = build_pipelines(check, [](int rank) {
      return pp::make_schedule(rank == 2 ? pp::ScheduleKind::gpipe : pp::ScheduleKind::one_f_one_b, 2, 4);
    });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << out[std::size_t(r)].message);
      CHECK(out[std::size_t(r)].is_error);
      CHECK_THAT(out[std::size_t(r)].message, Contains("schedule (actions): ranks 0, 1, 3") && Contains("; rank 2 '"));
      CHECK_THAT(out[std::size_t(r)].message, !Contains("micro-batches:"));
    }
    CHECK(clock.elapsed() < prompt);
  }
  // The same schedule everywhere builds.
  for (const auto& o : build_pipelines(false, [](int) { return pp::make_schedule(pp::ScheduleKind::gpipe, 2, 4); })) {
    INFO(o.message);
    CHECK_FALSE(o.threw);
  }
}

TEST_CASE("MoE ranks given a different top-k or capacity fail at setup", "[hardening][agreement]") {
  using EMesh = DeviceMesh<"edp", "ep", "tp">;
  auto build = [](bool check, auto config_of) {
    return outcomes(4, [&](CommPtr world) {
      world->set_check_collectives(check);
      world->set_timeout(long_timeout);
      StageMesh dense(world, {4, 1});
      auto emesh = parallel::make_expert_mesh<EMesh>(dense, 2);
      nn::MoE<float, StageMesh, EMesh> moe("h.0.moe", dense, emesh, config_of(world->rank()), 5);
    });
  };
  auto config = [](Extent topk, std::optional<double> capacity) {
    return nn::MoEConfig{.dim = 6, .hidden = 8, .router = {.experts = 4, .topk = topk, .capacity_factor = capacity}};
  };
  for (bool check : {false, true}) {
    INFO("collective check " << check);
    auto out = build(check, [&](int rank) { return config(rank == 3 ? 1 : 2, 1.25); });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << out[std::size_t(r)].message);
      CHECK(out[std::size_t(r)].is_error);
      CHECK_THAT(out[std::size_t(r)].message,
                 Contains("nn::MoE") && Contains("top-k: ranks 0, 1, 2 '2'; rank 3 '1'") && !Contains("capacity"));
    }
    out = build(check, [&](int rank) { return config(2, rank == 0 ? std::optional<double>{} : 1.25); });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << out[std::size_t(r)].message);
      CHECK(out[std::size_t(r)].is_error);
      CHECK_THAT(out[std::size_t(r)].message, Contains("capacity factor: rank 0 'none'; ranks 1, 2, 3 '1.25'"));
    }
  }
  for (const auto& o : build(false, [&](int) { return config(2, 1.25); })) {
    INFO(o.message);
    CHECK_FALSE(o.threw);
  }
}

TEST_CASE("ranks building meshes of different shapes are told that the mesh differs", "[hardening][agreement]") {
  const Stopwatch clock;
  auto out = outcomes(4, [](CommPtr world) {
    world->set_timeout(long_timeout);
    world->set_check_collectives(false);
    StageMesh mesh(world, world->rank() == 3 ? std::array<int, 2>{4, 1} : std::array<int, 2>{2, 2});
  });
  CHECK(clock.elapsed() < prompt);
  int named = 0;
  for (const auto& o : out) {
    INFO(o.message);
    CHECK(o.is_error);
    named += o.message.find("expected a group of") != std::string::npos &&
             o.message.find("the ranks disagree about the mesh") != std::string::npos;
  }
  CHECK(named >= 1);  // the rank that found it; the others are released naming it
}

}  // namespace hardening_agreement
