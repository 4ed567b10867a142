// The Catch2 main of the NCCL tests, run under mpirun (or alone: MPI singleton). Every rank runs
// the [nogpu] cases; then, unless every rank sees a GPU, all ranks print the skip line and exit
// with the skip code together (cuda_skip.hpp), so that no rank waits for another in NCCL.
// Catch's implementation is tests/catch_session.cpp's (dtensor_catch_session).
#include "support/catch_args.hpp"
#include "support/catch_session.hpp"
#include "support/test_defaults.hpp"

#include "cuda_skip.hpp"
#include "dtensor/comm/mpi.hpp"

int main(int argc, char** argv) {
  if (dtensor::testing::only_lists(argc, argv)) return dtensor::testing::run_catch(argc, argv);
  dtensor::mpi::Environment env(argc, argv);
  dtensor::testing::use_test_defaults();
  int mine = dtensor::testing::visible_devices(), least = 0;
  MPI_Allreduce(&mine, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (least > 0) return dtensor::testing::run_catch(argc, argv);
  if (const int failed = dtensor::testing::run_catch_selecting(argc, argv, "[nogpu]"); failed != 0) return failed;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) return dtensor::testing::skipped(argv[0]);
  return dtensor::testing::skip_code;
}
