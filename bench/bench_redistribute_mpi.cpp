// bench_redistribute_mpi — dtensor's redistribute<To>(x) on the MPI backend against the raw MPI
// collective it stands for, on the same bytes, in the same run.
//
//   mpirun -n 4 bench_redistribute_mpi [--benchmark_filter=all_gather] [--benchmark_format=json]
//
// On a 1-d mesh of all ranks, each of the four one-collective redistributions:
//   all_gather      Shard<0>     -> Replicate   (MPI_Allgather)
//   all_reduce      Partial<sum> -> Replicate   (MPI_Allreduce)
//   reduce_scatter  Partial<sum> -> Shard<0>    (MPI_Reduce_scatter_block)
//   all_to_all      Shard<0>     -> Shard<1>    (MPI_Alltoall)
// at 1 KiB .. 64 MiB (nccl-tests' size: the larger of one rank's input and output, float32),
// in four variants that run back to back for each size:
//   dtensor   auto y = redistribute<To>(x)   a new DTensor each time: the allocation of the
//                                            result, the plan's copies, the collective
//   into      redistribute_into(y, x)        the same into one result whose storage is reused
//   mpi       the raw blocking MPI call on preallocated buffers of the same sizes
//   mpi_nb    the raw non-blocking call + MPI_Wait (what dtensor issues, so that waits can
//             time out): dtensor/mpi_nb is the library's overhead, mpi_nb/mpi MPI's own
//             price of the non-blocking form.
// Freed memory is kept in the process (bench_util.hpp's reuse_freed_memory, as a caching
// allocator would); DTENSOR_BENCH_FRESH_PAGES=1 measures with glibc's defaults instead.
// The tensor is [rows, cols] with cols = min(1024, elements / ranks), so every shard is even.
// Shard<0> -> Shard<1> must also move each rank's columns into blocks (one packing copy of
// the local piece; the received blocks land in place), which the raw MPI_Alltoall does not do.
//
// And redistribute_to between two meshes (docs/cross-mesh.md): Shard<0> on the first half of the
// ranks (root ranks 0..n/2-1) to a mesh on the second half (n/2..n-1), against one raw
// MPI_Isend / MPI_Irecv per link of the plan, of the plan's sizes, on preallocated buffers,
// then MPI_Waitall (what the plan costs with nothing around it):
//   cross_mesh/same      Shard<0> -> Shard<0>   one message per destination: its whole piece
//   cross_mesh/reshard   Shard<0> -> Shard<1>   n/2 per destination, packed and unpacked
// where the size is the whole tensor's bytes (all of them cross from one mesh to the other):
//   raw              the plan's messages, raw
//   redistribute_to  redistribute_to / redistribute_from: the agreement (2 (n - 1) small
//                    messages), the plan, the packing, a new result each time, the messages
#include <mpi.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "dtensor/comm/mpi.hpp"
#include "dtensor/dtensor.hpp"

namespace {

using dtensor::CollectiveKind;
using Mesh = dtensor::DeviceMesh<"x">;
using S0 = dtensor::Layout<dtensor::Shard<0>>;
using S1 = dtensor::Layout<dtensor::Shard<1>>;
using R = dtensor::Layout<dtensor::Replicate>;
using P = dtensor::Layout<dtensor::Partial<>>;

enum class Variant { dtensor, into, mpi, mpi_nb };
constexpr const char* variant_name[] = {"dtensor", "into", "mpi", "mpi_nb"};

Mesh& mesh() {
  static Mesh m;
  return m;
}

/// The global shape for `elements` floats on n ranks: even shards along both dimensions.
dtensor::Shape<2> global_shape(std::size_t elements, int n) {
  const std::size_t cols = std::max<std::size_t>(1, std::min<std::size_t>(1024, elements / std::size_t(n)));
  return {dtensor::Extent(elements / cols), dtensor::Extent(cols)};
}

/// This rank's piece of a tensor of extents `global` in layout L (values do not matter).
template <class L>
auto input(const dtensor::Shape<2>& global) {
  const auto box = dtensor::local_box(L::desc, mesh().shape(), mesh().coordinate(), global);
  return dtensor::from_local<L>(mesh(), dtensor::arange<float>(box.extent), global);
}

/// Times redistribute<To> of x: a new result each iteration (dropped, as in a training step),
/// or with `into`, redistribute_into one result whose storage every iteration reuses.
template <class To, class X>
dtensor::bench::Timer time_redistribute(benchmark::State& st, const X& x, bool into) {
  if (into) {
    auto y = dtensor::redistribute<To>(x);
    return dtensor::bench::mpi_time(st, MPI_COMM_WORLD, [&] {
      dtensor::redistribute_into(y, x);
      benchmark::DoNotOptimize(y.to_local().data());
    });
  }
  return dtensor::bench::mpi_time(st, MPI_COMM_WORLD, [&] {
    auto y = dtensor::redistribute<To>(x);
    benchmark::DoNotOptimize(y.to_local().data());
  });
}

void run(benchmark::State& st, CollectiveKind kind, Variant v, std::size_t bytes) {
  const Mesh& m = mesh();
  const int n = m.size();
  const MPI_Comm comm = MPI_COMM_WORLD;
  const std::size_t per_rank = bytes / sizeof(float);  // the larger of input and output
  // Global elements: all_to_all's tensor is n times one rank's piece; the others' is `bytes`.
  const std::size_t elements = kind == CollectiveKind::all_to_all ? per_rank * std::size_t(n) : per_rank;
  const auto global = global_shape(elements, n);
  const std::size_t block = elements / std::size_t(n);  // one rank's share
  const int c = int(kind == CollectiveKind::all_reduce ? elements : kind == CollectiveKind::all_to_all ? block / std::size_t(n) : block);

  dtensor::bench::Timer t;
  if (v == Variant::dtensor || v == Variant::into) {
    const bool into = v == Variant::into;
    switch (kind) {
      case CollectiveKind::all_gather: t = time_redistribute<R>(st, input<S0>(global), into); break;
      case CollectiveKind::all_reduce: t = time_redistribute<R>(st, input<P>(global), into); break;
      case CollectiveKind::reduce_scatter: t = time_redistribute<S0>(st, input<P>(global), into); break;
      default: t = time_redistribute<S1>(st, input<S0>(global), into); break;
    }
  } else {
    std::vector<float> a(per_rank, 1.0f), b(per_rank, 0.0f);
    MPI_Request r;
    const bool nb = v == Variant::mpi_nb;
    auto wait = [&] { MPI_Wait(&r, MPI_STATUS_IGNORE); };
    t = dtensor::bench::mpi_time(st, comm, [&] {
      switch (kind) {
        case CollectiveKind::all_gather:
          if (nb) MPI_Iallgather(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm, &r), wait();
          else MPI_Allgather(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm);
          break;
        case CollectiveKind::all_reduce:
          if (nb) MPI_Iallreduce(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm, &r), wait();
          else MPI_Allreduce(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm);
          break;
        case CollectiveKind::reduce_scatter:
          if (nb) MPI_Ireduce_scatter_block(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm, &r), wait();
          else MPI_Reduce_scatter_block(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm);
          break;
        default:
          if (nb) MPI_Ialltoall(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm, &r), wait();
          else MPI_Alltoall(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm);
          break;
      }
    });
  }
  dtensor::bench::set_bandwidth(st, bytes, dtensor::bench::bus_factor(kind, n), t);
}

/// The two halves of the ranks, as meshes (each rank has one of them): made once, collectively.
struct CrossMeshes {
  dtensor::MeshRanks<1> src, dst;
  std::optional<Mesh> src_mesh, dst_mesh;
};
CrossMeshes& cross_meshes() {
  static CrossMeshes c;
  return c;
}

/// redistribute_to from Shard<0> on the first half of the ranks to DstL on the second half, or
/// the raw MPI messages of its plan. `bytes`: the whole tensor's.
template <class DstL>
void run_cross(benchmark::State& st, bool raw, std::size_t bytes) {
  const CrossMeshes& c = cross_meshes();
  const int half = int(c.src.root_ranks.size());
  const auto global = global_shape(bytes / sizeof(float), half);
  dtensor::bench::Timer t;
  if (raw) {
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const auto plan = dtensor::plan_cross_mesh(S0::desc, c.src, DstL::desc, c.dst, global, sizeof(float));
    std::vector<std::pair<int, std::vector<float>>> sends, recvs;
    for (const auto& m : plan.moves) {
      if (m.src == me) sends.push_back({m.dst, std::vector<float>(m.bytes / sizeof(float), 1.0f)});
      if (m.dst == me) recvs.push_back({m.src, std::vector<float>(m.bytes / sizeof(float))});
    }
    std::vector<MPI_Request> reqs(sends.size() + recvs.size());
    t = dtensor::bench::mpi_time(st, MPI_COMM_WORLD, [&] {
      std::size_t i = 0;
      for (auto& r : recvs)
        MPI_Irecv(r.second.data(), int(r.second.size()), MPI_FLOAT, r.first, 0, MPI_COMM_WORLD, &reqs[i++]);
      for (auto& s : sends)
        MPI_Isend(s.second.data(), int(s.second.size()), MPI_FLOAT, s.first, 0, MPI_COMM_WORLD, &reqs[i++]);
      MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
    });
  } else if (c.src_mesh) {
    const Mesh& m = *c.src_mesh;
    const auto box = dtensor::local_box(S0::desc, m.shape(), m.coordinate(), global);
    const auto x = dtensor::from_local<S0>(m, dtensor::arange<float>(box.extent), global);
    t = dtensor::bench::mpi_time(st, MPI_COMM_WORLD, [&] { dtensor::redistribute_to<DstL>(x, c.dst); });
  } else if (c.dst_mesh) {
    t = dtensor::bench::mpi_time(st, MPI_COMM_WORLD, [&] {
      auto y = dtensor::redistribute_from<S0, DstL, float>(c.src, *c.dst_mesh, global);
      benchmark::DoNotOptimize(y.to_local().data());
    });
  } else {  // the last of an odd number of ranks: in neither mesh, it only keeps time
    t = dtensor::bench::mpi_time(st, MPI_COMM_WORLD, [] {});
  }
  dtensor::bench::set_bandwidth(st, bytes, 1.0, t);
}

const char* transition(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_gather: return "S0_to_R";
    case CollectiveKind::all_reduce: return "P_to_R";
    case CollectiveKind::reduce_scatter: return "P_to_S0";
    default: return "S0_to_S1";
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::bench::reuse_freed_memory();
  dtensor::mpi::Environment env(argc, argv);
  {
    auto world = dtensor::mpi::world();
    mesh() = Mesh(world, {world->size()});
    const int n = world->size(), half = n / 2;
    if (n >= 2) {
      auto& c = cross_meshes();
      for (int r = 0; r < half; ++r) c.src.root_ranks.push_back(r);
      for (int r = half; r < 2 * half; ++r) c.dst.root_ranks.push_back(r);
      c.src.shape = {half};
      c.dst.shape = {half};
      c.src_mesh = dtensor::mesh_on_ranks<Mesh>(world, c.src.shape, c.src.root_ranks);
      c.dst_mesh = dtensor::mesh_on_ranks<Mesh>(world, c.dst.shape, c.dst.root_ranks);
    }
  }
  // Sizes outer, variants inner: the variants of one size run back to back, under the same
  // conditions on a shared machine.
  for (CollectiveKind k : {CollectiveKind::all_gather, CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                           CollectiveKind::all_to_all})
    for (std::size_t bytes : dtensor::bench::sizes())
      for (Variant v : {Variant::dtensor, Variant::into, Variant::mpi, Variant::mpi_nb}) {
        const std::string name = std::string(dtensor::name_of(k)) + "/" + transition(k) + "/" + variant_name[int(v)] +
                                 "/" + dtensor::bench::size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, k, v, bytes); })
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond)
            ->Iterations(dtensor::bench::iterations_for(bytes));
      }
  if (!cross_meshes().src.root_ranks.empty()) {
    const std::string ranks = std::to_string(cross_meshes().src.root_ranks.size()) + "+" +
                              std::to_string(cross_meshes().dst.root_ranks.size());
    for (bool reshard : {false, true})
      for (std::size_t bytes : dtensor::bench::sizes())
        for (bool raw : {true, false}) {
          const std::string name = std::string("cross_mesh/") + (reshard ? "reshard" : "same") + "/" +
                                   (raw ? "raw" : "redistribute_to") + "/ranks:" + ranks + "/" +
                                   dtensor::bench::size_name(bytes);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
            if (reshard) run_cross<S1>(st, raw, bytes);
            else run_cross<S0>(st, raw, bytes);
          })->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(dtensor::bench::iterations_for(bytes));
        }
  }
  const int rc = dtensor::bench::mpi_main(argc, argv);
  mesh() = Mesh();  // its communicators go before MPI_Finalize
  cross_meshes() = CrossMeshes();
  return rc;
}
