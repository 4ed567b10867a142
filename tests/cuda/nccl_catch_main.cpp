// The Catch2 main of the NCCL tests, run under mpirun (or alone: MPI singleton). Every rank runs
// the [nogpu] cases; then, unless every rank sees a GPU, all ranks print the skip line and exit
// with the skip code together (cuda_skip.hpp), so that no rank waits for another in NCCL.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_args.hpp"
#include "support/test_defaults.hpp"
#include <vector>

#include "cuda_skip.hpp"
#include "dtensor/comm/mpi.hpp"

int main(int argc, char** argv) {
  if (dtensor::testing::only_lists(argc, argv)) return Catch::Session().run(argc, argv);
  dtensor::mpi::Environment env(argc, argv);
  dtensor::testing::use_test_defaults();
  int mine = dtensor::testing::visible_devices(), least = 0;
  MPI_Allreduce(&mine, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (least > 0) return Catch::Session().run(argc, argv);
  std::vector<char*> args(argv, argv + argc);
  char tag[] = "[nogpu]";
  args.push_back(tag);
  Catch::Session session;
  if (const int rc = session.applyCommandLine(int(args.size()), args.data()); rc != 0) return rc;
  if (const int failed = session.run(); failed != 0) return failed;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) return dtensor::testing::skipped(argv[0]);
  return dtensor::testing::skip_code;
}
