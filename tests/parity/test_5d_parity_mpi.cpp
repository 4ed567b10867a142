// The 5-D trainer's loop under MPI, 8 processes, against the one-rank runs every process also
// trains on its own (a communicator of one rank split from the world): the five — PP 2 x FSDP 2
// x TP 2 + SP x EP 2 with MoE blocks — the dense PP 2 x FSDP 2 x CP 2 (ring), and MoE under CP:
// PP 2 x FSDP 2 x CP 2 x EP 4 (the expert ranks over fsdp x cp; the aux loss summed over "cp").
#include <catch2/catch.hpp>

#include "mpi_check.hpp"
#include "sharded_pipeline_parity.hpp"

using namespace dtensor;
using namespace dtensor::testing;

TEST_CASE("5-D parity under MPI: PP x FSDP x TP + SP x EP, PP x FSDP x CP, PP x FSDP x CP x EP", "[mpi][parity][5d]") {
  auto world = mpi::world();
  DTENSOR_MPI_REQUIRE(world->size() == 8);
  const auto moe = run_5d<parallel::MegatronPlan<true>, true>(world, {.pp = 2, .fsdp = 2, .tp = 2, .ep = 2, .microbatches = 2});
  DTENSOR_MPI_CHECK(compare_losses(moe.losses, moe_reference(world->split(world->rank(), 0)), 1e-5).empty());
  const auto dense = run_5d<parallel::MegatronPlan<false>>(world, {.pp = 2, .fsdp = 2, .cp = 2});
  DTENSOR_MPI_CHECK(compare_losses(dense.losses, dense_reference(world->split(world->rank(), 0)), 1e-5).empty());
  const auto moe_cp = run_5d<parallel::MegatronPlan<false>, true>(world, {.pp = 2, .fsdp = 2, .cp = 2, .ep = 4, .microbatches = 2});
  DTENSOR_MPI_CHECK(compare_losses(moe_cp.losses, moe_reference(world->split(world->rank(), 0)), 1e-5).empty());
}
