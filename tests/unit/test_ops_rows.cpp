// Row and reduction ops (sum / mean / max, softmax / log_softmax, layer_norm / rms_norm,
// cross_entropy, embedding): every layout with a rule on 1-D meshes of 2-4 ranks (uneven
// extents) and 2-D meshes against the oracle, backwards against the oracle and finite
// differences, no collectives.
#include "test_ops_util.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_ops_rows {

using namespace ot;

namespace {

using LX = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Shard<2>>, Layout<Partial<>>,
                   Layout<Partial<ReduceOp::avg>>, Layout<Partial<ReduceOp::max>>>;
constexpr double tol = 1e-12;

template <int Kind, int Dim, class L, class Mesh, class Report>
void reduce_case(const Mesh& mesh, Report& report) {
  static constexpr const char* kinds[] = {"sum", "mean", "max"};
  const std::string where = std::string(kinds[Kind]) + "<" + std::to_string(Dim) + "> of " + names<L>() + " on mesh " +
                            to_string(mesh.shape());
  auto x = make_input<L>(mesh, normal<double>(Shape<3>{5, 7, 3}, 1), 1);
  const auto xf = full_tensor(x);
  auto fwd = [](const auto& t) {
    if constexpr (Kind == 0) return ops::sum<Dim>(t);
    else if constexpr (Kind == 1) return ops::mean<Dim>(t);
    else return ops::max<Dim>(t).values;
  };
  auto y = no_comm(where.c_str(), report, [&] { return fwd(x); });
  report(diff((where + " forward").c_str(), full_tensor(y), fwd(rep(mesh, xf)).to_local(), tol));
  using LG = typename grad_layout<typename decltype(y)::layout>::type;
  const auto dyf = normal<double>(y.shape(), 2);
  auto dy = make_input<LG>(mesh, dyf, 2);
  if constexpr (Kind < 2) {
    auto dx = no_comm(where.c_str(), report, [&] {
      if constexpr (Kind == 0) return ops::sum_backward<Dim>(dy, x);
      else return ops::mean_backward<Dim>(dy, x);
    });
    const auto want = Kind == 0 ? ops::sum_backward<Dim>(rep(mesh, dyf), rep(mesh, xf)) : ops::mean_backward<Dim>(rep(mesh, dyf), rep(mesh, xf));
    report(diff((where + " backward").c_str(), full_tensor(dx), want.to_local(), tol));
  } else if constexpr (!L::desc.has_partial()) {
    const auto saved = ops::max<Dim>(x);
    const auto ref = ops::max<Dim>(rep(mesh, xf));
    const auto want = ops::max_backward<Dim>(rep(mesh, dyf), rep(mesh, xf), ref).to_local();
    if constexpr (ops::detail::shards_any<L>(1u << Dim)) {
      auto global = redistribute<LG>(saved.values);  // the reduced maxima (communication, outside the op)
      auto dx = no_comm(where.c_str(), report, [&] { return ops::max_backward<Dim>(dy, x, saved, global); });
      report(diff((where + " backward").c_str(), full_tensor(dx), want, 0));
    } else {
      auto dx = no_comm(where.c_str(), report, [&] { return ops::max_backward<Dim>(dy, x, saved); });
      report(diff((where + " backward").c_str(), full_tensor(dx), want, 0));
    }
  }
}

template <int Kind, int Dim, class Ls, class Mesh, class Report>
int sweep_reduce(const Mesh& mesh, Report& report) {
  int n = 0;
  Singles<rules::Reduce{rules::Reduce::Kind(Kind), Dim}, Ls>::each(
      [&]<class L>() { reduce_case<Kind, Dim, L>(mesh, report); }, n);
  return n;
}

}  // namespace

static_assert(std::is_same_v<rules::sum_t<Layout<Shard<1>>, 1>, Layout<Partial<>>>);
static_assert(std::is_same_v<rules::mean_t<Layout<Shard<1>>, 1>, Layout<Partial<>>>);
static_assert(std::is_same_v<rules::max_t<Layout<Shard<1>>, 1>, Layout<Partial<ReduceOp::max>>>);
static_assert(!rules::outcome<rules::Rowwise<1>{2}, Layout<Shard<1>>>.ok);
static_assert(!rules::outcome<rules::CrossEntropy{}, Layout<Shard<1>>, Layout<Replicate>>.ok);

TEST_CASE("sum, mean, max over a dimension: every layout with a rule", "[ops][reduce]") {
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    // sum, mean: R, S0, S1 (-> Partial<sum>), S2, P, Pavg = 6; max: R, S0, S1 (-> Partial<max>), S2, Pmax = 5
    if (int n = sweep_reduce<0, 1, LX>(mesh, report); n != 6) report("sum swept " + std::to_string(n));
    if (int n = sweep_reduce<1, 1, LX>(mesh, report); n != 6) report("mean swept " + std::to_string(n));
    if (int n = sweep_reduce<2, 1, LX>(mesh, report); n != 5) report("max swept " + std::to_string(n));
    sweep_reduce<1, 0, LX>(mesh, report);
  });
  on_meshes_2d([](const Mesh2& mesh, auto report) {
    reduce_case<1, 1, Layout<Shard<1>, Shard<1>>>(mesh, report);
    reduce_case<0, 2, Layout<Shard<0>, Shard<2>>>(mesh, report);
    reduce_case<2, 0, Layout<Shard<0>, Shard<1>>>(mesh, report);
  });
}

TEST_CASE("softmax, log_softmax, layer_norm, rms_norm: rows split or replicated", "[ops][softmax][norm]") {
  using LR = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Shard<2>>, Layout<Partial<>>>;
  auto body = [](const auto& mesh, auto& report, auto tag) {
    using Ls = decltype(tag);
    const auto X = normal<double>(Shape<3>{5, 3, 6}, 3, 0.5, 2);
    const auto W = normal<double>(Shape<1>{6}, 4);
    const auto B = normal<double>(Shape<1>{6}, 5);
    int n = 0;
    Singles<rules::Rowwise<1>{3}, Ls>::each(
        [&]<class L>() {
          const std::string where = names<L>() + " on mesh " + to_string(mesh.shape());
          auto x = make_input<L>(mesh, X, 6);
          const auto xf = full_tensor(x);
          const auto dyf = normal<double>(X.shape(), 7);
          auto dy = make_input<L>(mesh, dyf, 7);
          auto w = rep(mesh, W);
          auto b = rep(mesh, B);
          auto [p, l, ln, rn] = no_comm(where.c_str(), report, [&] {
            return std::tuple{ops::softmax(x), ops::log_softmax(x), ops::layer_norm(x, w, b), ops::rms_norm(x, w)};
          });
          const auto xr = rep(mesh, xf), dyr = rep(mesh, dyf);
          const auto lnr = ops::layer_norm(xr, w, b), rnr = ops::rms_norm(xr, w);
          report(diff(("softmax " + where).c_str(), full_tensor(p), ops::softmax(xr).to_local(), tol));
          report(diff(("log_softmax " + where).c_str(), full_tensor(l), ops::log_softmax(xr).to_local(), tol));
          report(diff(("layer_norm " + where).c_str(), full_tensor(ln.y), lnr.y.to_local(), tol));
          report(diff(("rms_norm " + where).c_str(), full_tensor(rn.y), rnr.y.to_local(), tol));
          auto [dp, dl, gln, grn] = no_comm(where.c_str(), report, [&] {
            return std::tuple{ops::softmax_backward(dy, p), ops::log_softmax_backward(dy, l),
                              ops::layer_norm_backward(dy, x, w, ln.stats), ops::rms_norm_backward(dy, x, w, rn.stats)};
          });
          report(diff(("softmax_backward " + where).c_str(), full_tensor(dp),
                      ops::softmax_backward(dyr, ops::softmax(xr)).to_local(), tol));
          report(diff(("log_softmax_backward " + where).c_str(), full_tensor(dl),
                      ops::log_softmax_backward(dyr, ops::log_softmax(xr)).to_local(), tol));
          const auto glr = ops::layer_norm_backward(dyr, xr, w, lnr.stats);
          report(diff(("layer_norm dx " + where).c_str(), full_tensor(gln.dx), glr.dx.to_local(), tol));
          report(diff(("layer_norm dw " + where).c_str(), full_tensor(gln.dweight), glr.dweight.to_local(), tol));
          report(diff(("layer_norm db " + where).c_str(), full_tensor(gln.dbias), glr.dbias.to_local(), tol));
          const auto grr = ops::rms_norm_backward(dyr, xr, w, rnr.stats);
          report(diff(("rms_norm dx " + where).c_str(), full_tensor(grn.dx), grr.dx.to_local(), tol));
          report(diff(("rms_norm dw " + where).c_str(), full_tensor(grn.dweight), grr.dweight.to_local(), tol));
        },
        n);
    return n;
  };
  on_meshes_1d([&](const Mesh1& mesh, auto report) {
    if (int n = body(mesh, report, LR{}); n != 3) report("swept " + std::to_string(n) + ", expected 3 (R, S0, S1)");
  });
  on_meshes_2d([&](const Mesh2& mesh, auto report) {
    body(mesh, report, Layouts<Layout<Shard<0>, Shard<1>>, Layout<Shard<1>, Shard<1>>, Layout<Replicate, Shard<0>>>{});
  });
}

TEST_CASE("cross_entropy and embedding: every layout with a rule", "[ops][cross_entropy][embedding]") {
  auto body = [](const auto& mesh, auto& report) {
    constexpr std::size_t N = decltype(mesh.shape()){}.size();
    const auto logits = normal<double>(Shape<2>{7, 5}, 8, 0, 2);
    Tensor<std::int64_t, 1> tg(Shape<1>{7});
    for (Extent i = 0; i < 7; ++i) tg[i] = (i * 3) % 5;
    auto ce = [&]<class L>() {
      const std::string where = "cross_entropy of " + names<L>() + " on mesh " + to_string(mesh.shape());
      auto x = make_input<L>(mesh, logits, 9);
      auto t = distribute_replicated<L>(mesh, tg);
      auto [loss, stats] = no_comm(where.c_str(), report, [&] { return ops::cross_entropy(x, t); });
      const auto r = ops::cross_entropy(rep(mesh, logits), rep(mesh, tg));
      report(diff(where.c_str(), full_tensor(loss), r.loss.to_local(), tol));
      auto dl = no_comm(where.c_str(), report, [&] { return ops::cross_entropy_backward(x, t, stats, 0.7); });
      report(diff((where + " backward").c_str(), full_tensor(dl),
                  ops::cross_entropy_backward(rep(mesh, logits), rep(mesh, tg), r.stats, 0.7).to_local(), tol));
    };
    ce.template operator()<replicated_layout<N>>();
    ce.template operator()<uniform_layout<Shard<0>, N>>();

    const auto W = normal<double>(Shape<2>{11, 6}, 10);
    Tensor<std::int64_t, 2> ids(Shape<2>{3, 5});
    for (Extent i = 0; i < ids.numel(); ++i) ids[i] = (i * 7 + 2) % 11;
    auto emb = [&]<class LW, class LI>() {
      const std::string where = "embedding of " + names<LW, LI>() + " on mesh " + to_string(mesh.shape());
      auto w = distribute_replicated<LW>(mesh, W);
      auto id = distribute_replicated<LI>(mesh, ids);
      auto y = no_comm(where.c_str(), report, [&] { return ops::embedding(w, id); });
      const auto yr = ops::embedding(rep(mesh, W), rep(mesh, ids));
      report(diff(where.c_str(), full_tensor(y), yr.to_local(), 0));  // data movement: exact
      using LG = typename grad_layout<typename decltype(y)::layout>::type;
      const auto dyf = normal<double>(y.shape(), 11);
      auto dw = no_comm(where.c_str(), report, [&] { return ops::embedding_backward(make_input<LG>(mesh, dyf, 11), id, w); });
      report(diff((where + " backward").c_str(), full_tensor(dw),
                  ops::embedding_backward(rep(mesh, dyf), rep(mesh, ids), rep(mesh, W)).to_local(), tol));
      // accumulating into an existing gradient adds
      ops::embedding_backward_into(dw, make_input<LG>(mesh, dyf, 11), id);
      auto twice = ops::embedding_backward(rep(mesh, dyf), rep(mesh, ids), rep(mesh, W)).to_local();
      for (Extent i = 0; i < twice.numel(); ++i) twice[i] *= 2;
      report(diff((where + " accumulate").c_str(), full_tensor(dw), twice, tol));
    };
    if constexpr (N == 1) {
      int n = 0;
      Pairs<rules::Embedding{2}, Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Partial<>>>,
            Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>>>::each(
          [&]<class LW, class LI>() { emb.template operator()<LW, LI>(); }, n);
      // (R, R), (R, S0), (R, S1), (S0, R) vocabulary parallel, (S1, R) embedding dimension
      if (n != 5) report("embedding swept " + std::to_string(n) + ", expected 5");
    } else {
      emb.template operator()<Layout<Replicate, Shard<0>>, Layout<Shard<0>, Replicate>>();
      emb.template operator()<Layout<Shard<1>, Replicate>, Layout<Replicate, Shard<1>>>();
    }
  };
  on_meshes_1d([&](const Mesh1& mesh, auto report) { body(mesh, report); });
  on_meshes_2d([&](const Mesh2& mesh, auto report) { body(mesh, report); });
}

TEST_CASE("row and reduction backwards match finite differences (double, one rank)", "[ops][backward]") {
  on_one_rank([](const Mesh1& mesh, auto) {
    const auto X = normal<double>(Shape<3>{2, 3, 5}, 12, 0.3, 1.5), DY = normal<double>(Shape<3>{2, 3, 5}, 13);
    const auto W = normal<double>(Shape<1>{5}, 14);
    const auto B = normal<double>(Shape<1>{5}, 15);
    auto loss = [&](auto f) { return [&, f](const Tensor<double, 3>& v) { return dot(f(rep(mesh, v)).to_local(), DY); }; };
    const auto x = rep(mesh, X), dy = rep(mesh, DY);
    const auto w = rep(mesh, W), b = rep(mesh, B);
    check_fd("softmax", ops::softmax_backward(dy, ops::softmax(x)).to_local(),
             fd_grad(X, loss([](const auto& v) { return ops::softmax(v); })));
    check_fd("log_softmax", ops::log_softmax_backward(dy, ops::log_softmax(x)).to_local(),
             fd_grad(X, loss([](const auto& v) { return ops::log_softmax(v); })));
    const auto ln = ops::layer_norm(x, w, b);
    const auto gl = ops::layer_norm_backward(dy, x, w, ln.stats);
    check_fd("layer_norm dx", gl.dx.to_local(), fd_grad(X, loss([&](const auto& v) { return ops::layer_norm(v, w, b).y; })));
    check_fd("layer_norm dw", gl.dweight.to_local(), fd_grad(W, [&](const Tensor<double, 1>& v) {
               return dot(ops::layer_norm(x, rep(mesh, v), b).y.to_local(), DY); }));
    check_fd("layer_norm db", gl.dbias.to_local(), fd_grad(B, [&](const Tensor<double, 1>& v) {
               return dot(ops::layer_norm(x, w, rep(mesh, v)).y.to_local(), DY); }));
    const auto rn = ops::rms_norm(x, w);
    const auto gr = ops::rms_norm_backward(dy, x, w, rn.stats);
    check_fd("rms_norm dx", gr.dx.to_local(), fd_grad(X, loss([&](const auto& v) { return ops::rms_norm(v, w).y; })));
    check_fd("rms_norm dw", gr.dweight.to_local(), fd_grad(W, [&](const Tensor<double, 1>& v) {
               return dot(ops::rms_norm(x, rep(mesh, v)).y.to_local(), DY); }));
    const auto DS = normal<double>(Shape<3>{2, 1, 5}, 16);
    auto rloss = [&](auto f) { return [&, f](const Tensor<double, 3>& v) { return dot(f(rep(mesh, v)).to_local(), DS); }; };
    check_fd("sum", ops::sum_backward<1>(rep(mesh, DS), x).to_local(), fd_grad(X, rloss([](const auto& v) { return ops::sum<1>(v); })));
    check_fd("mean", ops::mean_backward<1>(rep(mesh, DS), x).to_local(), fd_grad(X, rloss([](const auto& v) { return ops::mean<1>(v); })));
    check_fd("max", ops::max_backward<1>(rep(mesh, DS), x, ops::max<1>(x)).to_local(),
             fd_grad(X, rloss([](const auto& v) { return ops::max<1>(v).values; })));
    // cross-entropy: d(loss)/d(logits)
    const auto L = normal<double>(Shape<2>{4, 6}, 17);
    Tensor<std::int64_t, 1> t(Shape<1>{4});
    for (Extent i = 0; i < 4; ++i) t[i] = (5 * i + 1) % 6;
    const auto ce = ops::cross_entropy(rep(mesh, L), rep(mesh, t));
    check_fd("cross_entropy", ops::cross_entropy_backward(rep(mesh, L), rep(mesh, t), ce.stats, 1.0).to_local(),
             fd_grad(L, [&](const Tensor<double, 2>& v) { return ops::cross_entropy(rep(mesh, v), rep(mesh, t)).loss.to_local()[0]; }));
    // embedding: d<embedding(W), dy>/dW
    const auto E = normal<double>(Shape<2>{4, 3}, 18);
    Tensor<std::int64_t, 1> ids(Shape<1>{5});
    for (Extent i = 0; i < 5; ++i) ids[i] = (3 * i) % 4;  // repeated ids accumulate
    const auto dE = normal<double>(Shape<2>{5, 3}, 19);
    check_fd("embedding", ops::embedding_backward(rep(mesh, dE), rep(mesh, ids), rep(mesh, E)).to_local(),
             fd_grad(E, [&](const Tensor<double, 2>& v) { return dot(ops::embedding(rep(mesh, v), rep(mesh, ids)).to_local(), dE); }));
  });
}

TEST_CASE("row ops: run-time errors name the op, the extents and the rank", "[ops][errors]") {
  auto f = on_ranks(2, [](CommPtr w, auto report) {
    Mesh1 mesh(w, {2});
    auto expect = [&](auto fn, std::initializer_list<const char*> frags) { expect_error(report, fn, frags); };
    auto x = distribute_replicated<Layout<Shard<0>>>(mesh, normal<double>(Shape<2>{4, 3}, 1));
    expect([&] { (void)ops::layer_norm(x, rep(mesh, ones<double>(Shape<1>{4})), rep(mesh, ones<double>(Shape<1>{3}))); },
           {"layer_norm", "[4]", "[4, 3]", "rank"});
    Tensor<std::int64_t, 1> bad(Shape<1>{2});
    bad[0] = 1, bad[1] = 9;
    expect([&] { (void)ops::embedding(rep(mesh, normal<double>(Shape<2>{5, 3}, 2)), rep(mesh, bad)); },
           {"embedding", "id 9", "[0, 5)"});
    expect([&] { (void)ops::cross_entropy(rep(mesh, normal<double>(Shape<2>{2, 5}, 3)), rep(mesh, bad)); },
           {"cross_entropy", "target 9"});
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_ops_rows
