// bench_comm_mpi — dtensor's MPI Communicator against the raw MPI calls, same buffers, same run.
//
//   mpirun -n 4 bench_comm_mpi [--benchmark_filter=all_reduce] [--benchmark_format=json]
//
// For each collective and size (1 KiB .. 64 MiB, nccl-tests' "size": the larger of one rank's
// input and output, in float32) three variants run one after the other:
//   dtensor   world->all_gather(...)    (issued non-blocking, waited on with the timeout poll)
//   mpi       MPI_Allgather(...)        the raw blocking call
//   mpi_nb    MPI_Iallgather + MPI_Wait the raw call dtensor makes, so dtensor/mpi_nb is the
//                                       library's own overhead and mpi_nb/mpi the cost of
//                                       issuing every operation non-blocking (for timeouts)
#include <mpi.h>

#include <span>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "dtensor/comm/mpi.hpp"

namespace {

using dtensor::CollectiveKind;
using dtensor::ReduceOp;

enum class Variant { dtensor, mpi, mpi_nb };
constexpr const char* variant_name[] = {"dtensor", "mpi", "mpi_nb"};

dtensor::CommPtr& world() {
  static dtensor::CommPtr w;
  return w;
}

void wait(MPI_Request& r) { MPI_Wait(&r, MPI_STATUS_IGNORE); }

/// One benchmark: `bytes` is nccl-tests' size, split into per-rank blocks of float32.
void run(benchmark::State& st, CollectiveKind kind, Variant v, std::size_t bytes) {
  auto& w = *world();
  const int n = w.size();
  const MPI_Comm comm = MPI_COMM_WORLD;
  // all_reduce moves `bytes` per rank in and out; the others a block of bytes / n per peer.
  const std::size_t total = bytes / sizeof(float);
  const std::size_t block = kind == CollectiveKind::all_reduce ? total : std::max<std::size_t>(1, total / n);
  const std::size_t big = kind == CollectiveKind::all_reduce ? total : block * std::size_t(n);
  std::vector<float> a(big, 1.0f), b(big, 0.0f);
  const int c = int(block);
  MPI_Request r;
  std::span<const float> in(a);
  std::span<float> out(b);

  dtensor::bench::Timer t;
  switch (kind) {
    case CollectiveKind::all_gather:
      t = dtensor::bench::mpi_time(st, comm, [&] {
        if (v == Variant::dtensor) w.all_gather(in.first(block), out);
        else if (v == Variant::mpi) MPI_Allgather(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm);
        else MPI_Iallgather(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm, &r), wait(r);
      });
      break;
    case CollectiveKind::reduce_scatter:
      t = dtensor::bench::mpi_time(st, comm, [&] {
        if (v == Variant::dtensor) w.reduce_scatter(in, out.first(block), ReduceOp::sum);
        else if (v == Variant::mpi) MPI_Reduce_scatter_block(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm);
        else MPI_Ireduce_scatter_block(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm, &r), wait(r);
      });
      break;
    case CollectiveKind::all_reduce:
      t = dtensor::bench::mpi_time(st, comm, [&] {
        if (v == Variant::dtensor) w.all_reduce(in, out, ReduceOp::sum);
        else if (v == Variant::mpi) MPI_Allreduce(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm);
        else MPI_Iallreduce(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm, &r), wait(r);
      });
      break;
    default:  // all_to_all
      t = dtensor::bench::mpi_time(st, comm, [&] {
        if (v == Variant::dtensor) w.all_to_all(in, out);
        else if (v == Variant::mpi) MPI_Alltoall(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm);
        else MPI_Ialltoall(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm, &r), wait(r);
      });
      break;
  }
  dtensor::bench::set_bandwidth(st, big * sizeof(float), dtensor::bench::bus_factor(kind, n), t);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::mpi::Environment env(argc, argv);
  world() = dtensor::mpi::world();
  // Sizes outer, variants inner: the three variants of a size run back to back, under the
  // same conditions on a shared machine.
  for (CollectiveKind k : {CollectiveKind::all_gather, CollectiveKind::reduce_scatter, CollectiveKind::all_reduce,
                           CollectiveKind::all_to_all})
    for (std::size_t bytes : dtensor::bench::sizes())
      for (Variant v : {Variant::dtensor, Variant::mpi, Variant::mpi_nb}) {
        const std::string name = std::string(dtensor::name_of(k)) + "/" + variant_name[int(v)] + "/" +
                                 dtensor::bench::size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, k, v, bytes); })
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond)
            ->Iterations(dtensor::bench::iterations_for(bytes));
      }
  const int rc = dtensor::bench::mpi_main(argc, argv);
  world().reset();  // before MPI_Finalize
  return rc;
}
