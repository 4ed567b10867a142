// A model, stage or attention that misses part of its protocol must NOT compile, and the
// diagnostic must say what is missing (nn/units.hpp require_units, nn/sequential.hpp,
// parallel/pipeline/stage.hpp require_stage, nn/stack.hpp require_layered_model, nn/attention.hpp's core check; see CMakeLists.txt).
// Case 0 is the control: the same uses with complete types compile. Case -1 compiles every
// failing case at once (each in a block of its own): CTest checks each one's diagnostic in that
// one compile's output (CMakeLists.txt).
#include "dtensor/comm/threads.hpp"
#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/parallel/pipeline/stage.hpp"

using namespace dtensor;

#ifndef DTENSOR_COMPILE_FAIL_CASE
#define DTENSOR_COMPILE_FAIL_CASE 0
#endif
#define DTENSOR_FAIL_CASE(n) (DTENSOR_COMPILE_FAIL_CASE == (n) || DTENSOR_COMPILE_FAIL_CASE == -1)

namespace {
using Mesh = DeviceMesh<"dp", "fsdp">;
using Lin = nn::Linear<float, Mesh>;
struct NoUnits {  // a model that never said what its units are
  void set_hooks(nn::UnitHooks) {}
};
struct NotAModule {};
struct NotAStage {
  using X = int;
  using Input = int;
  using Target = int;
  using Loss = int;
};
struct HalfAModel {  // parts for nn::Stack / pipeline::split, but no epilogue
  using Target = int;
  const Mesh* mesh_ = nullptr;
  const Mesh& mesh() const { return *mesh_; }
  Extent block_count() const { return 1; }
  Lin make_prologue() const { return Lin("in", *mesh_, 4, 4, 1); }
  Lin make_block(Extent) const { return Lin("b", *mesh_, 4, 4, 2); }
};
}  // namespace

int main() {
  threads::run(1, [](CommPtr world) {
    Mesh mesh(world, {1, 1});
#if DTENSOR_COMPILE_FAIL_CASE == 0
    nn::Sequential<Lin, Lin> net(Lin("a", mesh, 4, 4, 1), Lin("b", mesh, 4, 4, 2));
    auto fsdp = parallel::fully_shard(net, mesh);
    (void)fsdp;
#endif
#if DTENSOR_FAIL_CASE(1)
    {
      NoUnits model;
      auto fsdp = parallel::fully_shard(model, mesh);
      (void)fsdp;
    }
#endif
#if DTENSOR_FAIL_CASE(2)
    {
      nn::Sequential<Lin, NotAModule> net(Lin("a", mesh, 4, 4, 1), NotAModule{});
      (void)net;
    }
#endif
#if DTENSOR_FAIL_CASE(3)
    { static_assert(parallel::pipeline::require_stage<NotAStage>()); }
#endif
#if DTENSOR_FAIL_CASE(4)
    {
      using CpMesh = DeviceMesh<"cp">;
      CpMesh cp(world, {1});
      nn::SelfAttention<float, CpMesh> attn("attn", cp, {.dim = 8, .heads = 2, .seq = 4}, 1);  // the local core
      (void)attn;
    }
#endif
#if DTENSOR_FAIL_CASE(5)
    { static_assert(parallel::pipeline::require_splittable_model<HalfAModel>()); }
#endif
    (void)mesh;
  });
  return 0;
}
