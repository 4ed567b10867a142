// Pipeline training parity under MPI: PP = 2 x TP = 2 (+SP) on 4 processes, 1F1B and ZB-V with 4
// micro-batches, against the one-rank run every process also trains on its own (a communicator
// of one rank split from the world); the activations held per action are the validator's count.
#include <catch2/catch.hpp>

#include "mpi_check.hpp"
#include "pipeline_parity.hpp"

using namespace dtensor;
using namespace dtensor::testing;
namespace pp = dtensor::parallel::pipeline;

TEST_CASE("pipeline parity under MPI: PP=2 x TP=2", "[mpi][parity][pipeline]") {
  auto world = mpi::world();
  DTENSOR_MPI_REQUIRE(world->size() == 4);
  const auto ref = pipeline_reference(world->split(world->rank(), 0));
  const auto one_f_one_b = run_pipeline_parity<parallel::MegatronPlan<false>>(world, {.pp = 2, .dp = 1, .tp = 2},
                                                                             pp::ScheduleKind::one_f_one_b, 4);
  DTENSOR_MPI_CHECK(compare_losses(one_f_one_b.losses, ref, 1e-5).empty());
  DTENSOR_MPI_CHECK(one_f_one_b.first.saved_after == one_f_one_b.memory.saved[std::size_t(one_f_one_b.pipeline_rank)]);
  const auto zbv = run_pipeline_parity<parallel::MegatronPlan<true>>(world, {.pp = 2, .dp = 1, .tp = 2},
                                                                     pp::ScheduleKind::zero_bubble_v, 4);
  DTENSOR_MPI_CHECK(compare_losses(zbv.losses, ref, 1e-5).empty());
  DTENSOR_MPI_CHECK(zbv.first.weight_pending_after == zbv.memory.weight_pending[std::size_t(zbv.pipeline_rank)]);
}
