// ops::attention (heads or batch split), transpose, reshape (with the run-time block check),
// split and concat: against the oracle on 1-D and 2-D meshes, backwards against the oracle and
// finite differences, no collectives.
#include "test_ops_util.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_ops_attention_shape {

using namespace ot;

static_assert(std::is_same_v<rules::attention_t<Layout<Shard<1>>, Layout<Shard<1>>, Layout<Shard<1>>>, Layout<Shard<1>>>);
static_assert(!rules::outcome<rules::Attention{}, Layout<Shard<2>>, Layout<Shard<2>>, Layout<Shard<2>>>.ok);
static_assert(!rules::outcome<rules::Attention{}, Layout<Shard<1>>, Layout<Replicate>, Layout<Shard<1>>>.ok);
static_assert(std::is_same_v<rules::transpose_t<Layout<Shard<1>, Partial<>>, 1, 2>, Layout<Shard<2>, Partial<>>>);

namespace {

constexpr double tol = 1e-12;

template <class L, class Mesh, class Report>
void attention_case(const Mesh& mesh, Report& report, bool causal) {
  const std::string where = std::string(causal ? "causal " : "") + "attention of " + names<L>() + " on mesh " +
                            to_string(mesh.shape());
  const auto Q = normal<double>(Shape<4>{3, 5, 6, 4}, 1), K = normal<double>(Shape<4>{3, 5, 6, 4}, 2),
             V = normal<double>(Shape<4>{3, 5, 6, 3}, 3);
  auto q = distribute_replicated<L>(mesh, Q);
  auto k = distribute_replicated<L>(mesh, K);
  auto v = distribute_replicated<L>(mesh, V);
  const ops::AttentionOptions o{.causal = causal};
  auto f = no_comm(where.c_str(), report, [&] { return ops::attention(q, k, v, o); });
  const auto fr = ops::attention(rep(mesh, Q), rep(mesh, K), rep(mesh, V), o);
  report(diff(where.c_str(), full_tensor(f.out), fr.out.to_local(), tol));
  const auto DO = normal<double>(f.out.shape(), 4);
  auto g = no_comm(where.c_str(), report,
                   [&] { return ops::attention_backward(distribute_replicated<L>(mesh, DO), q, k, v, f.out, f.stats, o); });
  const auto gr = ops::attention_backward(rep(mesh, DO), rep(mesh, Q), rep(mesh, K), rep(mesh, V), fr.out, fr.stats, o);
  report(diff((where + " dq").c_str(), full_tensor(g.dq), gr.dq.to_local(), tol));
  report(diff((where + " dk").c_str(), full_tensor(g.dk), gr.dk.to_local(), tol));
  report(diff((where + " dv").c_str(), full_tensor(g.dv), gr.dv.to_local(), tol));
}

}  // namespace

TEST_CASE("attention: heads split, batch split, replicated; backward; no collectives", "[ops][attention]") {
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    for (bool causal : {true, false}) {
      attention_case<Layout<Replicate>>(mesh, report, causal);
      attention_case<Layout<Shard<0>>>(mesh, report, causal);
      attention_case<Layout<Shard<1>>>(mesh, report, causal);
    }
  });
  on_meshes_2d([](const Mesh2& mesh, auto report) {
    attention_case<Layout<Shard<0>, Shard<1>>>(mesh, report, true);
    attention_case<Layout<Shard<1>, Shard<1>>>(mesh, report, true);
  });
}

TEST_CASE("attention backward matches finite differences (double, one rank)", "[ops][attention][backward]") {
  on_one_rank([](const Mesh1& mesh, auto) {
    const auto Q = normal<double>(Shape<4>{1, 2, 4, 3}, 5), K = normal<double>(Shape<4>{1, 2, 4, 3}, 6),
               V = normal<double>(Shape<4>{1, 2, 4, 2}, 7), DO = normal<double>(Shape<4>{1, 2, 4, 2}, 8);
    const auto f = ops::attention(rep(mesh, Q), rep(mesh, K), rep(mesh, V));
    const auto g = ops::attention_backward(rep(mesh, DO), rep(mesh, Q), rep(mesh, K), rep(mesh, V), f.out, f.stats);
    using T4 = Tensor<double, 4>;
    check_fd("attention dq", g.dq.to_local(), fd_grad(Q, [&](const T4& x) { return dot(ops::attention(rep(mesh, x), rep(mesh, K), rep(mesh, V)).out.to_local(), DO); }));
    check_fd("attention dk", g.dk.to_local(), fd_grad(K, [&](const T4& x) { return dot(ops::attention(rep(mesh, Q), rep(mesh, x), rep(mesh, V)).out.to_local(), DO); }));
    check_fd("attention dv", g.dv.to_local(), fd_grad(V, [&](const T4& x) { return dot(ops::attention(rep(mesh, Q), rep(mesh, K), rep(mesh, x)).out.to_local(), DO); }));
  });
}

TEST_CASE("transpose, split, concat: every layout, exact", "[ops][shape]") {
  using Ls = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Shard<2>>, Layout<Partial<>>,
                     Layout<Partial<ReduceOp::max>>>;
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    const auto X = normal<double>(Shape<3>{5, 7, 3}, 9);
    int n = 0;
    Singles<rules::Transpose{1, 2}, Ls>::each(
        [&]<class L>() {
          const std::string where = "transpose<1, 2> of " + names<L>();
          auto x = make_input<L>(mesh, X, 9);
          auto y = no_comm(where.c_str(), report, [&] { return ops::transpose<1, 2>(x); });
          report(diff(where.c_str(), full_tensor(y), kernels::host::transpose(full_tensor(x), 1, 2), 0));
          auto back = ops::transpose<1, 2>(y);  // its own backward
          report(diff((where + " back").c_str(), full_tensor(back), full_tensor(x), 0));
        },
        n);
    if (n != 6) report("transpose swept " + std::to_string(n));
    int m = 0;
    Singles<rules::AlongDim{1}, Ls>::each(
        [&]<class L>() {
          const std::string where = "split<1> / concat<1> of " + names<L>();
          auto x = make_input<L>(mesh, X, 10);
          const auto xf = full_tensor(x);
          auto parts = no_comm(where.c_str(), report, [&] { return ops::split<1>(x, {2, 0, 5}); });
          const auto want = kernels::host::split(xf, 1, {2, 0, 5});
          for (std::size_t i = 0; i < 3; ++i) report(diff(where.c_str(), full_tensor(parts[i]), want[i], 0));
          auto y = no_comm(where.c_str(), report, [&] { return ops::concat<1>(parts); });
          report(diff((where + " round trip").c_str(), full_tensor(y), xf, 0));
        },
        m);
    if (m != 5) report("split swept " + std::to_string(m) + ", expected 5 (all but Shard<1>)");
  });
}

TEST_CASE("reshape: whole heads split, merged leading dimensions, and the run-time block check", "[ops][shape]") {
  // [N, C] split on C -> [N, H, D] split on H: whole heads when the chunks of C are multiples of D.
  const auto X = normal<double>(Shape<2>{3, 8}, 11);
  for (int ranks : {2, 4}) {
    auto f = on_ranks(ranks, [&](CommPtr w, auto report) {
      Mesh1 mesh(w, {ranks});
      auto x = distribute_replicated<Layout<Shard<1>>>(mesh, X);
      auto h = no_comm("reshape", report, [&] { return ops::reshape<Layout<Shard<1>>>(x, Shape<3>{3, 4, 2}); });
      report(diff("reshape heads", full_tensor(h), X.reshape(Shape<3>{3, 4, 2}), 0));
      auto dx = no_comm("reshape_backward", report, [&] { return ops::reshape_backward(h, x); });
      static_assert(std::is_same_v<typename decltype(dx)::layout, Layout<Shard<1>>>);
      report(diff("reshape back", full_tensor(dx), X, 0));
      // [B, T, C] split on B -> [B*T, C] split on 0 (4 = 2 x 2 or 4 x 1 rows: blocks line up)
      const auto Y = normal<double>(Shape<3>{4, 3, 2}, 12);
      auto y = distribute_replicated<Layout<Shard<0>>>(mesh, Y);
      auto y2 = ops::reshape<Layout<Shard<0>>>(y, Shape<2>{12, 2});
      report(diff("reshape merge", full_tensor(y2), Y.reshape(Shape<2>{12, 2}), 0));
      // A temporary gives its storage to the result (attention's head split and merge): same
      // values, same bytes, no copy; y itself (an lvalue above) kept its own.
      auto moved = y;
      const double* storage = moved.to_local().data();
      auto y3 = no_comm("reshape of a temporary", report,
                        [&] { return ops::reshape<Layout<Shard<0>>>(std::move(moved), Shape<2>{12, 2}); });
      report(diff("reshape of a temporary", full_tensor(y3), Y.reshape(Shape<2>{12, 2}), 0));
      if (y3.to_local().data() != storage) report("reshape of a temporary copied its storage");
      if (y2.to_local().data() == y.to_local().data()) report("reshape of an lvalue shares its storage");
      // Partial stays Partial
      auto p = make_input<Layout<Partial<>>>(mesh, X, 13);
      auto p3 = ops::reshape<Layout<Partial<>>>(p, Shape<3>{3, 4, 2});
      report(diff("reshape partial", full_tensor(p3), full_tensor(p).reshape(Shape<3>{3, 4, 2}), 0));
    });
    INFO(summary(f));
    CHECK(f.empty());
  }
  // On 3 ranks C = 8 splits 3, 3, 2: not whole heads of 2, so the ranks holding a broken head throw.
  auto f = on_ranks(3, [&](CommPtr w, auto report) {
    Mesh1 mesh(w, {3});
    auto x = distribute_replicated<Layout<Shard<1>>>(mesh, X);
    try {
      (void)ops::reshape<Layout<Shard<1>>>(x, Shape<3>{3, 4, 2});
      if (w->rank() != 2) report("no error for chunks of 3 elements of heads of 2");
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const char* s : {"reshape", "[3, 8]", "[3, 4, 2]", "rank", "S(1)"})
        if (m.find(s) == std::string::npos) report(std::string("message lacks '") + s + "': " + m);
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_ops_attention_shape
