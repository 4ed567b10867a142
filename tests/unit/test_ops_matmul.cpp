// ops::matmul and ops::bmm: every layout pair with a rule, on 1-D meshes of 2-4 ranks and 2-D
// meshes, uneven extents included, against the oracle (the op on the logical inputs); the
// backward against the oracle and against finite differences; no op communicates.
#include "test_ops_util.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_ops_matmul {

using namespace ot;

namespace {

using L1 = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Partial<>>,
                   Layout<Partial<ReduceOp::avg>>, Layout<Partial<ReduceOp::max>>>;
using L1r3 = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Shard<2>>, Layout<Partial<>>>;
using L2 = Layouts<Layout<Replicate, Replicate>, Layout<Shard<0>, Replicate>, Layout<Replicate, Shard<1>>,
                   Layout<Shard<0>, Shard<1>>, Layout<Shard<1>, Shard<0>>, Layout<Shard<0>, Shard<0>>,
                   Layout<Partial<>, Replicate>, Layout<Shard<1>, Partial<>>>;

constexpr double tol = 1e-12;  // double: partial sums in another order

/// One matmul case: forward and backward against the oracle, and no collectives.
template <bool TA, bool TB, class LA, class LB, class Mesh, class Report, std::size_t RA, std::size_t RB>
void matmul_case(const Mesh& mesh, Report& report, const Tensor<double, RA>& A, const Tensor<double, RB>& B) {
  const std::string where = "matmul<" + std::to_string(TA) + ", " + std::to_string(TB) + "> of " + names<LA, LB>() +
                            " on mesh " + to_string(mesh.shape());
  auto a = make_input<LA>(mesh, A, 1);
  auto b = make_input<LB>(mesh, B, 2);
  const auto af = full_tensor(a), bf = full_tensor(b);
  auto c = no_comm(where.c_str(), report, [&] { return ops::matmul<TA, TB>(a, b); });
  using C = decltype(c);
  const auto want = ops::matmul<TA, TB>(rep(mesh, af), rep(mesh, bf)).to_local();
  report(diff((where + " forward").c_str(), full_tensor(c), want, tol));

  // The gradient of the output is in its gradient layout (Partial read as Replicate).
  using LG = typename grad_layout<typename C::layout>::type;
  const auto dcf = normal<double>(c.shape(), 3);
  auto dc = make_input<LG>(mesh, dcf, 3);
  auto g = no_comm(where.c_str(), report, [&] { return ops::matmul_backward<TA, TB>(dc, a, b); });
  const auto gw = ops::matmul_backward<TA, TB>(rep(mesh, dcf), rep(mesh, af), rep(mesh, bf));
  report(diff((where + " da").c_str(), full_tensor(g.da), gw.da.to_local(), tol));
  report(diff((where + " db").c_str(), full_tensor(g.db), gw.db.to_local(), tol));
  // A gradient has its operand's extents, and a Shard operand gets a gradient split the same way.
  if (g.da.shape() != a.shape() || g.db.shape() != b.shape()) report(where + ": gradient extents differ");
  for (std::size_t i = 0; i < Mesh::ndim; ++i) {
    if (LA::desc.placements[i].is_shard() && !(decltype(g.da)::layout::desc.placements[i] == LA::desc.placements[i]))
      report(where + ": da is not split like a");
    if (LB::desc.placements[i].is_shard() && !(decltype(g.db)::layout::desc.placements[i] == LB::desc.placements[i]))
      report(where + ": db is not split like b");
  }
}

template <bool TA, bool TB, class Ls, class Mesh, class Report>
int sweep_2d_operands(const Mesh& mesh, Report& report, Extent m, Extent k, Extent n) {
  const auto A = normal<double>(TA ? Shape<2>{k, m} : Shape<2>{m, k}, 11);
  const auto B = normal<double>(TB ? Shape<2>{n, k} : Shape<2>{k, n}, 12);
  int count = 0;
  Pairs<rules::Matmul{2, 2, TA, TB}, Ls, Ls>::each(
      [&]<class LA, class LB>() { matmul_case<TA, TB, LA, LB>(mesh, report, A, B); }, count);
  return count;
}

}  // namespace

// The rule table itself (docs/ops.md renders the same functions; test_ops_docs compares).
static_assert(std::is_same_v<rules::matmul_t<Layout<Shard<0>>, Layout<Replicate>>, Layout<Shard<0>>>);
static_assert(std::is_same_v<rules::matmul_t<Layout<Replicate>, Layout<Shard<1>>>, Layout<Shard<1>>>);
static_assert(std::is_same_v<rules::matmul_t<Layout<Shard<1>>, Layout<Shard<0>>>, Layout<Partial<>>>);
static_assert(std::is_same_v<rules::matmul_t<Layout<Replicate>, Layout<Replicate>>, Layout<Replicate>>);
static_assert(std::is_same_v<rules::matmul_t<Layout<Partial<>>, Layout<Replicate>>, Layout<Partial<>>>);
static_assert(!rules::outcome<rules::Matmul{}, Layout<Shard<0>>, Layout<Shard<0>>>.ok);
static_assert(!rules::outcome<rules::Matmul{}, Layout<Partial<>>, Layout<Partial<>>>.ok);
static_assert(!rules::outcome<rules::Matmul{}, Layout<Partial<ReduceOp::max>>, Layout<Replicate>>.ok);
// Linear y = x w^T with x [B, T, in] and w [out, in]: column parallel and row parallel.
static_assert(std::is_same_v<rules::matmul_t<Layout<Replicate>, Layout<Shard<0>>, false, true, 3, 2>, Layout<Shard<2>>>);
static_assert(std::is_same_v<rules::matmul_t<Layout<Shard<2>>, Layout<Shard<1>>, false, true, 3, 2>, Layout<Partial<>>>);
static_assert(std::is_same_v<rules::matmul_t<Layout<Shard<1>>, Layout<Replicate>, false, true, 3, 2>, Layout<Shard<1>>>);
// Nested shards keep their order.
static_assert(std::is_same_v<rules::matmul_t<Layout<Shard<0>, Shard<0>>::ordered<1, 0>, Layout<Replicate, Replicate>>,
                             Layout<Shard<0>, Shard<0>>::ordered<1, 0>>);
static_assert(!rules::outcome<rules::Matmul{}, Layout<Shard<1>, Shard<1>>::ordered<1, 0>, Layout<Shard<0>, Shard<0>>>.order_ok);

TEST_CASE("matmul: every layout pair with a rule on 1-d meshes, all transposes, uneven extents", "[ops][matmul]") {
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    int n = sweep_2d_operands<false, false, L1>(mesh, report, 7, 5, 6);
    n += sweep_2d_operands<false, true, L1>(mesh, report, 7, 5, 6);
    n += sweep_2d_operands<true, false, L1>(mesh, report, 3, 9, 2);
    n += sweep_2d_operands<true, true, L1>(mesh, report, 6, 4, 5);
    // R x R, S x R, R x S, S x S -> P, P(sum|avg) x R and R x P(sum|avg): 8 per transposition.
    if (n != 4 * 8) report("swept " + std::to_string(n) + " layout pairs, expected 32");
  });
}

TEST_CASE("matmul: layout pairs on 2-d meshes, nested shards included", "[ops][matmul]") {
  on_meshes_2d([](const Mesh2& mesh, auto report) {
    int n = sweep_2d_operands<false, false, L2>(mesh, report, 7, 6, 5);
    n += sweep_2d_operands<false, true, L2>(mesh, report, 5, 7, 6);
    if (n < 20) report("swept only " + std::to_string(n) + " layout pairs");
  });
}

TEST_CASE("matmul: the Linear form x[B, T, in] w[out, in]^T and its weight gradient", "[ops][matmul]") {
  const auto X = normal<double>(Shape<3>{3, 5, 4}, 21);
  const auto W = normal<double>(Shape<2>{6, 4}, 22);
  on_meshes_1d([&](const Mesh1& mesh, auto report) {
    int n = 0;
    Pairs<rules::Matmul{3, 2, false, true}, L1r3, L1>::each(
        [&]<class LX, class LW>() { matmul_case<false, true, LX, LW>(mesh, report, X, W); }, n);
    // x: R, S0, S1 (rows) with w R; x S2 with w S1; R with w S0; P(sum) with R; R with P(sum|avg).
    if (n != 8) report("swept " + std::to_string(n) + " layout pairs, expected 8");
  });
  on_meshes_2d([&](const Mesh2& mesh, auto report) {
    // data parallel x tensor parallel: column-parallel and row-parallel Linear
    matmul_case<false, true, Layout<Shard<0>, Replicate>, Layout<Replicate, Shard<0>>>(mesh, report, X, W);
    matmul_case<false, true, Layout<Shard<0>, Shard<2>>, Layout<Replicate, Shard<1>>>(mesh, report, X, W);
    matmul_case<false, true, Layout<Shard<1>, Shard<1>>, Layout<Replicate, Replicate>>(mesh, report, X, W);
    // x^T dy over two leading dimensions (the weight gradient alone)
    matmul_case<true, false, Layout<Shard<0>, Shard<1>>, Layout<Shard<0>, Shard<1>>>(mesh, report, X,
                                                                                    normal<double>(Shape<3>{3, 5, 2}, 23));
  });
}

TEST_CASE("bmm: batch split, heads split, every rule on 1-d and 2-d meshes", "[ops][matmul]") {
  const auto A = normal<double>(Shape<4>{3, 5, 4, 6}, 31);
  const auto B = normal<double>(Shape<4>{3, 5, 2, 6}, 32);  // used transposed: [.., 6, 2]
  using L4 = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Shard<2>>, Layout<Shard<3>>,
                     Layout<Partial<>>>;
  auto bmm_case = [&]<class LA, class LB>(const auto& mesh, auto& report) {
    const std::string where = "bmm<false, true> of " + names<LA, LB>();
    auto a = make_input<LA>(mesh, A, 1);
    auto b = make_input<LB>(mesh, B, 2);
    const auto af = full_tensor(a), bf = full_tensor(b);
    auto c = no_comm(where.c_str(), report, [&] { return ops::bmm<false, true>(a, b); });
    report(diff((where + " forward").c_str(), full_tensor(c), ops::bmm<false, true>(rep(mesh, af), rep(mesh, bf)).to_local(), tol));
    using LG = typename grad_layout<typename decltype(c)::layout>::type;
    const auto dcf = normal<double>(c.shape(), 3);
    auto g = no_comm(where.c_str(), report, [&] { return ops::bmm_backward<false, true>(make_input<LG>(mesh, dcf, 3), a, b); });
    const auto gw = ops::bmm_backward<false, true>(rep(mesh, dcf), rep(mesh, af), rep(mesh, bf));
    report(diff((where + " da").c_str(), full_tensor(g.da), gw.da.to_local(), tol));
    report(diff((where + " db").c_str(), full_tensor(g.db), gw.db.to_local(), tol));
  };
  on_meshes_1d([&](const Mesh1& mesh, auto report) {
    int n = 0;
    Pairs<rules::Bmm{4, false, true}, L4, L4>::each([&]<class LA, class LB>() { bmm_case.template operator()<LA, LB>(mesh, report); }, n);
    // R x R, S0 x S0, S1 x S1, S2 x R (rows), R x S2 (columns of b^T), S3 x S3 -> P, P x R, R x P.
    if (n != 8) report("swept " + std::to_string(n) + " layout pairs, expected 8");
  });
  on_meshes_2d([&](const Mesh2& mesh, auto report) {
    bmm_case.template operator()<Layout<Shard<0>, Shard<1>>, Layout<Shard<0>, Shard<1>>>(mesh, report);
    bmm_case.template operator()<Layout<Shard<1>, Shard<3>>, Layout<Shard<1>, Shard<3>>>(mesh, report);
  });
}

TEST_CASE("matmul backward matches finite differences (double, one rank)", "[ops][matmul][backward]") {
  on_one_rank([](const Mesh1& mesh, auto) {
    auto fd_case = [&]<bool TA, bool TB>(Shape<3> as, Shape<2> bs) {
      const auto A = normal<double>(as, 41);
      const auto B = normal<double>(bs, 42);
      const auto c = ops::matmul<TA, TB>(rep(mesh, A), rep(mesh, B));
      const auto dy = normal<double>(c.shape(), 43);
      const auto g = ops::matmul_backward<TA, TB>(rep(mesh, dy), rep(mesh, A), rep(mesh, B));
      check_fd("matmul da", g.da.to_local(), fd_grad(A, [&](const Tensor<double, 3>& v) {
                 return dot(ops::matmul<TA, TB>(rep(mesh, v), rep(mesh, B)).to_local(), dy);
               }));
      check_fd("matmul db", g.db.to_local(), fd_grad(B, [&](const Tensor<double, 2>& v) {
                 return dot(ops::matmul<TA, TB>(rep(mesh, A), rep(mesh, v)).to_local(), dy);
               }));
    };
    fd_case.template operator()<false, false>(Shape<3>{2, 3, 4}, Shape<2>{4, 5});
    fd_case.template operator()<false, true>(Shape<3>{2, 3, 4}, Shape<2>{5, 4});
    // rank-2 a with transposes
    const auto A = normal<double>(Shape<2>{4, 3}, 44);
    const auto B = normal<double>(Shape<2>{5, 4}, 45);
    const auto c = ops::matmul<true, true>(rep(mesh, A), rep(mesh, B));
    const auto dy = normal<double>(c.shape(), 46);
    const auto g = ops::matmul_backward<true, true>(rep(mesh, dy), rep(mesh, A), rep(mesh, B));
    check_fd("matmul<T, T> da", g.da.to_local(), fd_grad(A, [&](const Tensor<double, 2>& v) {
               return dot(ops::matmul<true, true>(rep(mesh, v), rep(mesh, B)).to_local(), dy);
             }));
    check_fd("matmul<T, T> db", g.db.to_local(), fd_grad(B, [&](const Tensor<double, 2>& v) {
               return dot(ops::matmul<true, true>(rep(mesh, A), rep(mesh, v)).to_local(), dy);
             }));
    // bmm
    const auto QA = normal<double>(Shape<3>{2, 3, 4}, 47);
    const auto QB = normal<double>(Shape<3>{2, 4, 3}, 48);
    const auto qc = ops::bmm<true, true>(rep(mesh, QA), rep(mesh, QB));
    const auto qdy = normal<double>(qc.shape(), 49);
    const auto qg = ops::bmm_backward<true, true>(rep(mesh, qdy), rep(mesh, QA), rep(mesh, QB));
    check_fd("bmm da", qg.da.to_local(), fd_grad(QA, [&](const Tensor<double, 3>& v) {
               return dot(ops::bmm<true, true>(rep(mesh, v), rep(mesh, QB)).to_local(), qdy);
             }));
    check_fd("bmm db", qg.db.to_local(), fd_grad(QB, [&](const Tensor<double, 3>& v) {
               return dot(ops::bmm<true, true>(rep(mesh, QA), rep(mesh, v)).to_local(), qdy);
             }));
  });
}

TEST_CASE("matmul: float through CBLAS matches double within float rounding", "[ops][matmul]") {
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    const auto A = normal<double>(Shape<2>{33, 40}, 51);
    const auto B = normal<double>(Shape<2>{40, 17}, 52);
    auto cast = [](const auto& t) {
      auto o = Tensor<float, 2>::uninitialized(t.shape());
      for (Extent i = 0; i < t.numel(); ++i) o[i] = float(t[i]);
      return o;
    };
    auto c = ops::matmul(distribute_replicated<Layout<Shard<1>>>(mesh, cast(A)),
                         distribute_replicated<Layout<Shard<0>>>(mesh, cast(B)));
    const auto want = cast(ops::matmul(rep(mesh, A), rep(mesh, B)).to_local());
    report(diff("float matmul (S1, S0) -> P", full_tensor(c), want, 1e-5));
  });
}

TEST_CASE("matmul: run-time errors name the op, the extents and the rank", "[ops][matmul][errors]") {
  auto f = on_ranks(2, [](CommPtr w, auto report) {
    Mesh1 mesh(w, {2});
    auto a = rep(mesh, normal<double>(Shape<2>{4, 3}, 1));
    auto b = rep(mesh, normal<double>(Shape<2>{4, 5}, 2));
    try {
      (void)ops::matmul(a, b);
      report("no error for contracted extents 3 vs 4");
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.find("matmul") == std::string::npos || m.find("[4, 3]") == std::string::npos ||
          m.find("[4, 5]") == std::string::npos || m.find("rank " + std::to_string(w->rank())) == std::string::npos)
        report("message lacks the op, the extents or the rank: " + m);
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_ops_matmul
