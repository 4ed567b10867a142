// The ops on every memory space that runs here: host and meta. On meta tensors (shapes, no
// data) every op must give the host op's extents and layouts, issue no collective, and record
// the analytic FLOP counts (docs/ops.md "Cost on meta tensors"). Also: the allocation ledger,
// the host block cache, the optimizer-update kernels on host and meta, and a memory space declared
// outside the library (tests/support/counting_space.hpp) running an op chain as host does.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/dtensor.hpp"
#include "dtensor/kernels/optim.hpp"
#include "dtensor/ops/all.hpp"
#include "support/counting_space.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_ops_spaces {

using namespace dtensor;
using namespace dtensor::testing;
namespace meta = dtensor::kernels::meta;

namespace {

using Mesh1 = DeviceMesh<"tp">;

/// The meta twin of a host DTensor: the same mesh, extents and layout, no elements.
template <class X>
auto to_meta(const X& x) {
  using T = typename X::value_type;
  return DTensor<T, X::rank, typename X::mesh_type, typename X::layout, meta_space>(
      x.mesh(), x.shape(), Tensor<T, X::rank, meta_space>(x.to_local().shape()));
}

/// "" when the meta result has the host result's type (but its space), extents and local extents.
template <class M, class H>
std::string same_shape(const char* what, const M& m, const H& h) {
  static_assert(std::is_same_v<typename M::space, meta_space> && std::is_same_v<typename M::layout, typename H::layout> &&
                    M::rank == H::rank && std::is_same_v<typename M::value_type, typename H::value_type>,
                "the meta op must give the host op's element type, rank and layout");
  if (m.shape() != h.shape() || m.to_local().shape() != h.to_local().shape())
    return std::string(what) + ": meta " + to_string(m.shape()) + " local " + to_string(m.to_local().shape()) +
           ", host " + to_string(h.shape()) + " local " + to_string(h.to_local().shape());
  return "";
}

/// Runs f on meta inputs inside a CostLog and a CommLog; returns the FLOPs it recorded and
/// reports collectives (ops issue none) and records of another op.
template <class Report, class F>
std::int64_t flops_of(const char* what, Report& report, F&& f) {
  CommLog comm;
  meta::CostLog cost;
  f();
  if (comm.size() != 0) report(std::string(what) + " issued collectives on meta tensors:\n" + comm.to_string());
  return cost.flops();
}

template <class Report>
void expect_flops(Report& report, const char* what, std::int64_t got, std::int64_t want) {
  if (got != want)
    report(std::string(what) + ": recorded " + std::to_string(got) + " FLOPs, analytic " + std::to_string(want));
}

}  // namespace

TEST_CASE("meta tensors: extents without elements; the ledger sees what they would hold", "[ops][meta][ledger]") {
  MemoryLedger ledger;
  {
    MemoryTagScope tag(MemoryTag::parameters);
    Tensor<float, 2, meta_space> w(Shape<2>{1000, 768});
    CHECK(w.data() == nullptr);
    CHECK(w.bytes() == 1000u * 768u * sizeof(float));
    CHECK(ledger.current("meta", MemoryTag::parameters) == std::int64_t(w.bytes()));
    auto w2 = w;  // a copy would allocate as much again
    CHECK(ledger.peak("meta", MemoryTag::parameters) == 2 * std::int64_t(w.bytes()));
  }
  CHECK(ledger.current("meta") == 0);
  CHECK(ledger.peak("meta") == 2 * 1000 * 768 * std::int64_t(sizeof(float)));
  CHECK(ledger.current("host") == 0);
  CHECK(ledger.to_string().find("meta parameters: current 0 B, peak 6144000 B") != std::string::npos);
}

TEST_CASE("the ledger counts host tensors by tag, per thread, with nested scopes", "[ops][ledger]") {
  MemoryLedger outer;
  std::int64_t inner_peak = 0;
  {
    MemoryTagScope tag(MemoryTag::activations);
    MemoryLedger inner;
    Tensor<double, 1> a(Shape<1>{100});
    {
      MemoryTagScope g(MemoryTag::gradients);
      Tensor<double, 1> b(Shape<1>{50});
      CHECK(inner.current("host", MemoryTag::gradients) == 400);
    }
    CHECK(inner.current("host", MemoryTag::activations) == 800);
    CHECK(inner.current("host", MemoryTag::gradients) == 0);
    inner_peak = inner.peak("host");
    CHECK(inner.allocations() == 2);
  }
  CHECK(inner_peak == 1200);
  CHECK(outer.peak("host") == 1200);
  CHECK(outer.current("host") == 0);
  // Another thread's allocations are not this thread's.
  threads::run(2, [](CommPtr) { Tensor<float, 1> t(Shape<1>{1 << 10}); });
  CHECK(outer.peak("host") == 1200);
}

TEST_CASE("host block cache: a freed block of the same size comes back", "[ops][ledger][cache]") {
  const void* first = nullptr;
  {
    Tensor<float, 2> a(Shape<2>{123, 457});
    first = a.data();
  }
  Tensor<float, 2> b = Tensor<float, 2>::uninitialized(Shape<2>{457, 123});  // same bytes
  CHECK(b.data() == first);
  const auto before = host_cache_bytes();
  { Tensor<float, 1> c(Shape<1>{999}); }
  CHECK(host_cache_bytes() > before);
  host_cache_trim();
  CHECK(host_cache_bytes() == 0);
  const auto limit = host_cache_limit();
  set_host_cache_limit(0);  // caching off: a freed block is not kept
  { Tensor<float, 1> c(Shape<1>{999}); }
  CHECK(host_cache_bytes() == 0);
  set_host_cache_limit(limit);
}

TEST_CASE("the op suite on meta: host extents and layouts, no collectives, analytic FLOPs", "[ops][meta]") {
  const auto failures = on_ranks(2, [](CommPtr world, auto report) {
    Mesh1 mesh(world, {2});
    const int r = world->rank();
    // Uneven extents: 5 rows over 2 ranks (3 + 2).
    const Extent B = 5, T = 3, C = 8, O = 6;
    const auto xh = distribute_replicated<Layout<Shard<0>>>(mesh, normal<float>(Shape<3>{B, T, C}, 1));
    const auto wh = distribute_replicated<Layout<Replicate>>(mesh, normal<float>(Shape<2>{O, C}, 2));
    const auto x = to_meta(xh);
    const auto w = to_meta(wh);
    const Extent rows = x.to_local().extent(0) * T;  // this rank's rows of the GEMM
    CHECK(rows == (r == 0 ? 3 : 2) * T);

    // matmul (Linear form) and both gradients: 2 m n k each.
    {
      decltype(ops::matmul<false, true>(x, w)) y;
      const auto f = flops_of("matmul", report, [&] { y = ops::matmul<false, true>(x, w); });
      report(same_shape("matmul", y, ops::matmul<false, true>(xh, wh)));
      expect_flops(report, "matmul", f, 2 * rows * O * C);
      const auto fb = flops_of("matmul_backward", report, [&] { (void)ops::matmul_backward<false, true>(y, x, w); });
      expect_flops(report, "matmul_backward", fb, 2 * (2 * rows * O * C));
    }
    // bmm over [B, H, T, D]: 2 B H T T D per product.
    {
      const auto qh = distribute_replicated<Layout<Shard<1>>>(mesh, normal<float>(Shape<4>{2, 4, 5, 3}, 3));
      const auto q = to_meta(qh);
      const Extent heads = q.to_local().extent(1);
      const auto f = flops_of("bmm", report, [&] {
        report(same_shape("bmm", ops::bmm<false, true>(q, q), ops::bmm<false, true>(qh, qh)));
      });
      expect_flops(report, "bmm", f, 2 * 2 * heads * 5 * 5 * 3);
      // Causal attention: T (T + 1) / 2 pairs per batch and head.
      decltype(ops::attention(q, q, q)) a;
      const auto fa = flops_of("attention", report, [&] { a = ops::attention(q, q, q); });
      const auto ah = ops::attention(qh, qh, qh);
      report(same_shape("attention", a.out, ah.out));
      const std::int64_t pairs = 2 * heads * (5 * 6 / 2);
      expect_flops(report, "attention", fa, pairs * 2 * (3 + 3));
      const auto fab = flops_of("attention_backward", report, [&] {
        auto g = ops::attention_backward(a.out, q, q, q, a.out, a.stats);
        report(same_shape("attention dq", g.dq, ops::attention_backward(ah.out, qh, qh, qh, ah.out, ah.stats).dq));
      });
      expect_flops(report, "attention_backward", fab, pairs * (6 * 3 + 4 * 3));
    }
    // Pointwise, rows, reductions, shapes: the host extents and one record per kernel.
    const Extent n_local = x.to_local().numel();
    expect_flops(report, "gelu", flops_of("gelu", report, [&] {
                   report(same_shape("gelu", ops::gelu(x), ops::gelu(xh)));
                 }),
                 n_local);
    expect_flops(report, "add", flops_of("add", report, [&] {
                   report(same_shape("add", ops::add(x, x), ops::add(xh, xh)));
                 }),
                 n_local);
    expect_flops(report, "softmax", flops_of("softmax", report, [&] {
                   report(same_shape("softmax", ops::softmax(x), ops::softmax(xh)));
                 }),
                 meta::softmax_flops_per_element * n_local);
    const auto gh = distribute_replicated<Layout<Replicate>>(mesh, normal<float>(Shape<1>{C}, 4));
    const auto g = to_meta(gh);
    expect_flops(report, "layer_norm", flops_of("layer_norm", report, [&] {
                   report(same_shape("layer_norm", ops::layer_norm(x, g, g).y, ops::layer_norm(xh, gh, gh).y));
                 }),
                 meta::layer_norm_flops_per_element * n_local);
    expect_flops(report, "sum", flops_of("sum", report, [&] {
                   report(same_shape("sum<0>", ops::sum<0>(x), ops::sum<0>(xh)));
                   report(same_shape("mean<2>", ops::mean<2>(x), ops::mean<2>(xh)));
                 }),
                 2 * n_local);
    {
      auto mh = ops::max<0>(xh);
      auto m = ops::max<0>(x);
      report(same_shape("max<0>", m.values, mh.values));
      const auto dyh = distribute_replicated<Layout<Replicate>>(mesh, normal<float>(mh.values.shape(), 5));
      const auto gm = to_meta(dyh);
      report(same_shape("max_backward<0>", ops::max_backward<0>(gm, x, m, gm), ops::max_backward<0>(dyh, xh, mh, dyh)));
    }
    report(same_shape("transpose", ops::transpose<1, 2>(x), ops::transpose<1, 2>(xh)));
    {
      auto parts = ops::split<2>(x, {3, 5});
      auto parts_h = ops::split<2>(xh, {3, 5});
      report(same_shape("split", parts[1], parts_h[1]));
      report(same_shape("concat", ops::concat<2>(parts), ops::concat<2>(parts_h)));
    }
    // Embedding and cross-entropy: ids and targets have no values on meta (nothing to check).
    {
      const auto idsh = distribute_replicated<Layout<Shard<0>>>(mesh, Tensor<std::int32_t, 2>(Shape<2>{B, T}));
      const auto ids = to_meta(idsh);
      const auto tableh = distribute_replicated<Layout<Replicate>>(mesh, normal<float>(Shape<2>{11, C}, 6));
      const auto table = to_meta(tableh);
      auto h = ops::embedding(table, ids);
      report(same_shape("embedding", h, ops::embedding(tableh, idsh)));
      report(same_shape("embedding_backward", ops::embedding_backward(h, ids, table),
                        ops::embedding_backward(ops::embedding(tableh, idsh), idsh, tableh)));
      const auto logitsh = distribute_replicated<Layout<Shard<0>>>(mesh, normal<float>(Shape<2>{B, 11}, 7));
      const auto targetsh = distribute_replicated<Layout<Shard<0>>>(mesh, Tensor<std::int64_t, 1>(Shape<1>{B}));
      const auto logits = to_meta(logitsh);
      const auto targets = to_meta(targetsh);
      auto ce = ops::cross_entropy(logits, targets);
      report(same_shape("cross_entropy", ce.loss, ops::cross_entropy(logitsh, targetsh).loss));
      report(same_shape("cross_entropy_backward", ops::cross_entropy_backward(logits, targets, ce.stats), logitsh));
    }
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

TEST_CASE("meta ops check extents as host ops do", "[ops][meta][errors]") {
  const auto failures = on_ranks(1, [](CommPtr world, auto report) {
    Mesh1 mesh(world, {1});
    auto a = to_meta(distribute_replicated<Layout<Replicate>>(mesh, Tensor<float, 2>(Shape<2>{4, 5})));
    auto b = to_meta(distribute_replicated<Layout<Replicate>>(mesh, Tensor<float, 2>(Shape<2>{6, 7})));
    try {
      (void)ops::matmul(a, b);
      report("matmul of [4, 5] and [6, 7] on meta did not throw");
    } catch (const Error& e) {
      if (std::string(e.what()).find("matmul") == std::string::npos) report(std::string("unexpected: ") + e.what());
    }
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

TEST_CASE("optimizer-update kernels: one step from zero moments, host; costs on meta", "[kernels][optim]") {
  const auto p0 = normal<double>(Shape<1>{17}, 1), g = normal<double>(Shape<1>{17}, 2);
  const kernels::host::AdamWStep s{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 1};
  auto p = p0;
  Tensor<double, 1> m(p.shape()), v(p.shape());
  kernels::adamw_update(p, g, m, v, s);
  for (Extent i = 0; i < p.numel(); ++i) {
    // At step 1 the bias-corrected moments are g and g^2: the update is lr * g / (|g| + eps).
    const double want = p0[i] * (1 - s.lr * s.weight_decay) - s.lr * g[i] / (std::abs(g[i]) + s.eps);
    CHECK(p[i] == Approx(want).epsilon(1e-12));
    CHECK(m[i] == Approx(0.1 * g[i]).epsilon(1e-12));
  }
  auto q = p0;
  Tensor<double, 1> buf;
  kernels::sgd_update(q, g, buf, {.lr = 0.1, .weight_decay = 0.01});
  for (Extent i = 0; i < q.numel(); ++i) CHECK(q[i] == Approx(p0[i] - 0.1 * (g[i] + 0.01 * p0[i])).epsilon(1e-12));
  double sq = 0;
  for (Extent i = 0; i < g.numel(); ++i) sq += g[i] * g[i];
  CHECK(kernels::sum_squares(g) == Approx(sq).epsilon(1e-14));
  Tensor<float, 1> wrong(Shape<1>{3});
  Tensor<float, 1> pf(Shape<1>{4}), mf(Shape<1>{4}), vf(Shape<1>{4});
  CHECK_THROWS_WITH(kernels::adamw_update(pf, wrong, mf, vf, {}), Catch::Contains("adamw_update"));

  meta::CostLog cost;
  Tensor<float, 1, meta_space> pm(Shape<1>{1000}), gm(Shape<1>{1000}), mm(Shape<1>{1000}), vm(Shape<1>{1000});
  kernels::adamw_update(pm, gm, mm, vm, {});
  (void)kernels::sum_squares(gm);
  CHECK(cost.flops("adamw_update") == meta::adamw_flops_per_element * 1000);
  CHECK(cost.flops("sum_squares") == 2000);
  CHECK(cost.bytes_read() == 5 * 4000);
}

// A memory space from outside the library (tests/support/counting_space.hpp: one header, the
// space and its kernels, as docs/design.md "Adding a memory space" lists) runs a DTensor chain
// — matmul, add, softmax and its backward, a redistribution over two thread ranks — and gives
// the host chain's bits; its bad arguments meet the generic checks (kernels/generic/) it never
// wrote.
TEST_CASE("a memory space added with one header runs the op chain as host does", "[ops][spaces][extension]") {
  const auto failures = on_ranks(2, [](CommPtr world, auto report) {
    Mesh1 mesh(world, {2});
    const Extent B = 5, C = 6, O = 7;  // 5 rows over 2 ranks: 3 + 2
    const auto xf = normal<double>(Shape<2>{B, C}, 11), wf = normal<double>(Shape<2>{C, O}, 12);
    const auto bf = normal<double>(Shape<2>{B, O}, 13), gf = normal<double>(Shape<2>{B, O}, 14);
    const auto to_counting = [](const Tensor<double, 2>& h) { return counting::detail::adopt(h); };

    const auto chain = [&](const auto& x, const auto& w, const auto& b, const auto& g) {
      const auto y = ops::softmax(ops::add(ops::matmul(x, w), b));  // Shard<0> throughout
      const auto dx = ops::softmax_backward(g, y);
      return std::pair{full_tensor(redistribute<Layout<Replicate>>(y)), full_tensor(redistribute<Layout<Shard<1>>>(dx))};
    };
    const auto [yh, dxh] = chain(distribute_replicated<Layout<Shard<0>>>(mesh, xf),
                                 distribute_replicated<Layout<Replicate>>(mesh, wf),
                                 distribute_replicated<Layout<Shard<0>>>(mesh, bf),
                                 distribute_replicated<Layout<Shard<0>>>(mesh, gf));
    const long allocations = counting::space::allocations, calls = counting::space::kernel_calls;
    const auto [yc, dxc] = chain(distribute_replicated<Layout<Shard<0>>>(mesh, to_counting(xf)),
                                 distribute_replicated<Layout<Replicate>>(mesh, to_counting(wf)),
                                 distribute_replicated<Layout<Shard<0>>>(mesh, to_counting(bf)),
                                 distribute_replicated<Layout<Shard<0>>>(mesh, to_counting(gf)));
    static_assert(std::is_same_v<std::decay_t<decltype(yc)>, counting::Tensor<double, 2>>);
    if (counting::space::allocations == allocations) report("nothing was allocated in the counting space");
    if (counting::space::kernel_calls < calls + 4) report("the counting space's kernels did not run");
    // Exact: the same host kernels on the same elements, and data movement.
    const auto same = [&](const char* what, const counting::Tensor<double, 2>& c, const Tensor<double, 2>& h) {
      if (c.shape() != h.shape()) return report(std::string(what) + ": extents " + to_string(c.shape()));
      for (Extent i = 0; i < h.numel(); ++i)
        if (c.data()[i] != h[i]) return report(std::string(what) + " differs from host at " + std::to_string(i));
    };
    same("y", yc, yh);
    same("dx", dxc, dxh);

    // The checks it did not write: extents that differ, through the generic front.
    const auto y3 = to_counting(normal<double>(Shape<2>{3, O}, 15));
    try {
      (void)kernels::softmax_backward(y3, to_counting(gf));
      report("softmax_backward accepted dy of other extents in the counting space");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("softmax_backward") == std::string::npos || what.find("[3, 7]") == std::string::npos ||
          what.find("[5, 7]") == std::string::npos)
        report("the error does not name the op and both extents: " + what);
    }
  });
  for (const auto& f : failures) FAIL(f);
}

}  // namespace test_ops_spaces
