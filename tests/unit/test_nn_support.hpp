// tests/unit/test_nn_support.hpp — checks shared by the nn module tests.
//
//   forward_backward(m, x, dy_of)  one micro-batch through the module protocol: forward, then
//                                  backward_input and backward_weight; returns (y, dx)
//   fd_check(m, x, r)              every gradient against central finite differences (one rank, double)
//   run_module(m, mesh, x, r)      forward + backward on a mesh: full output, input gradient and
//                                  every parameter's whole (reduced) gradient
//
// The objective is J = sum(y * r) for a fixed random r, so dJ/dy = r in every layout.
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "support/on_ranks.hpp"

namespace dtensor::testing {

using NnMesh = DeviceMesh<"dp", "tp">;

template <class Y, std::size_t R>
double objective(const Y& y, const Tensor<double, R>& r) {
  const auto full = full_tensor(y);
  double s = 0;
  for (Extent i = 0; i < full.numel(); ++i) s += full[i] * r[i];
  return s;
}

/// One micro-batch through the module protocol: forward, backward_input with dy_of(y), then
/// backward_weight. Returns (y, dx).
template <class M, class X, class DyOf>
auto forward_backward(M& m, const X& x, DyOf dy_of) {
  auto [y, saved] = m.forward(x);
  auto [dx, weight_ctx] = m.backward_input(std::move(saved), dy_of(y));
  m.backward_weight(std::move(weight_ctx));
  return std::pair{std::move(y), std::move(dx)};
}

/// dy = r, laid out like y.
template <std::size_t R>
auto dy_from(const Tensor<double, R>& r) {
  return [&r](const auto& y) { return distribute_replicated<typename std::remove_cvref_t<decltype(y)>::layout>(y.mesh(), r); };
}

/// Central differences at up to `samples` entries of a span, against the analytic gradient.
template <class J>
std::string fd_span(const std::string& what, std::span<double> v, std::span<const double> analytic, J objective_of,
                    int samples = 10) {
  const double h = 1e-6;
  const std::size_t n = v.size(), stride = std::max<std::size_t>(1, n / std::size_t(samples));
  for (std::size_t i = (n > 1 ? 1 : 0); i < n; i += stride) {
    const double keep = v[i];
    v[i] = keep + h;
    const double jp = objective_of();
    v[i] = keep - h;
    const double jm = objective_of();
    v[i] = keep;
    const double num = (jp - jm) / (2 * h), ana = analytic[i];
    if (std::abs(num - ana) > 1e-6 + 1e-5 * std::abs(num))
      return detail::cat(what, "[", i, "]: analytic ", ana, ", finite difference ", num);
  }
  return {};
}

/// Every gradient of a module (input and parameters) against finite differences, one rank.
/// The forwards of the objective drop their saved state: the module keeps nothing between calls.
template <class M, class X, std::size_t R>
std::string fd_check(M& m, X x, const Tensor<double, R>& r) {
  nn::ParamList<double, 2> ps;
  nn::collect(m, ps);
  nn::zero_grad(m);
  auto [y, dx] = forward_backward(m, x, dy_from(r));
  auto J = [&] { return objective(m.forward(x).y, r); };
  if (auto e = fd_span("dx", x.local().span(), dx.to_local().span(), J); !e.empty()) return e;
  for (auto& p : ps)
    if (auto e = fd_span(p.name, p.value, std::span<const double>(p.grad), J); !e.empty()) return e;
  return {};
}

template <std::size_t R>
struct ModuleRun {
  Tensor<double, R> y, dx;
  std::vector<std::pair<std::string, std::vector<double>>> grads;  // per parameter, whole, after the gradient syncs
};

/// Every parameter's whole gradient (after the syncs), in registration order.
template <class M>
std::vector<std::pair<std::string, std::vector<double>>> whole_grads(M& m) {
  std::vector<std::pair<std::string, std::vector<double>>> out;
  nn::for_each_parameter(m, [&](auto& p) {
    if (!p.defined()) return;
    const auto g = full_tensor(p.grad());
    out.emplace_back(p.name(), std::vector<double>(g.span().begin(), g.span().end()));
  });
  return out;
}

/// Forward (x laid out as the module's input), backward of J, gradient syncs (sequence
/// parallel, data parallel), and each parameter's whole gradient.
template <class M, class X, std::size_t R>
ModuleRun<R> run_module(M& m, const NnMesh& mesh, const X& x, const Tensor<double, R>& r) {
  nn::ParamList<double, 2> ps;
  nn::collect(m, ps);
  nn::zero_grad(m);
  auto [y, dx] = forward_backward(m, x, dy_from(r));
  parallel::sequence_parallel_grads(ps, mesh);
  parallel::DataParallel<NnMesh>(mesh).all_reduce_gradients(ps);
  return {full_tensor(y), full_tensor(dx), whole_grads(m)};
}

/// "" or what differs between a distributed run and the one-rank run (rtol 0: bit for bit).
template <std::size_t R>
std::string compare_runs(const ModuleRun<R>& got, const ModuleRun<R>& ref, double rtol = 1e-11) {
  const double atol = rtol == 0 ? 0 : 1e-13;
  if (auto c = compare(got.y, ref.y, {.rtol = rtol, .atol = atol}); !c) return "output: " + c.message;
  if (auto c = compare(got.dx, ref.dx, {.rtol = rtol, .atol = atol}); !c) return "input gradient: " + c.message;
  if (got.grads.size() != ref.grads.size()) return "different parameters";
  for (std::size_t i = 0; i < ref.grads.size(); ++i) {
    const auto& [name, g] = got.grads[i];
    const auto& [ref_name, w] = ref.grads[i];
    if (name != ref_name || g.size() != w.size()) return detail::cat("parameter ", name, " vs ", ref_name);
    for (std::size_t k = 0; k < w.size(); ++k)
      if (!(std::abs(g[k] - w[k]) <= rtol * std::abs(w[k]) + atol))
        return detail::cat("gradient of ", name, "[", k, "]: ", g[k], " vs ", w[k]);
  }
  return {};
}

}  // namespace dtensor::testing
