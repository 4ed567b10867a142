// Helpers shared by the ops tests (tests/unit/test_ops_*.cpp): distributed inputs with genuine
// Partial pieces, the oracle comparison, the no-communication check, the sweep over every layout
// pair an op has a rule for, and finite-difference gradients.
//
// The oracle of an op is the op on the logical (full_tensor) inputs on one rank: every output
// must match it after full_tensor, bit for bit for pure data movement, within `tol` where the
// distributed run adds partial sums in another order.
#pragma once

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/dtensor.hpp"
#include "dtensor/ops/all.hpp"
#include "support/on_ranks.hpp"
#include "support/gradcheck.hpp"
#include "support/oracle.hpp"

namespace ot {

using namespace dtensor;
using namespace dtensor::testing;
namespace ops = dtensor::ops;
namespace rules = dtensor::ops::rules;

using Mesh1 = DeviceMesh<"tp">;
using Mesh2 = DeviceMesh<"dp", "tp">;

template <class... L>
struct Layouts {};

/// A DTensor of layout L whose logical value is a random tensor: Shard / Replicate pieces are
/// cut from it, and along each Partial mesh dimension the pieces are the value plus noise that
/// depends on the rank's coordinate there (so a Partial really is a sum / average / maximum of
/// different pieces). Returns the DTensor; its logical value is full_tensor(result).
template <LayoutType L, class T, std::size_t R, class Mesh>
auto make_input(const Mesh& mesh, const Tensor<T, R>& base, std::uint64_t seed) {
  constexpr auto& d = L::desc;
  auto x = distribute_replicated<L>(mesh, base);
  if constexpr (d.has_partial()) {
    std::uint64_t s = seed * 1000003u;
    for (std::size_t i = 0; i < Mesh::ndim; ++i)
      if (d.placements[i].is_partial()) s = s * 31u + std::uint64_t(mesh.coordinate(i) + 1);
    const auto noise = uniform<T>(base.shape(), s, -1, 1);
    const auto piece = oracle_piece(noise, d, mesh.shape(), mesh.coordinate());
    auto& l = x.local();
    for (Extent i = 0; i < l.numel(); ++i) l[i] = T(l[i] + piece[i]);
  }
  return x;
}

/// Runs f inside a CommLog scope and reports every collective it issued (ops must issue none).
template <class Report, class F>
auto no_comm(const char* what, Report& report, F&& f) {
  CommLog log;
  auto r = f();
  if (log.size() != 0) report(std::string(what) + " issued collectives:\n" + log.to_string());
  return r;
}

/// "" when a (the distributed result, gathered) matches b (the oracle) within tol.
template <class T, std::size_t R>
std::string diff(const char* what, const Tensor<T, R>& a, const Tensor<T, R>& b, double tol) {
  if (tol == 0) return equal(a, b) ? "" : std::string(what) + " differs bitwise: " + compare(a, b).message;
  double scale = 1e-30;
  for (Extent i = 0; i < b.numel(); ++i) scale = std::max(scale, std::abs(double(b[i])));
  auto c = compare(a, b, {.rtol = tol, .atol = tol * scale});
  return c.ok ? "" : std::string(what) + ": " + c.message;
}

/// The layout name for messages.
template <class... L>
std::string names() {
  std::string s;
  ((s += (s.empty() ? "" : " x ") + to_string(L::desc)), ...);
  return s;
}

/// The all-Replicate twin of a full tensor on mesh (the oracle runs the op on these).
template <class Mesh, class T, std::size_t R>
auto rep(const Mesh& mesh, const Tensor<T, R>& t) {
  return distribute_replicated<replicated_layout<Mesh::ndim>>(mesh, t);
}

/// Calls f.template operator()<LA, LB>() for every pair in LAs x LBs that `Rule` has a rule
/// for; counts them in `n`.
template <auto Rule, class LAs, class LBs>
struct Pairs;
template <auto Rule, class... LA, class... LB>
struct Pairs<Rule, Layouts<LA...>, Layouts<LB...>> {
  template <class F>
  static void each(F&& f, int& n) {
    (each_b<LA>(f, n), ...);
  }
  template <class A, class F>
  static void each_b(F& f, int& n) {
    ((rules::outcome<Rule, A, LB>.ok && rules::outcome<Rule, A, LB>.order_ok ? (void)(++n, call<A, LB>(f)) : void()),
     ...);
  }
  template <class A, class B, class F>
  static void call(F& f) {
    if constexpr (rules::outcome<Rule, A, B>.ok && rules::outcome<Rule, A, B>.order_ok) f.template operator()<A, B>();
  }
};

/// Calls f.template operator()<L>() for every L of Ls that `Rule` has a rule for.
template <auto Rule, class Ls>
struct Singles;
template <auto Rule, class... L>
struct Singles<Rule, Layouts<L...>> {
  template <class F>
  static void each(F&& f, int& n) {
    (call<L>(f, n), ...);
  }
  template <class A, class F>
  static void call(F& f, int& n) {
    if constexpr (rules::outcome<Rule, A>.ok) {
      ++n;
      f.template operator()<A>();
    }
  }
};

using dtensor::testing::dot;
using dtensor::testing::fd_grad;

/// Analytic against numeric gradient, relative to the largest entry.
template <std::size_t R>
void check_fd(const char* what, const Tensor<double, R>& analytic, const Tensor<double, R>& numeric,
              double rtol = 1e-6) {
  const auto c = dtensor::testing::grad_compare(analytic, numeric, rtol);
  INFO(what << ": " << c.message);
  CHECK(c.ok);
}

/// Reports unless fn() throws a dtensor::Error whose message holds every fragment.
template <class Report, class F>
void expect_error(Report& report, F&& fn, std::initializer_list<const char*> frags) {
  try {
    fn();
    report("no error");
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* s : frags)
      if (m.find(s) == std::string::npos) report(std::string("message lacks '") + s + "': " + m);
  }
}

/// Runs fn(mesh, report) on a 1-rank mesh and collects failures into Catch2.
template <class F>
void on_one_rank(F&& fn) {
  auto f = on_ranks(1, [&](CommPtr w, auto report) { fn(Mesh1(w, {1}), report); });
  INFO(summary(f));
  CHECK(f.empty());
}

/// Runs fn(mesh, report) on 1-D meshes of 2, 3 and 4 ranks and a 2 x 2 mesh... as given.
template <class F>
void on_meshes_1d(F&& fn) {
  for (int n : {2, 3, 4}) {
    auto f = on_ranks(n, [&](CommPtr w, auto report) { fn(Mesh1(w, {n}), report); });
    INFO(n << " ranks: " << summary(f));
    CHECK(f.empty());
  }
}
template <class F>
void on_meshes_2d(F&& fn) {
  for (auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr w, auto report) { fn(Mesh2(w, shape), report); });
    INFO("mesh " << shape[0] << "x" << shape[1] << ": " << summary(f));
    CHECK(f.empty());
  }
}

}  // namespace ot
