// Uses of ops with layouts that have no sharding rule: each DTENSOR_COMPILE_FAIL_CASE must fail
// to compile with a diagnostic naming the op, the placements and the mesh dimension (see
// CMakeLists.txt); case 6 mixes memory spaces, which must name both. Case 0 is the control: the same calls with layouts that have rules.
// Case -1 compiles every failing case at once (each in a block of its own): the compiler reports
// each one's diagnostic, and CTest checks them all from that one compile (CMakeLists.txt).
#include "dtensor/dtensor.hpp"
#include "dtensor/ops/all.hpp"

using namespace dtensor;

#ifndef DTENSOR_COMPILE_FAIL_CASE
#define DTENSOR_COMPILE_FAIL_CASE 0
#endif
#define DTENSOR_FAIL_CASE(n) (DTENSOR_COMPILE_FAIL_CASE == (n) || DTENSOR_COMPILE_FAIL_CASE == -1)

int main() {
  threads::run(1, [](CommPtr world) {
    DeviceMesh<"tp"> mesh(world, {1});
    DeviceMesh<"dp", "tp"> mesh2(world, {1, 1});
    const auto m = normal<float>(Shape<2>{4, 4}, 1);
    const auto q = normal<float>(Shape<4>{1, 2, 3, 4}, 2);
#if DTENSOR_COMPILE_FAIL_CASE == 0
    auto a = distribute_replicated<Layout<Shard<0>>>(mesh, m);
    auto b = distribute_replicated<Layout<Replicate>>(mesh, m);
    (void)ops::matmul(a, b);
    (void)ops::softmax(distribute_replicated<Layout<Replicate, Shard<0>>>(mesh2, m));
    (void)ops::gelu(a);
    (void)ops::add(distribute_replicated<Layout<Partial<>>>(mesh, m), distribute_replicated<Layout<Partial<>>>(mesh, m));
    auto h = distribute_replicated<Layout<Shard<1>>>(mesh, q);
    (void)ops::attention(h, h, h);
    const DTensor<float, 2, DeviceMesh<"tp">, Layout<Replicate>, meta_space> mt(mesh, m.shape(),
                                                                              Tensor<float, 2, meta_space>(m.shape()));
    (void)ops::add(mt, mt);
#endif
#if DTENSOR_FAIL_CASE(1)
    {
      auto a = distribute_replicated<Layout<Shard<0>>>(mesh, m);
      (void)ops::matmul(a, a);
    }
#endif
#if DTENSOR_FAIL_CASE(2)
    { (void)ops::softmax(distribute_replicated<Layout<Replicate, Shard<1>>>(mesh2, m)); }
#endif
#if DTENSOR_FAIL_CASE(3)
    { (void)ops::gelu(distribute_replicated<Layout<Partial<>>>(mesh, m)); }
#endif
#if DTENSOR_FAIL_CASE(4)
    {
      (void)ops::add(distribute_replicated<Layout<Partial<>>>(mesh, m),
                     distribute_replicated<Layout<Replicate>>(mesh, m));
    }
#endif
#if DTENSOR_FAIL_CASE(5)
    {
      auto s = distribute_replicated<Layout<Shard<2>>>(mesh, q);
      (void)ops::attention(s, s, s);
    }
#endif
#if DTENSOR_FAIL_CASE(6)
    {
      const auto a = distribute_replicated<Layout<Replicate>>(mesh, m);
      const DTensor<float, 2, DeviceMesh<"tp">, Layout<Replicate>, meta_space> b(
          mesh, m.shape(), Tensor<float, 2, meta_space>(m.shape()));
      (void)ops::add(a, b);
    }
#endif
  });
  return 0;
}
