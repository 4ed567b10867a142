// Pointwise ops (add, sub, mul with broadcasting, scale, bias_add, gelu, relu, silu, exp): every
// layout with a rule on 1-D and 2-D meshes against the oracle, backwards against the oracle and
// finite differences, no collectives, run-time errors.
#include "test_ops_util.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_ops_pointwise {

using namespace ot;

namespace {

using L1 = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Partial<>>,
                   Layout<Partial<ReduceOp::avg>>, Layout<Partial<ReduceOp::max>>>;
using L2 = Layouts<Layout<Replicate, Replicate>, Layout<Shard<0>, Shard<1>>, Layout<Shard<1>, Replicate>,
                   Layout<Partial<>, Shard<0>>, Layout<Replicate, Partial<>>, Layout<Shard<0>, Shard<0>>>;

constexpr double tol = 1e-12;

/// Extents for a binary op under layouts LA, LB: where one operand is split and the other
/// Replicate on a mesh dimension, the Replicate one broadcasts (extent 1) along that dimension.
template <class LA, class LB>
std::pair<Shape<2>, Shape<2>> binary_shapes(Shape<2> full) {
  Shape<2> a = full, b = full;
  for (std::size_t i = 0; i < LA::desc.placements.size(); ++i) {
    const auto &pa = LA::desc.placements[i], &pb = LB::desc.placements[i];
    if (pa.is_shard() && pb.is_replicate()) b[std::size_t(pa.dim)] = 1;
    if (pb.is_shard() && pa.is_replicate()) a[std::size_t(pb.dim)] = 1;
  }
  return {a, b};
}

template <int Op, class LA, class LB, class Mesh, class Report>
void binary_case(const Mesh& mesh, Report& report) {
  static constexpr const char* op_names[] = {"add", "sub", "mul"};
  const std::string where = std::string(op_names[Op]) + " of " + names<LA, LB>() + " on mesh " + to_string(mesh.shape());
  const auto [sa, sb] = binary_shapes<LA, LB>(Shape<2>{7, 5});
  auto a = make_input<LA>(mesh, normal<double>(sa, 1), 1);
  auto b = make_input<LB>(mesh, normal<double>(sb, 2), 2);
  const auto af = full_tensor(a), bf = full_tensor(b);
  auto fwd = [](const auto& x, const auto& y) {
    if constexpr (Op == 0) return ops::add(x, y);
    else if constexpr (Op == 1) return ops::sub(x, y);
    else return ops::mul(x, y);
  };
  auto bwd = [](const auto& dz, const auto& x, const auto& y) {
    if constexpr (Op == 0) return ops::add_backward(dz, x, y);
    else if constexpr (Op == 1) return ops::sub_backward(dz, x, y);
    else return ops::mul_backward(dz, x, y);
  };
  auto c = no_comm(where.c_str(), report, [&] { return fwd(a, b); });
  report(diff((where + " forward").c_str(), full_tensor(c), fwd(rep(mesh, af), rep(mesh, bf)).to_local(), tol));
  using LG = typename grad_layout<typename decltype(c)::layout>::type;
  const auto dzf = normal<double>(c.shape(), 3);
  auto g = no_comm(where.c_str(), report, [&] { return bwd(make_input<LG>(mesh, dzf, 3), a, b); });
  const auto gw = bwd(rep(mesh, dzf), rep(mesh, af), rep(mesh, bf));
  report(diff((where + " da").c_str(), full_tensor(g.da), gw.da.to_local(), tol));
  report(diff((where + " db").c_str(), full_tensor(g.db), gw.db.to_local(), tol));
}

template <int Op, class Ls, class Mesh, class Report>
int sweep_binary(const Mesh& mesh, Report& report) {
  int n = 0;
  Pairs<rules::Binary{Op == 2 ? rules::Binary::mul : rules::Binary::add}, Ls, Ls>::each(
      [&]<class LA, class LB>() { binary_case<Op, LA, LB>(mesh, report); }, n);
  return n;
}

/// An activation f with backward fb (fb(dy, saved)); saved_is_output for exp.
template <class L, class Mesh, class Report, class F, class FB>
void unary_case(const char* name, const Mesh& mesh, Report& report, F f, FB fb, bool saved_is_output) {
  const std::string where = std::string(name) + " of " + names<L>() + " on mesh " + to_string(mesh.shape());
  auto x = make_input<L>(mesh, normal<double>(Shape<3>{5, 3, 7}, 4), 4);
  const auto xf = full_tensor(x);
  auto y = no_comm(where.c_str(), report, [&] { return f(x); });
  const auto yw = f(rep(mesh, xf));
  report(diff((where + " forward").c_str(), full_tensor(y), yw.to_local(), tol));
  const auto dyf = normal<double>(x.shape(), 5);
  auto dy = make_input<L>(mesh, dyf, 5);
  auto dx = no_comm(where.c_str(), report, [&] { return saved_is_output ? fb(dy, y) : fb(dy, x); });
  const auto dxw = saved_is_output ? fb(rep(mesh, dyf), yw) : fb(rep(mesh, dyf), rep(mesh, xf));
  report(diff((where + " backward").c_str(), full_tensor(dx), dxw.to_local(), tol));
}

template <class Ls, class Mesh, class Report>
int sweep_unary(const Mesh& mesh, Report& report) {
  int n = 0;
  Singles<rules::Unary{false}, Ls>::each(
      [&]<class L>() {
        unary_case<L>("gelu", mesh, report, [](const auto& x) { return ops::gelu(x); },
                      [](const auto& dy, const auto& x) { return ops::gelu_backward(dy, x); }, false);
        unary_case<L>("relu", mesh, report, [](const auto& x) { return ops::relu(x); },
                      [](const auto& dy, const auto& x) { return ops::relu_backward(dy, x); }, false);
        unary_case<L>("silu", mesh, report, [](const auto& x) { return ops::silu(x); },
                      [](const auto& dy, const auto& x) { return ops::silu_backward(dy, x); }, false);
        unary_case<L>("exp", mesh, report, [](const auto& x) { return ops::exp(x); },
                      [](const auto& dy, const auto& y) { return ops::exp_backward(dy, y); }, true);
      },
      n);
  return n;
}

}  // namespace

static_assert(std::is_same_v<rules::add_t<Layout<Partial<>>, Layout<Partial<>>>, Layout<Partial<>>>);
static_assert(!rules::outcome<rules::Binary{rules::Binary::mul}, Layout<Partial<>>, Layout<Partial<>>>.ok);
static_assert(std::is_same_v<rules::mul_t<Layout<Partial<>>, Layout<Replicate>>, Layout<Partial<>>>);
static_assert(!rules::outcome<rules::Unary{false}, Layout<Partial<>>>.ok);
static_assert(std::is_same_v<rules::linear_unary_t<Layout<Partial<>>>, Layout<Partial<>>>);
static_assert(!rules::outcome<rules::Unary{true}, Layout<Partial<ReduceOp::max>>>.ok);

TEST_CASE("add, sub, mul: every layout pair with a rule, broadcasting, on 1-d meshes", "[ops][pointwise]") {
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    // add/sub: R R, S0 S0, S1 S1, S0 R, R S0, S1 R, R S1, P P, Pavg Pavg = 9
    if (int n = sweep_binary<0, L1>(mesh, report); n != 9) report("add swept " + std::to_string(n) + ", expected 9");
    if (int n = sweep_binary<1, L1>(mesh, report); n != 9) report("sub swept " + std::to_string(n) + ", expected 9");
    // mul: the seven without Partial, and P R, R P, Pavg R, R Pavg = 11
    if (int n = sweep_binary<2, L1>(mesh, report); n != 11) report("mul swept " + std::to_string(n) + ", expected 11");
  });
}

TEST_CASE("add, sub, mul on 2-d meshes", "[ops][pointwise]") {
  on_meshes_2d([](const Mesh2& mesh, auto report) {
    int n = sweep_binary<0, L2>(mesh, report) + sweep_binary<2, L2>(mesh, report);
    if (n < 12) report("swept only " + std::to_string(n));
  });
}

TEST_CASE("scale and bias_add: every layout with a rule", "[ops][pointwise]") {
  using LX = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Shard<2>>, Layout<Partial<>>,
                     Layout<Partial<ReduceOp::avg>>, Layout<Partial<ReduceOp::max>>>;
  using LB = Layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Partial<>>>;
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    const auto X = normal<double>(Shape<3>{5, 3, 7}, 6);
    int n = 0;
    Singles<rules::Unary{true}, LX>::each(
        [&]<class L>() {
          const std::string where = "scale of " + names<L>();
          auto x = make_input<L>(mesh, X, 6);
          auto y = no_comm(where.c_str(), report, [&] { return ops::scale(x, -1.5); });
          report(diff(where.c_str(), full_tensor(y), ops::scale(rep(mesh, full_tensor(x)), -1.5).to_local(), tol));
          auto dy = make_input<typename grad_layout<L>::type>(mesh, X, 7);
          auto dx = no_comm(where.c_str(), report, [&] { return ops::scale_backward(dy, -1.5); });
          report(diff((where + " backward").c_str(), full_tensor(dx), ops::scale(rep(mesh, full_tensor(dy)), -1.5).to_local(), tol));
        },
        n);
    if (n != 6) report("scale swept " + std::to_string(n) + ", expected 6");  // all but Partial<max>

    const auto B = normal<double>(Shape<1>{7}, 8);
    int nb = 0;
    Pairs<rules::BiasAdd{3}, LX, LB>::each(
        [&]<class L, class LBias>() {
          const std::string where = "bias_add of " + names<L, LBias>();
          auto x = make_input<L>(mesh, X, 9);
          auto b = make_input<LBias>(mesh, B, 10);
          const auto xf = full_tensor(x), bf = full_tensor(b);
          auto y = no_comm(where.c_str(), report, [&] { return ops::bias_add(x, b); });
          report(diff(where.c_str(), full_tensor(y), ops::bias_add(rep(mesh, xf), rep(mesh, bf)).to_local(), tol));
          {  // a temporary x (nn::Linear's matmul output) is added to in place: same values, its storage
            auto moved = x;
            const double* storage = moved.to_local().data();
            auto ym = no_comm(where.c_str(), report, [&] { return ops::bias_add(std::move(moved), b); });
            report(diff((where + " of a temporary").c_str(), full_tensor(ym), full_tensor(y), 0));
            if (ym.to_local().numel() > 0 && ym.to_local().data() != storage)
              report(where + ": the temporary's storage was copied");
            if (x.to_local().numel() > 0 && y.to_local().data() == x.to_local().data())
              report(where + ": an lvalue x shares its storage with the result");
          }
          using LG = typename grad_layout<typename decltype(y)::layout>::type;
          const auto dyf = normal<double>(y.shape(), 11);
          auto g = no_comm(where.c_str(), report, [&] { return ops::bias_add_backward(make_input<LG>(mesh, dyf, 11)); });
          const auto gw = ops::bias_add_backward(rep(mesh, dyf));
          report(diff((where + " dx").c_str(), full_tensor(g.dx), gw.dx.to_local(), tol));
          report(diff((where + " dbias").c_str(), full_tensor(g.dbias), gw.dbias.to_local(), tol));
        },
        nb);
    // (S0, R), (S1, R), (S2, S0), (R, R), (P, P)
    if (nb != 5) report("bias_add swept " + std::to_string(nb) + ", expected 5");
  });
  on_meshes_2d([](const Mesh2& mesh, auto report) {
    const auto X = normal<double>(Shape<3>{5, 3, 7}, 6);
    auto x = make_input<Layout<Shard<0>, Shard<2>>>(mesh, X, 1);
    auto b = make_input<Layout<Replicate, Shard<0>>>(mesh, normal<double>(Shape<1>{7}, 2), 2);
    auto y = no_comm("bias_add 2-d", report, [&] { return ops::bias_add(x, b); });
    report(diff("bias_add 2-d", full_tensor(y), ops::bias_add(rep(mesh, full_tensor(x)), rep(mesh, full_tensor(b))).to_local(), tol));
    auto g = ops::bias_add_backward(y);
    static_assert(std::is_same_v<typename decltype(g.dbias)::layout, Layout<Partial<>, Shard<0>>>);
    report(diff("bias_add 2-d dbias", full_tensor(g.dbias), ops::bias_add_backward(rep(mesh, full_tensor(y))).dbias.to_local(), tol));
  });
}

TEST_CASE("gelu, relu, silu, exp: every layout with a rule, backward with split and Partial gradients",
          "[ops][activations]") {
  on_meshes_1d([](const Mesh1& mesh, auto report) {
    if (int n = sweep_unary<L1>(mesh, report); n != 3) report("swept " + std::to_string(n) + ", expected 3");
    // A Replicate x with a Partial<sum> gradient (the backward is linear in dy): Partial<sum>.
    const auto X = normal<double>(Shape<2>{4, 6}, 12), DY = normal<double>(Shape<2>{4, 6}, 13);
    auto x = rep(mesh, X);
    auto dy = make_input<Layout<Partial<>>>(mesh, DY, 13);
    auto dx = no_comm("gelu_backward (R, P)", report, [&] { return ops::gelu_backward(dy, x); });
    static_assert(std::is_same_v<typename decltype(dx)::layout, Layout<Partial<>>>);
    report(diff("gelu_backward (R, P)", full_tensor(dx), ops::gelu_backward(rep(mesh, full_tensor(dy)), x).to_local(), tol));
  });
  on_meshes_2d([](const Mesh2& mesh, auto report) {
    if (int n = sweep_unary<L2>(mesh, report); n != 4) report("swept " + std::to_string(n) + ", expected 4");
  });
}

TEST_CASE("pointwise backwards match finite differences (double, one rank)", "[ops][pointwise][backward]") {
  on_one_rank([](const Mesh1& mesh, auto) {
    const auto A = normal<double>(Shape<3>{3, 1, 4}, 21), B = normal<double>(Shape<3>{1, 5, 4}, 22);
    const auto dz = normal<double>(Shape<3>{3, 5, 4}, 23);
    auto fd2 = [&](const char* name, auto f, auto fb) {
      const auto g = fb(rep(mesh, dz), rep(mesh, A), rep(mesh, B));
      check_fd(name, g.da.to_local(), fd_grad(A, [&](const Tensor<double, 3>& v) { return dot(f(rep(mesh, v), rep(mesh, B)).to_local(), dz); }));
      check_fd(name, g.db.to_local(), fd_grad(B, [&](const Tensor<double, 3>& v) { return dot(f(rep(mesh, A), rep(mesh, v)).to_local(), dz); }));
    };
    fd2("add", [](const auto& a, const auto& b) { return ops::add(a, b); },
        [](const auto& g, const auto& a, const auto& b) { return ops::add_backward(g, a, b); });
    fd2("sub", [](const auto& a, const auto& b) { return ops::sub(a, b); },
        [](const auto& g, const auto& a, const auto& b) { return ops::sub_backward(g, a, b); });
    fd2("mul", [](const auto& a, const auto& b) { return ops::mul(a, b); },
        [](const auto& g, const auto& a, const auto& b) { return ops::mul_backward(g, a, b); });

    const auto X = normal<double>(Shape<2>{4, 6}, 24), DY = normal<double>(Shape<2>{4, 6}, 26);
    const auto Bias = normal<double>(Shape<1>{6}, 25);
    const auto gb = ops::bias_add_backward(rep(mesh, DY));
    check_fd("bias_add dx", gb.dx.to_local(), fd_grad(X, [&](const Tensor<double, 2>& v) { return dot(ops::bias_add(rep(mesh, v), rep(mesh, Bias)).to_local(), DY); }));
    check_fd("bias_add db", gb.dbias.to_local(), fd_grad(Bias, [&](const Tensor<double, 1>& v) { return dot(ops::bias_add(rep(mesh, X), rep(mesh, v)).to_local(), DY); }));
    check_fd("scale", ops::scale_backward(rep(mesh, DY), 0.3).to_local(),
             fd_grad(X, [&](const Tensor<double, 2>& v) { return dot(ops::scale(rep(mesh, v), 0.3).to_local(), DY); }));
    auto fd1 = [&](const char* name, auto f, auto fb, bool saved_is_output) {
      const auto x = rep(mesh, X);
      const auto dx = saved_is_output ? fb(rep(mesh, DY), f(x)) : fb(rep(mesh, DY), x);
      check_fd(name, dx.to_local(), fd_grad(X, [&](const Tensor<double, 2>& v) { return dot(f(rep(mesh, v)).to_local(), DY); }));
    };
    fd1("gelu", [](const auto& x) { return ops::gelu(x); }, [](const auto& g, const auto& x) { return ops::gelu_backward(g, x); }, false);
    fd1("relu", [](const auto& x) { return ops::relu(x); }, [](const auto& g, const auto& x) { return ops::relu_backward(g, x); }, false);
    fd1("silu", [](const auto& x) { return ops::silu(x); }, [](const auto& g, const auto& x) { return ops::silu_backward(g, x); }, false);
    fd1("exp", [](const auto& x) { return ops::exp(x); }, [](const auto& g, const auto& y) { return ops::exp_backward(g, y); }, true);
  });
}

TEST_CASE("pointwise run-time errors: broadcast against a split dimension, bias extents", "[ops][pointwise][errors]") {
  auto f = on_ranks(2, [](CommPtr w, auto report) {
    Mesh1 mesh(w, {2});
    auto expect = [&](auto fn, std::initializer_list<const char*> frags) { expect_error(report, fn, frags); };
    auto x = distribute_replicated<Layout<Shard<0>>>(mesh, normal<double>(Shape<2>{4, 3}, 1));
    auto y = rep(mesh, normal<double>(Shape<2>{4, 3}, 2));  // Replicate with full extent 4 along the split dimension
    expect([&] { (void)ops::add(x, y); }, {"add", "[4, 3]", "broadcast", "rank"});
    auto b = rep(mesh, normal<double>(Shape<1>{4}, 3));
    expect([&] { (void)ops::bias_add(x, b); }, {"bias_add", "[4]", "[4, 3]"});
    expect([&] { (void)ops::gelu_backward(x, distribute_replicated<Layout<Shard<0>>>(mesh, normal<double>(Shape<2>{5, 3}, 4))); },
           {"gelu_backward", "[4, 3]", "[5, 3]"});
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_ops_pointwise
