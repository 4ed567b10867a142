// tests/unit/test_nn_support.hpp — checks shared by the nn module tests.
//
//   fd_check(module, x, r)          backward against central finite differences (one rank, double)
//   run_module(world, shape, make)  forward + backward on a mesh: full output, input gradient and
//                                   the global norm of each parameter's (reduced) gradient
//
// The objective is J = sum(y * r) for a fixed random r, so dJ/dy = r in every layout.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "support/on_ranks.hpp"

namespace dtensor::testing {

using NnMesh = DeviceMesh<"dp", "tp">;

template <class Y>
double objective(const Y& y, const Tensor<double, 2>& r) {
  const auto full = full_tensor(y);
  double s = 0;
  for (Extent i = 0; i < full.numel(); ++i) s += full[i] * r[i];
  return s;
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
/// fwd(x) -> y, bwd(dy) -> dx (the module's backward_input + backward_weight).
template <class M, class X, class Fwd, class Bwd>
std::string fd_check(M& m, X x, const Tensor<double, 2>& r, Fwd fwd, Bwd bwd) {
  const auto& mesh = x.mesh();
  nn::ParamList<double, 2> ps;
  m.collect(ps);
  for (auto& p : ps) p.zero_grad();
  auto y = fwd(x);
  auto dx = bwd(distribute_replicated<typename decltype(y)::layout>(mesh, r));
  auto J = [&] {
    const double s = objective(fwd(x), r);
    m.release();
    return s;
  };
  if (auto e = fd_span("dx", x.local().span(), dx.to_local().span(), J); !e.empty()) return e;
  for (auto& p : ps)
    if (auto e = fd_span(p.name, p.value, std::span<const double>(p.grad), J); !e.empty()) return e;
  return {};
}

struct ModuleRun {
  Tensor<double, 2> y, dx;
  std::vector<std::pair<std::string, double>> grad_norms;  // per parameter, after the gradient syncs
};

/// Forward (x_full distributed to the module's input layout), backward of J, gradient syncs
/// (sequence parallel, data parallel), and each parameter's global gradient norm.
template <class M, class Fwd, class Bwd>
ModuleRun run_module(M& m, const NnMesh& mesh, const auto& x, const Tensor<double, 2>& r, Fwd fwd, Bwd bwd) {
  nn::ParamList<double, 2> ps;
  m.collect(ps);
  for (auto& p : ps) p.zero_grad();
  auto y = fwd(x);
  auto dx = bwd(distribute_replicated<typename decltype(y)::layout>(mesh, r));
  parallel::sequence_parallel_grads(ps, mesh);
  parallel::DataParallel<NnMesh>(mesh).all_reduce_gradients(ps);
  ModuleRun out{full_tensor(y), full_tensor(dx), {}};
  for (const auto& p : ps) out.grad_norms.emplace_back(p.name, optim::grad_norm(nn::ParamList<double, 2>{p}, mesh));
  return out;
}

/// "" or what differs between a distributed run and the one-rank run.
inline std::string compare_runs(const ModuleRun& got, const ModuleRun& ref, double rtol = 1e-11) {
  if (auto c = compare(got.y, ref.y, {.rtol = rtol, .atol = 1e-13}); !c) return "output: " + c.message;
  if (auto c = compare(got.dx, ref.dx, {.rtol = rtol, .atol = 1e-13}); !c) return "input gradient: " + c.message;
  if (got.grad_norms.size() != ref.grad_norms.size()) return "different parameters";
  for (std::size_t i = 0; i < ref.grad_norms.size(); ++i) {
    const auto& [n, g] = got.grad_norms[i];
    const double w = ref.grad_norms[i].second;
    if (n != ref.grad_norms[i].first || std::abs(g - w) > rtol * std::abs(w) + 1e-13)
      return detail::cat("gradient norm of ", n, ": ", g, " vs ", w, " (", ref.grad_norms[i].first, ")");
  }
  return {};
}

/// A module's forward, and its backward as the input gradient followed by the weight gradient,
/// as callables for run_module.
inline auto fwd = [](auto& m) { return [&m](const auto& x) { return m.forward(x); }; };
inline auto bwd = [](auto& m) {
  return [&m](const auto& dy) {
    auto dx = m.backward_input(dy);
    m.backward_weight();
    return dx;
  };
};

}  // namespace dtensor::testing
