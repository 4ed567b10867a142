// tests/packaging/smoke_check.hpp — the distributed check that every packaging consumer runs
// (plain headers, find_package, add_subdirectory, FetchContent, the vcpkg port, the Conan
// test_package), on whatever communicator its main() hands it: the threads backend
// (smoke.cpp) or MPI under mpirun (mpi_smoke.cpp).
//
// It is a real program, not a link test: a 2 x (n/2) mesh (1 x n for an odd n), a 9 x 7 tensor
// (uneven on every mesh size up to 8) distributed as (Shard<0>, Shard<1>), each local piece
// checked against its box of the full tensor, then redistributed to (Replicate, Shard<0>)
// (an all-gather and an all-to-all) and gathered back: the result must equal the full tensor
// bit for bit. All ranks agree on the verdict before returning it, so every rank exits alike.
#pragma once

#include <cstdio>
#include <span>
#include <string>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/mesh/device_mesh.hpp"

namespace dtensor_smoke {

/// Runs the check on `world`; returns the number of ranks that saw a wrong value (the same
/// number on every rank) and prints each failure with its rank.
inline int check(dtensor::CommPtr world, const char* backend) {
  using namespace dtensor;
  const int n = world->size();
  const int rows = n % 2 == 0 ? 2 : 1;
  DeviceMesh<"dp", "tp"> mesh(world, {rows, n / rows});

  const auto full = arange<float>(Shape<2>{9, 7});
  auto x = distribute<Layout<Shard<0>, Shard<1>>>(mesh, full);

  std::string failed;
  const auto box = x.local_box();
  auto expect = Tensor<float, 2>::uninitialized(box.extent);
  copy_box(full, box.offset, expect, Shape<2>{}, box.extent);
  if (!equal(x.to_local(), expect)) failed += " distribute(Shard<0>, Shard<1>) gave the wrong local piece;";

  auto y = redistribute<Layout<Replicate, Shard<0>>>(x);
  const auto back = full_tensor(y);
  if (!equal(back, full)) failed += " full_tensor(redistribute<(Replicate, Shard<0>)>(x)) differs from the tensor;";

  if (!failed.empty()) std::printf("dtensor smoke (%s): rank %d:%s\n", backend, world->rank(), failed.c_str());
  int bad = failed.empty() ? 0 : 1;
  world->all_reduce(std::span<int>(&bad, 1), ReduceOp::sum);
  if (world->rank() == 0)
    std::printf("dtensor smoke (%s): %d ranks, %dx%d mesh, Shard(0),Shard(1) -> Replicate,Shard(0) -> full: %s\n",
                backend, n, rows, n / rows, bad == 0 ? "ok" : "FAILED");
  return bad;
}

}  // namespace dtensor_smoke
