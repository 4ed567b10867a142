// tests/support/naive_attention.hpp — the attention oracle of the kernel and layer tests:
// softmax(q k^T / sqrt(D), causal on global positions) v per (batch, head), and each row's
// log-sum-exp, by plain loops in double (no test framework).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dtensor/core/tensor.hpp"

namespace dtensor::testing {

struct NaiveAttention {
  Tensor<double, 4> out;  // [B, H, Tq, Dv]
  Tensor<double, 3> lse;  // [B, H, Tq]; -inf for a row that sees no key
};

/// q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv]; query i sits at global position q0 + i and
/// key j at k0 + j (ring attention's blocks), and causal hides keys after the query.
inline NaiveAttention naive_attention(const Tensor<double, 4>& q, const Tensor<double, 4>& k,
                                      const Tensor<double, 4>& v, bool causal, Extent q0 = 0, Extent k0 = 0) {
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), tk = k.extent(2), dv = v.extent(3);
  NaiveAttention r{Tensor<double, 4>(Shape<4>{B, H, tq, dv}), Tensor<double, 3>(Shape<3>{B, H, tq})};
  const double scale = 1 / std::sqrt(double(d));
  for (Extent b = 0; b < B; ++b)
    for (Extent h = 0; h < H; ++h)
      for (Extent i = 0; i < tq; ++i) {
        std::vector<double> s;
        for (Extent j = 0; j < tk && (!causal || k0 + j <= q0 + i); ++j) {
          double dot = 0;
          for (Extent p = 0; p < d; ++p) dot += q(b, h, i, p) * k(b, h, j, p);
          s.push_back(dot * scale);
        }
        if (s.empty()) {
          r.lse(b, h, i) = -std::numeric_limits<double>::infinity();
          continue;
        }
        double m = -1e300, z = 0;
        for (double x : s) m = std::max(m, x);
        for (double x : s) z += std::exp(x - m);
        r.lse(b, h, i) = m + std::log(z);
        for (std::size_t j = 0; j < s.size(); ++j)
          for (Extent p = 0; p < dv; ++p) r.out(b, h, i, p) += std::exp(s[j] - m) / z * v(b, h, Extent(j), p);
      }
  return r;
}

}  // namespace dtensor::testing
