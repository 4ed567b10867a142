// GPT training parity under MPI: DP=2 x TP=2 (+SP) on 4 processes against the one-rank run that
// every process also trains on its own (a communicator of one rank split from the world).
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"
#include "mpi_check.hpp"

using namespace dtensor;
using namespace dtensor::testing;

TEST_CASE("GPT parity under MPI: DP=2 x TP=2 and DP=2 x TP=2 + SP", "[mpi][parity]") {
  auto world = mpi::world();
  DTENSOR_MPI_REQUIRE(world->size() == 4);
  const auto ref = run_parity<nn::ReplicatedPlan>(world->split(world->rank(), 0), {1, 1}).losses;
  const auto tp = run_parity<parallel::MegatronPlan<false>>(world, {2, 2});
  DTENSOR_MPI_CHECK(compare_losses(tp.losses, ref, 1e-5).empty());
  DTENSOR_MPI_CHECK(tp.model == expected_model_counts(true, false, 2));
  const auto sp = run_parity<parallel::MegatronPlan<true>>(world, {2, 2});
  DTENSOR_MPI_CHECK(compare_losses(sp.losses, ref, 1e-5).empty());
  DTENSOR_MPI_CHECK(sp.model == expected_model_counts(true, true, 2));
  DTENSOR_MPI_CHECK(sp.dp_sync == Counts{{"all_reduce/dp", sp.dp_buckets}});
}
