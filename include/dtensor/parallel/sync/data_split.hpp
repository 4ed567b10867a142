// dtensor/parallel/sync/data_split.hpp — partitions of a data set's sample indices: holdout,
// k-fold (plain and stratified), IID and non-IID (Dirichlet) client shards. Deterministic from a
// seed on every platform (own shuffle and samplers on std::mt19937_64, whose output the standard
// fixes; std::shuffle and the std distributions are implementation-defined), so every rank of a
// job — and a resumed job — computes the same split without communication. A SplitSpec names a
// split in one line, for a checkpoint's metadata and its reconstruction.
//
//   auto folds = sync::kfold(n, 5, /*seed=*/1);            // folds[i].train / folds[i].val, val disjoint, union = all
//   auto strat = sync::stratified_kfold(labels, 5, 1);     // each fold's label mix ~ the whole's
//   auto shards = sync::dirichlet_shards(labels, 8, /*alpha=*/0.5, 1);   // non-IID clients (small alpha: skewed)
//   auto [mean, sd] = sync::mean_std(val_losses);         // k-fold's report
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/error.hpp"

namespace dtensor::parallel::sync {

using Indices = std::vector<std::size_t>;

struct Split {
  Indices train, val;
};

namespace detail {
inline double unit_uniform(std::mt19937_64& g) { return double(g() >> 11) * 0x1.0p-53; }  // [0, 1)
/// Uniform in [0, n): the top bits scaled (bias below 2^-53 for the sizes here).
inline std::size_t below(std::mt19937_64& g, std::size_t n) {
  return std::min(n - 1, std::size_t(unit_uniform(g) * double(n)));
}
inline void shuffle(Indices& v, std::mt19937_64& g) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(g, i)]);
}
inline double standard_normal(std::mt19937_64& g) {
  const double u1 = 1.0 - unit_uniform(g), u2 = unit_uniform(g);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
/// Gamma(a, 1) by Marsaglia and Tsang; a < 1 through Gamma(a + 1) · U^(1/a).
inline double gamma(std::mt19937_64& g, double a) {
  if (a < 1) return gamma(g, a + 1) * std::pow(1.0 - unit_uniform(g), 1.0 / a);
  const double d = a - 1.0 / 3, c = 1 / std::sqrt(9 * d);
  for (;;) {
    double x, v;
    do {
      x = standard_normal(g);
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - unit_uniform(g);
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}
inline Indices iota(std::size_t n) {
  Indices v(n);
  std::iota(v.begin(), v.end(), std::size_t(0));
  return v;
}
inline void check_k(const char* op, std::size_t k, std::size_t n) {
  if (k < 2 || k > n)
    throw Error(op, dtensor::detail::cat("k = ", k, " folds for ", n, " samples: need 2 <= k <= samples"));
}
/// The folds' validation sets → splits (train = all the other folds, in index order).
inline std::vector<Split> folds_to_splits(std::vector<Indices> val, std::size_t n) {
  std::vector<Split> out;
  std::vector<std::size_t> fold_of(n);
  for (std::size_t f = 0; f < val.size(); ++f)
    for (std::size_t i : val[f]) fold_of[i] = f;
  for (std::size_t f = 0; f < val.size(); ++f) {
    Split s;
    std::sort(val[f].begin(), val[f].end());
    s.val = std::move(val[f]);
    for (std::size_t i = 0; i < n; ++i)
      if (fold_of[i] != f) s.train.push_back(i);
    out.push_back(std::move(s));
  }
  return out;
}
}  // namespace detail

/// A permutation of 0..n-1 drawn from the seed.
inline Indices permutation(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  Indices v = detail::iota(n);
  detail::shuffle(v, g);
  return v;
}

/// A shuffled holdout: round(n · val_fraction) samples (at least one, at most n − 1) validate.
inline Split holdout(std::size_t n, double val_fraction, std::uint64_t seed) {
  if (!(val_fraction > 0 && val_fraction < 1) || n < 2)
    throw Error("holdout", dtensor::detail::cat("val_fraction ", val_fraction, " of ", n,
                                                " samples: need 0 < fraction < 1 and at least 2 samples"));
  const std::size_t nv = std::clamp<std::size_t>(std::size_t(std::llround(double(n) * val_fraction)), 1, n - 1);
  Indices p = permutation(n, seed);
  Split s{Indices(p.begin() + std::ptrdiff_t(nv), p.end()), Indices(p.begin(), p.begin() + std::ptrdiff_t(nv))};
  std::sort(s.train.begin(), s.train.end());
  std::sort(s.val.begin(), s.val.end());
  return s;
}

/// k-fold cross-validation over n samples: the shuffled indices cut into k folds whose sizes
/// differ by at most one (the first n mod k one larger, as scikit-learn's KFold); split i
/// validates on fold i and trains on the rest.
inline std::vector<Split> kfold(std::size_t n, std::size_t k, std::uint64_t seed) {
  detail::check_k("kfold", k, n);
  const Indices p = permutation(n, seed);
  std::vector<Indices> val(k);
  std::size_t at = 0;
  for (std::size_t f = 0; f < k; ++f) {
    const std::size_t size = n / k + (f < n % k ? 1 : 0);
    val[f].assign(p.begin() + std::ptrdiff_t(at), p.begin() + std::ptrdiff_t(at + size));
    at += size;
  }
  return detail::folds_to_splits(std::move(val), n);
}

/// Stratified k-fold: the samples of each label, shuffled, are dealt to the folds in turn
/// (continuing where the previous label stopped), so every fold holds each label's samples to
/// within one and the fold sizes differ by at most one.
inline std::vector<Split> stratified_kfold(const std::vector<int>& labels, std::size_t k, std::uint64_t seed) {
  const std::size_t n = labels.size();
  detail::check_k("stratified_kfold", k, n);
  std::vector<int> classes(labels);
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  std::mt19937_64 g(seed);
  std::vector<Indices> val(k);
  std::size_t next = 0;
  for (int c : classes) {
    Indices members;
    for (std::size_t i = 0; i < n; ++i)
      if (labels[i] == c) members.push_back(i);
    detail::shuffle(members, g);
    for (std::size_t i : members) val[next++ % k].push_back(i);
  }
  return detail::folds_to_splits(std::move(val), n);
}

/// IID client shards: the shuffled indices cut into `clients` parts of sizes within one.
inline std::vector<Indices> iid_shards(std::size_t n, std::size_t clients, std::uint64_t seed) {
  if (clients < 1 || clients > n)
    throw Error("iid_shards", dtensor::detail::cat(clients, " clients for ", n, " samples: need 1 <= clients <= samples"));
  const Indices p = permutation(n, seed);
  std::vector<Indices> out(clients);
  std::size_t at = 0;
  for (std::size_t c = 0; c < clients; ++c) {
    const std::size_t size = n / clients + (c < n % clients ? 1 : 0);
    out[c].assign(p.begin() + std::ptrdiff_t(at), p.begin() + std::ptrdiff_t(at + size));
    std::sort(out[c].begin(), out[c].end());
    at += size;
  }
  return out;
}

/// Non-IID client shards (Hsu et al. 2019): for each label, client proportions drawn from a
/// symmetric Dirichlet(alpha) split that label's shuffled samples. Small alpha: each client
/// sees few labels; large alpha: close to IID. The shards are disjoint and cover every sample;
/// a client may get none (the caller weighs clients by their sample counts).
inline std::vector<Indices> dirichlet_shards(const std::vector<int>& labels, std::size_t clients, double alpha,
                                             std::uint64_t seed) {
  if (clients < 1 || clients > labels.size())
    throw Error("dirichlet_shards",
                dtensor::detail::cat(clients, " clients for ", labels.size(), " samples: need 1 <= clients <= samples"));
  if (!(alpha > 0) || !std::isfinite(alpha))
    throw Error("dirichlet_shards", dtensor::detail::cat("alpha = ", alpha, ": must be a finite value > 0"));
  std::vector<int> classes(labels);
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  std::mt19937_64 g(seed);
  std::vector<Indices> out(clients);
  for (int c : classes) {
    Indices members;
    for (std::size_t i = 0; i < labels.size(); ++i)
      if (labels[i] == c) members.push_back(i);
    detail::shuffle(members, g);
    std::vector<double> w(clients);
    double total = 0;
    for (auto& x : w) total += (x = detail::gamma(g, alpha));
    // Cumulative proportions → cut points; the last client takes the rest (no sample lost).
    double cum = 0;
    std::size_t at = 0;
    for (std::size_t j = 0; j < clients; ++j) {
      cum += w[j] / total;
      const std::size_t end = j + 1 == clients ? members.size()
                                               : std::min(members.size(), std::size_t(std::llround(cum * double(members.size()))));
      for (; at < end; ++at) out[j].push_back(members[at]);
    }
  }
  for (auto& s : out) std::sort(s.begin(), s.end());
  return out;
}

/// The mean and (sample, n − 1) standard deviation of k-fold's validation losses.
inline std::pair<double, double> mean_std(const std::vector<double>& xs) {
  if (xs.empty()) throw Error("mean_std", "no values");
  double mean = 0;
  for (double x : xs) mean += x;
  mean /= double(xs.size());
  double ss = 0;
  for (double x : xs) ss += (x - mean) * (x - mean);
  return {mean, xs.size() > 1 ? std::sqrt(ss / double(xs.size() - 1)) : 0.0};
}

/// One line that names a split, for a checkpoint's metadata: "holdout seed=1 val=0.1",
/// "kfold seed=1 k=5 fold=2", "dirichlet seed=1 clients=8 alpha=0.5", "iid seed=1 clients=8".
struct SplitSpec {
  std::string kind = "holdout";  // holdout, kfold, stratified, iid, dirichlet
  std::uint64_t seed = 0;
  std::size_t k = 0, fold = 0, clients = 0;
  double val_fraction = 0.1, alpha = 0;

  std::string to_string() const {
    std::ostringstream s;
    s.precision(17);
    s << kind << " seed=" << seed;
    if (kind == "holdout") s << " val=" << val_fraction;
    if (kind == "kfold" || kind == "stratified") s << " k=" << k << " fold=" << fold;
    if (kind == "iid" || kind == "dirichlet") s << " clients=" << clients;
    if (kind == "dirichlet") s << " alpha=" << alpha;
    return s.str();
  }
  static SplitSpec parse(const std::string& line) {
    std::istringstream in(line);
    SplitSpec sp;
    in >> sp.kind;
    if (sp.kind != "holdout" && sp.kind != "kfold" && sp.kind != "stratified" && sp.kind != "iid" && sp.kind != "dirichlet")
      throw Error("SplitSpec::parse", "unknown split kind in \"" + line + "\"");
    for (std::string kv; in >> kv;) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) throw Error("SplitSpec::parse", "\"" + kv + "\" is not key=value in \"" + line + "\"");
      const std::string key = kv.substr(0, eq), v = kv.substr(eq + 1);
      try {
        if (key == "seed") sp.seed = std::stoull(v);
        else if (key == "k") sp.k = std::stoull(v);
        else if (key == "fold") sp.fold = std::stoull(v);
        else if (key == "clients") sp.clients = std::stoull(v);
        else if (key == "val") sp.val_fraction = std::stod(v);
        else if (key == "alpha") sp.alpha = std::stod(v);
        else throw Error("SplitSpec::parse", "unknown key \"" + key + "\" in \"" + line + "\"");
      } catch (const std::logic_error&) {
        throw Error("SplitSpec::parse", "bad value \"" + v + "\" for " + key + " in \"" + line + "\"");
      }
    }
    return sp;
  }
  bool operator==(const SplitSpec&) const = default;
};

}  // namespace dtensor::parallel::sync
