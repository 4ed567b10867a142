// dtensor/mesh/cuda_mesh.cuh — the mesh whose tensors live in GPU memory.
//
//   cuda_threads::run(4, [](CommPtr world) {            // or the NCCL communicator under mpirun
//     CudaMesh<"dp", "tp"> mesh(world, {2, 2});
//     models::GPT<float, CudaMesh<"dp", "tp">, parallel::MegatronPlan<true>> model(mesh, cfg);   // on the GPU
//   });
//
// BasicDeviceMesh<cuda_space, Names...> (mesh/device_mesh.hpp): every DTensor on it defaults to
// cuda_space, so model code written against `Mesh` runs on the GPU when given this mesh. Its
// communicator must move device memory: comm/cuda_threads.cuh or comm/nccl.cuh.
#pragma once

#include "dtensor/core/cuda_space.cuh"
#include "dtensor/mesh/device_mesh.hpp"

namespace dtensor {

template <fixed_string... Names>
using CudaMesh = BasicDeviceMesh<cuda_space, Names...>;

}  // namespace dtensor
