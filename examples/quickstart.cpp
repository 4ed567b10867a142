// quickstart — eight ranks on the threads backend as a (dp=2, tp=4) mesh.
//
// Distributes a 13 x 10 matrix (uneven on purpose: 13 rows do not split evenly over 2 or 4),
// walks it through several layouts, and on rank 0 prints each step's compile-time plan, the
// sharding table and the collectives the step issued (CommLog). Every step is checked against
// the full matrix; the program exits non-zero if any rank sees a difference.
//
//   ./build/examples/quickstart
#include <dtensor/dtensor.hpp>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <mutex>

using namespace dtensor;

using Mesh = DeviceMesh<"dp", "tp">;
using RowsCols = Layout<Shard<0>, Shard<1>>;          // rows over dp, columns over tp
using ColsRows = Layout<Shard<1>, Shard<0>>;          // swapped: one all-to-all per mesh dimension
using RowsTwice = Layout<Shard<0>, Shard<0>>;         // nested: dp splits rows, tp splits dp's chunk
using PartialSum = Layout<Replicate, Partial<ReduceOp::sum>>;  // tp ranks hold addends
using Replicated = Layout<Replicate, Replicate>;

namespace {

std::mutex print_mutex;
std::atomic<int> failures{0};

/// Checks that x holds, on every rank, `factor` times the full matrix `full`, and prints the
/// step on rank 0: the plan from the previous layout, the sharding and the collectives.
template <class From, class X>
void step(const char* title, const X& x, const Tensor<float, 2>& full, const CommLog& log, double factor = 1) {
  // Read the log first: full_tensor communicates too (a redistribute to Replicate).
  const std::string collectives = log.size() ? log.to_string() : "  (none)\n";
  const auto got = full_tensor(x);
  Tensor<float, 2> want = full;
  for (Extent i = 0; i < want.numel(); ++i) want[i] = float(want[i] * factor);
  const bool ok = equal(got, want);
  if (!ok) ++failures;
  if (x.mesh().rank() != 0) return;
  std::lock_guard lock(print_mutex);
  std::cout << "== " << title << (ok ? "" : "   <-- MISMATCH") << '\n'
            << "plan: " << plan_of<From, typename X::layout, Mesh>() << '\n'
            << visualize_sharding(x) << "collectives on rank 0:\n"
            << collectives << '\n';
}

}  // namespace

int main() {
  const Tensor<float, 2> full = arange<float>(Shape<2>{13, 10});

  threads::run(8, [&](CommPtr world) {
    Mesh mesh(world, {2, 4});

    // Every rank holds `full`, so distribute_replicated cuts its piece without communicating.
    auto a = distribute_replicated<RowsCols>(mesh, full);
    step<RowsCols>("distribute as (Shard<0>, Shard<1>)", a, full, CommLog{});

    CommLog l1;
    auto b = redistribute<ColsRows>(a);
    step<RowsCols>("(Shard<0>, Shard<1>) -> (Shard<1>, Shard<0>)", b, full, l1);

    CommLog l2;
    auto c = redistribute<RowsTwice>(b);
    step<ColsRows>("(Shard<1>, Shard<0>) -> (Shard<0>, Shard<0>) nested", c, full, l2);

    // A Partial<sum> tensor: each tp rank holds one addend; here every addend is the full
    // matrix, so the logical value is 4 x full (what full_tensor returns).
    auto p = from_local<PartialSum>(mesh, full, full.shape());
    CommLog l3;
    auto s = redistribute<RowsCols>(p);
    step<PartialSum>("(Replicate, Partial<sum>) -> (Shard<0>, Shard<1>): reduce-scatter", s, full, l3, 4);

    CommLog l4;
    auto r = redistribute<Replicated>(s);
    step<RowsCols>("(Shard<0>, Shard<1>) -> (Replicate, Replicate)", r, full, l4, 4);
  });

  if (failures) {
    std::cerr << "quickstart: " << failures << " rank-step(s) differ from the full matrix\n";
    return 1;
  }
  std::cout << "quickstart: every layout matches the full matrix on all 8 ranks\n";
  return 0;
}
