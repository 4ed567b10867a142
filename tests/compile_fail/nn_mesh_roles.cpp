// A module given a mesh with a dimension whose role it does not handle must NOT compile, and
// the diagnostic must name the dimension and its role (nn/module.hpp require_roles; see
// CMakeLists.txt). Case 3 asks the mesh for a dimension it does not have: the diagnostic names
// it and the valid ones. Case 0 is the control: the same module on a ("dp", "tp") mesh compiles.
#include "dtensor/comm/threads.hpp"
#include "dtensor/nn/linear.hpp"

using namespace dtensor;

#ifndef DTENSOR_COMPILE_FAIL_CASE
#define DTENSOR_COMPILE_FAIL_CASE 0
#endif

#if DTENSOR_COMPILE_FAIL_CASE == 0
using Mesh = DeviceMesh<"dp", "tp">;  // data and tensor: handled
#elif DTENSOR_COMPILE_FAIL_CASE == 1
using Mesh = DeviceMesh<"pp", "dp", "tp">;  // pipeline: a dense module is one stage's, never split over "pp"
#elif DTENSOR_COMPILE_FAIL_CASE == 2
using Mesh = DeviceMesh<"dp", "rows">;  // a name without a conventional role and no mesh_roles
#elif DTENSOR_COMPILE_FAIL_CASE == 3
using Mesh = DeviceMesh<"dp", "tp">;  // valid for the module, but asked for a dimension it does not have
#endif

int main() {
  threads::run(1, [](CommPtr world) {
    std::array<int, Mesh::ndim> shape{};
    shape.fill(1);
    Mesh mesh(world, shape);
    nn::Linear<float, Mesh> fc("fc", mesh, 4, 4, 1);
    (void)fc;
#if DTENSOR_COMPILE_FAIL_CASE == 3
    (void)mesh.size<"pp">();  // the diagnostic lists "dp" and "tp"
#endif
  });
  return 0;
}
