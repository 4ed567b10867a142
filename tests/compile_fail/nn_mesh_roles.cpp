// A module given a mesh with a dimension whose role it does not handle must NOT compile, and
// the diagnostic must name the dimension and its role (nn/module.hpp require_roles; see
// CMakeLists.txt). Case 3 asks the mesh for a dimension it does not have: the diagnostic names
// it and the valid ones. Case 0 is the control: the same module on a ("dp", "tp") mesh compiles.
// Case -1 compiles every failing case at once: CTest checks each one's diagnostic in that one
// compile's output (CMakeLists.txt).
#include "dtensor/comm/threads.hpp"
#include "dtensor/nn/linear.hpp"

using namespace dtensor;

#ifndef DTENSOR_COMPILE_FAIL_CASE
#define DTENSOR_COMPILE_FAIL_CASE 0
#endif
#define DTENSOR_FAIL_CASE(n) (DTENSOR_COMPILE_FAIL_CASE == (n) || DTENSOR_COMPILE_FAIL_CASE == -1)

namespace {
// A linear layer on a mesh of type Mesh, every dimension of size 1.
template <class Mesh>
void linear_on(CommPtr world) {
  std::array<int, Mesh::ndim> shape{};
  shape.fill(1);
  Mesh mesh(world, shape);
  nn::Linear<float, Mesh> fc("fc", mesh, 4, 4, 1);
  (void)fc;
}
}  // namespace

int main() {
  threads::run(1, [](CommPtr world) {
#if DTENSOR_COMPILE_FAIL_CASE == 0
    linear_on<DeviceMesh<"dp", "tp">>(world);  // data and tensor: handled
    DeviceMesh<"dp", "tp"> mesh(world, {1, 1});
    (void)mesh.size<"tp">();
#endif
#if DTENSOR_FAIL_CASE(1)
    linear_on<DeviceMesh<"pp", "dp", "tp">>(world);  // pipeline: a dense module is one stage's, never split over "pp"
#endif
#if DTENSOR_FAIL_CASE(2)
    linear_on<DeviceMesh<"dp", "rows">>(world);  // a name without a conventional role and no mesh_roles
#endif
#if DTENSOR_FAIL_CASE(3)
    {
      DeviceMesh<"dp", "tp"> mesh(world, {1, 1});  // valid for the module, but asked for a dimension it does not have
      (void)mesh.size<"pp">();                     // the diagnostic lists "dp" and "tp"
    }
#endif
  });
  return 0;
}
