// tests/parity/parity_5d_runs.cpp — the 5-D parity runs and their one-rank references, compiled
// once for the threads suite (test_5d_parity) and the MPI one (test_5d_parity_mpi): see the
// explicit instantiation declarations at the end of sharded_pipeline_parity.hpp.
#include <catch2/catch.hpp>  // the runs REQUIRE what they set up (moe_parity.hpp)

#include "sharded_pipeline_parity.hpp"

namespace dtensor::testing {

std::vector<double> dense_reference(CommPtr one_rank) {
  return run_parity<nn::ReplicatedPlan>(std::move(one_rank), {1, 1}, {.batch = batch_5d, .layers = layers_5d}).losses;
}

std::vector<double> moe_reference(CommPtr one_rank, Extent experts) {
  return run_moe_parity<nn::ReplicatedPlan>(std::move(one_rank), {1, 1}, 1, moe_config(experts)).losses;
}

template Run5d run_5d<parallel::MegatronPlan<false>, false>(CommPtr, const Combo&);
template Run5d run_5d<parallel::MegatronPlan<true>, false>(CommPtr, const Combo&);
template Run5d run_5d<parallel::MegatronPlan<false>, true>(CommPtr, const Combo&);
template Run5d run_5d<parallel::MegatronPlan<true>, true>(CommPtr, const Combo&);
template Run5d run_5d<parallel::MegatronPlan<false>, false, host_space, bfloat16, float>(CommPtr, const Combo&);

}  // namespace dtensor::testing
