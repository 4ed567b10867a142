// bench_redistribute_threads — dtensor's redistributions on the threads backend against the raw
// collective each issues, on the same bytes, in the same run.
//
//   bench_redistribute_threads [--benchmark_filter=all_gather] [--benchmark_format=json]
//
// On the 1-d mesh of 2 and 4 ranks (threads of this process), each one-collective step kind:
//   all_gather      Shard<0>     -> Replicate   world->all_gather
//   all_reduce      Partial<sum> -> Replicate   world->all_reduce
//   reduce_scatter  Partial<sum> -> Shard<0>    world->reduce_scatter
//   all_to_all      Shard<0>     -> Shard<1>    world->all_to_all
// at 1 KiB .. 64 MiB (nccl-tests' size: the larger of one rank's input and output, float32),
// in three variants that run back to back for each size:
//   raw            the communicator's blocking call on preallocated buffers
//   redistribute   auto y = redistribute<To>(x): a new result each time (its allocation, the
//                  plan's copies, the collective)
//   into           redistribute_into(y, x): the result's storage reused
// And redistribute_to between two meshes of 2 ranks each over a world of 4 (source root ranks
// {0, 1}, destination {2, 3}; docs/cross-mesh.md), against raw point-to-point messages of the
// plan's pattern and sizes on preallocated buffers (what the plan would cost with nothing around it):
//   cross_mesh/same      Shard<0> -> Shard<0>   one message per destination: its whole piece
//   cross_mesh/reshard   Shard<0> -> Shard<1>   two per destination, packed and unpacked
// where "bytes" is the whole tensor's (what crosses from one mesh to the other), each variant
//   raw              async sends and receives of the plan's messages, then waits
//   redistribute_to  redistribute_to / redistribute_from: the agreement (2 x 3 small messages),
//                    the plan, the packing, a new result each time, the messages
// Every variant is timed the same way: ranks meet at a barrier, run one operation, and the
// iteration's time is the slowest rank's. The tensor is [rows, cols] with cols = min(1024,
// elements / ranks), so every shard is even; Shard<0> -> Shard<1> packs each rank's columns
// into blocks (the received blocks land in place), which the raw all-to-all does not do.
#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench_threads.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/dtensor.hpp"

namespace {

using dtensor::CollectiveKind;
using Mesh = dtensor::DeviceMesh<"x">;
using S0 = dtensor::Layout<dtensor::Shard<0>>;
using S1 = dtensor::Layout<dtensor::Shard<1>>;
using R = dtensor::Layout<dtensor::Replicate>;
using P = dtensor::Layout<dtensor::Partial<>>;

enum class Variant { raw, redistribute, into };
constexpr const char* variant_name[] = {"raw", "redistribute", "into"};


dtensor::Shape<2> global_shape(std::size_t elements, int n) {
  const std::size_t cols = std::max<std::size_t>(1, std::min<std::size_t>(1024, elements / std::size_t(n)));
  return {dtensor::Extent(elements / cols), dtensor::Extent(cols)};
}

/// The operation of one variant of a From -> To redistribution on this rank.
template <class From, class To>
std::function<void()> redistribution(const dtensor::CommPtr& w, int n, const dtensor::Shape<2>& global, Variant v) {
  const Mesh mesh(w, {n});
  const auto box = dtensor::local_box(From::desc, mesh.shape(), mesh.coordinate(), global);
  auto x = dtensor::from_local<From>(mesh, dtensor::arange<float>(box.extent), global);
  if (v == Variant::redistribute)
    return [x] {
      auto y = dtensor::redistribute<To>(x);
      benchmark::DoNotOptimize(y.to_local().data());
    };
  return [x, y = dtensor::redistribute<To>(x)]() mutable {
    dtensor::redistribute_into(y, x);
    benchmark::DoNotOptimize(y.to_local().data());
  };
}

void run(benchmark::State& st, int n, CollectiveKind kind, Variant v, std::size_t bytes) {
  const std::size_t per_rank = bytes / sizeof(float);
  const std::size_t elements = kind == CollectiveKind::all_to_all ? per_rank * std::size_t(n) : per_rank;
  const auto global = global_shape(elements, n);
  const std::size_t block = elements / std::size_t(n);
  const auto iters = std::size_t(dtensor::bench::iterations_for(bytes));
  std::vector<double> times = dtensor::bench::times_on_ranks(n, iters, [&](const dtensor::CommPtr& w) -> std::function<void()> {
    if (v != Variant::raw) {
      switch (kind) {
        case CollectiveKind::all_gather: return redistribution<S0, R>(w, n, global, v);
        case CollectiveKind::all_reduce: return redistribution<P, R>(w, n, global, v);
        case CollectiveKind::reduce_scatter: return redistribution<P, S0>(w, n, global, v);
        default: return redistribution<S0, S1>(w, n, global, v);
      }
    }
    const std::size_t in = kind == CollectiveKind::all_gather ? block : per_rank;
    const std::size_t out = kind == CollectiveKind::reduce_scatter ? block : per_rank;
    return [w, kind, a = std::vector<float>(in, 1.0f), b = std::vector<float>(out)]() mutable {
      const std::span<const float> send(a);
      const std::span<float> recv(b);
      switch (kind) {
        case CollectiveKind::all_gather: w->all_gather(send, recv); break;
        case CollectiveKind::all_reduce: w->all_reduce(send, recv, dtensor::ReduceOp::sum); break;
        case CollectiveKind::reduce_scatter: w->reduce_scatter(send, recv, dtensor::ReduceOp::sum); break;
        default: w->all_to_all(send, recv); break;
      }
    };
  });
  const dtensor::bench::Timer t = dtensor::bench::replay(st, times);
  dtensor::bench::set_bandwidth(st, bytes, dtensor::bench::bus_factor(kind, n), t);
}

/// redistribute_to from Shard<0> on root ranks {0, 1} to DstL on {2, 3}, or the raw messages of its plan.
template <class DstL>
void run_cross(benchmark::State& st, bool raw, std::size_t bytes) {
  const auto global = global_shape(bytes / sizeof(float), 2);
  const dtensor::MeshRanks<1> src{{2}, {0, 1}}, dst{{2}, {2, 3}};
  const auto iters = std::size_t(dtensor::bench::iterations_for(bytes));
  std::vector<double> times = dtensor::bench::times_on_ranks(4, iters, [&](const dtensor::CommPtr& w) -> std::function<void()> {
    const auto sm = dtensor::mesh_on_ranks<Mesh>(w, src.shape, src.root_ranks);
    const auto dm = dtensor::mesh_on_ranks<Mesh>(w, dst.shape, dst.root_ranks);
    if (raw) {
      const auto plan = dtensor::plan_cross_mesh(S0::desc, src, DstL::desc, dst, global, sizeof(float));
      std::vector<std::pair<int, std::vector<float>>> sends, recvs;
      for (const auto& m : plan.moves) {
        if (m.src == w->rank()) sends.push_back({m.dst, std::vector<float>(m.bytes / sizeof(float), 1.0f)});
        if (m.dst == w->rank()) recvs.push_back({m.src, std::vector<float>(m.bytes / sizeof(float))});
      }
      return [w, sends = std::move(sends), recvs = std::move(recvs)]() mutable {
        std::vector<dtensor::Work> works;
        for (auto& r : recvs) works.push_back(w->recv_async(std::span<float>(r.second), r.first));
        for (const auto& s : sends) works.push_back(w->send_async(std::span<const float>(s.second), s.first));
        for (auto& k : works) k.wait();
      };
    }
    if (sm) {
      const auto box = dtensor::local_box(S0::desc, sm->shape(), sm->coordinate(), global);
      auto x = dtensor::from_local<S0>(*sm, dtensor::arange<float>(box.extent), global);
      return [x, dst] { dtensor::redistribute_to<DstL>(x, dst); };
    }
    return [m = *dm, src, global] {
      auto y = dtensor::redistribute_from<S0, DstL, float>(src, m, global);
      benchmark::DoNotOptimize(y.to_local().data());
    };
  });
  const dtensor::bench::Timer t = dtensor::bench::replay(st, times);
  dtensor::bench::set_bandwidth(st, bytes, 1.0, t);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::bench::reuse_freed_memory();
  for (int n : {2, 4})
    for (CollectiveKind k : {CollectiveKind::all_gather, CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                             CollectiveKind::all_to_all})
      for (std::size_t bytes : dtensor::bench::sizes())
        for (Variant v : {Variant::raw, Variant::redistribute, Variant::into}) {
          const std::string name = std::string(dtensor::name_of(k)) + "/" + variant_name[int(v)] + "/ranks:" +
                                   std::to_string(n) + "/" + dtensor::bench::size_name(bytes);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, n, k, v, bytes); })
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond)
              ->Iterations(dtensor::bench::iterations_for(bytes));
        }
  for (bool reshard : {false, true})
    for (std::size_t bytes : dtensor::bench::sizes())
      for (bool raw : {true, false}) {
        const std::string name = std::string("cross_mesh/") + (reshard ? "reshard" : "same") + "/" +
                                 (raw ? "raw" : "redistribute_to") + "/ranks:2+2/" + dtensor::bench::size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
          if (reshard) run_cross<S1>(st, raw, bytes);
          else run_cross<S0>(st, raw, bytes);
        })->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(dtensor::bench::iterations_for(bytes));
      }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
