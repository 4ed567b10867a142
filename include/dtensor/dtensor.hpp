// dtensor/dtensor.hpp — the whole library for the host memory space and the threads backend.
//
//   #include <dtensor/dtensor.hpp>
//   dtensor::threads::run(8, [](dtensor::CommPtr world) {
//     dtensor::DeviceMesh<"dp", "tp"> mesh(world, {2, 4});
//     auto x = dtensor::distribute<dtensor::Layout<dtensor::Shard<0>, dtensor::Replicate>>(mesh, full);
//     auto y = dtensor::redistribute<dtensor::Layout<dtensor::Replicate, dtensor::Shard<1>>>(x);
//   });
//
// Backends that need more than the standard library have their own headers:
// dtensor/comm/mpi.hpp (Boost.MPI), and the CUDA / NCCL headers (.cuh). Ops, modules,
// optimizers and the parallel styles: dtensor/training.hpp.
#pragma once

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/communicator.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/placement/layout.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/distributed/plan.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/cross_mesh.hpp"
#include "dtensor/distributed/transfer.hpp"
#include "dtensor/distributed/visualize.hpp"
