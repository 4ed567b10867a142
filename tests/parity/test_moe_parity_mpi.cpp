// MoE GPT training parity under MPI: EP=2 on 2 processes against the one-rank run that every
// process also trains on its own (a communicator of one rank split from the world).
#include <catch2/catch.hpp>

#include "moe_parity.hpp"
#include "mpi_check.hpp"

using namespace dtensor;
using namespace dtensor::testing;

TEST_CASE("MoE GPT parity under MPI: EP=2 (E=4, k=2)", "[mpi][parity][moe]") {
  auto world = mpi::world();
  DTENSOR_MPI_REQUIRE(world->size() == 2);
  const auto mc = moe_parity_config(4, 2, 1);
  const auto ref = run_moe_parity<nn::ReplicatedPlan>(world->split(world->rank(), 0), {1, 1}, 1, mc).losses;
  const auto ep = run_moe_parity<nn::ReplicatedPlan>(world, {2, 1}, 2, mc);
  DTENSOR_MPI_CHECK(compare_losses(ep.losses, ref, 1e-5).empty());
  const std::size_t layers = std::size_t(parity_config().layers);
  DTENSOR_MPI_CHECK(ep.model.at("all_to_all/ep") == layers && ep.model.at("all_to_all_v/ep") == 4 * layers);
}
