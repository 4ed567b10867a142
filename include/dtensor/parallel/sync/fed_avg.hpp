// dtensor/parallel/sync/fed_avg.hpp — federated averaging (McMahan et al. 2017) over a client
// dimension: each client trains on its own data, the new global model is the average of the
// participants' models weighted by their sample counts.
//
//   parallel::sync::FedAvg<float, Mesh> fed(mesh, params, {.clients_per_round = 4, .seed = 1});
//   for (long round = 0; round < rounds; ++round) {
//     if (fed.begin_round()) {               // this client was sampled: train E local epochs
//       for (epoch < E) for (batch of my shard) { zero_grad; forward; backward; opt.step(); }
//     }
//     fed.end_round(my_samples);             // one all-reduce: everyone gets the new global model
//   }
//
// A client is one coordinate of the client dimension (the mesh's Role::data dimension, or one
// named): one rank, or a group of ranks that shard the model inside the client (FSDP, TP on the
// other dimensions). The same code runs over threads and MPI: it is written against the mesh.
// Sampling: clients_per_round of the mesh's clients (0: all) are drawn without replacement from
// (seed, round) — the same on every rank, no communication. end_round weighs a participant by its
// sample count and a non-participant by 0, so one all-reduce (sum) over the client dimension of
// [w · θ, w] gives Σ w_i θ_i and Σ w_i; θ ← Σ w_i θ_i / Σ w_i on every rank (the non-participants
// receive the new model as well). The local gradients are never reduced across clients.
// Optimizer state across rounds is the caller's (McMahan's FedAvg restarts a fresh SGD).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "dtensor/parallel/sync/data_split.hpp"
#include "dtensor/parallel/sync/detail/replicas.hpp"

namespace dtensor::parallel::sync {

struct FedAvgOptions {
  int clients_per_round = 0;  // clients sampled each round (0: all of them)
  std::uint64_t seed = 0;     // the sampling's seed
};

template <class T, MeshType Mesh, fixed_string Dim = "">
class FedAvg {
 public:
  static constexpr std::size_t dim = parallel::detail::data_parallel_dim<Mesh, Dim>();
  static constexpr std::size_t N = Mesh::ndim;
  using Space = mesh_space_t<Mesh>;
  using List = nn::ParamList<T, N, Space>;

  FedAvg(Mesh mesh, List params, FedAvgOptions o = {}) : mesh_(std::move(mesh)), params_(std::move(params)), o_(o) {
    const int clients = mesh_.size(dim);
    if (o.clients_per_round < 0 || o.clients_per_round > clients)
      throw Error("FedAvg", detail::cat("clients_per_round = ", o.clients_per_round, " but the client dimension \"",
                                        Mesh::names[dim], "\" has ", clients, " clients (ranks or rank groups)"),
                  mesh_.rank());
    detail::check_replicated("FedAvg", mesh_, dim, params_);
    elements_ = detail::local_elements(params_);
  }

  int clients() const { return mesh_.size(dim); }
  int client() const { return mesh_.coordinate(dim); }
  long round() const noexcept { return round_; }
  void set_round(long r) {
    if (r < 0) throw Error("FedAvg", detail::cat("round ", r, " < 0"), mesh_.rank());
    round_ = r;
  }

  /// The clients that take part in round r (sorted): the same on every rank.
  std::vector<int> sampled(long r) const {
    const int n = clients(), m = o_.clients_per_round == 0 ? n : o_.clients_per_round;
    const Indices p = permutation(std::size_t(n), o_.seed * 0x9E3779B97F4A7C15ull + std::uint64_t(r));
    std::vector<int> out(p.begin(), p.begin() + m);
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Starts the round: whether this client takes part (trains locally) in it.
  bool begin_round() const {
    const auto s = sampled(round_);
    return std::find(s.begin(), s.end(), client()) != s.end();
  }

  /// Ends the round: the weighted average of the participants' parameters (weight: their
  /// sample counts) on every rank. One all-reduce on the client dimension. Returns Σ weights.
  double end_round(double samples) {
    if (!(samples >= 0) || !std::isfinite(samples))
      mesh_.comm().fail("FedAvg", detail::cat("client ", client(), ": sample count ", samples, " must be finite and >= 0"));
    const double w = begin_round() ? samples : 0.0;
    Tensor<T, 1, Space> buf;
    {
      MemoryTagScope tag(MemoryTag::communication);
      buf = Tensor<T, 1, Space>::uninitialized(Shape<1>{Extent(elements_ + 1)});
    }
    std::span<T> all = buf.span();
    std::size_t off = 0;
    for (const auto& p : params_) {
      Space::copy(all.data() + off, p.value.data(), p.value.size_bytes());
      off += p.value.size();
    }
    detail::scale<Space>(all.first(elements_), w);
    const T wt = T(w);
    Space::copy(all.data() + elements_, &wt, sizeof(T));  // a host value into the space
    mesh_.group(dim).all_reduce(all, ReduceOp::sum);
    T total_t{};
    Space::copy(&total_t, all.data() + elements_, sizeof(T));
    const double total = double(total_t);
    if (!(total > 0))
      mesh_.comm().fail("FedAvg", detail::cat("round ", round_, ": the sampled clients hold no samples (total weight ",
                                              total, "): nothing to average"));
    detail::scale<Space>(all.first(elements_), 1.0 / total);
    off = 0;
    for (const auto& p : params_) {
      Space::copy(p.value.data(), all.data() + off, p.value.size_bytes());
      off += p.value.size();
    }
    ++round_;
    return total;
  }

 private:
  Mesh mesh_;
  List params_;
  FedAvgOptions o_;
  std::size_t elements_ = 0;
  long round_ = 0;
};

}  // namespace dtensor::parallel::sync
