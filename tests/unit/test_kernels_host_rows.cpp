// Row kernels on host: softmax, log-softmax, cross-entropy (whole and vocabulary-parallel),
// LayerNorm, RMSNorm and embedding, against naive loops and finite differences; the bf16 twins of
// the row kernels a bf16 GPT / Llama step runs, against the double kernels.
#include "test_kernels_host_util.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include "dtensor/kernels/host/cross_entropy.hpp"
#include "dtensor/kernels/host/embedding.hpp"
#include "dtensor/kernels/host/norm.hpp"
#include "dtensor/kernels/host/repeat.hpp"
#include "dtensor/kernels/host/rotary.hpp"
#include "dtensor/kernels/host/softmax.hpp"
// kernels::name: the checked fronts (kernels/generic/), where bad extents are caught for every space.
#include "dtensor/kernels/cross_entropy.hpp"
#include "dtensor/kernels/embedding.hpp"
#include "dtensor/kernels/norm.hpp"
#include "dtensor/kernels/softmax.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_kernels_host_rows {

using namespace dtensor;
namespace kh = dtensor::kernels::host;
using T1 = Tensor<double, 1>;
using T2 = Tensor<double, 2>;
using T3 = Tensor<double, 3>;

TEST_CASE("softmax and log-softmax over the last dimension", "[kernels][softmax]") {
  auto x = normal<double>(Shape<3>{3, 5, 7}, 1, 0, 3);
  auto y = kh::softmax(x), l = kh::log_softmax(x);
  for (Extent r = 0; r < 15; ++r) {
    double m = -1e300, s = 0;
    for (Extent j = 0; j < 7; ++j) m = std::max(m, x[r * 7 + j]);
    for (Extent j = 0; j < 7; ++j) s += std::exp(x[r * 7 + j] - m);
    for (Extent j = 0; j < 7; ++j) {
      CHECK(y[r * 7 + j] == Approx(std::exp(x[r * 7 + j] - m) / s).epsilon(1e-14));
      // x - lse cancels: the rounding error scales with |x| + |lse|, not with the result.
      const double lse = m + std::log(s);
      CHECK(l[r * 7 + j] == Approx(x[r * 7 + j] - lse).margin(4e-15 * (std::abs(x[r * 7 + j]) + std::abs(lse))));
    }
  }
  auto dy = normal<double>(x.shape(), 2);
  kt::check_grad(kh::softmax_backward(y, dy), kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::softmax(v), dy); }));
  kt::check_grad(kh::log_softmax_backward(l, dy), kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::log_softmax(v), dy); }));
  // large logits do not overflow; float follows the double result
  auto big = kt::cast<float>(normal<double>(Shape<2>{2, 9}, 3, 500, 50));
  auto yb = kh::softmax(big);
  auto yd = kh::softmax(kt::cast<double>(big));
  for (Extent i = 0; i < yb.numel(); ++i) CHECK(double(yb[i]) == Approx(yd[i]).margin(1e-7));
  kt::require_error([&] { kernels::softmax_backward(y, normal<double>(Shape<3>{3, 5, 6}, 1)); }, {"softmax_backward", "[3, 5, 6]"});
}

TEST_CASE("cross-entropy forward and backward", "[kernels][cross_entropy]") {
  auto logits = normal<double>(Shape<2>{5, 7}, 4, 0, 2);
  Tensor<std::int64_t, 1> targets(Shape<1>{5});
  for (Extent i = 0; i < 5; ++i) targets[i] = (3 * i + 1) % 7;
  auto f = kh::cross_entropy(logits, targets);
  double ref = 0;
  for (Extent i = 0; i < 5; ++i) {
    double s = 0;
    for (Extent j = 0; j < 7; ++j) s += std::exp(logits(i, j));
    ref += std::log(s) - logits(i, targets[i]);
  }
  CHECK(f.loss == Approx(ref / 5).epsilon(1e-14));
  // rows split across ranks: each shard's loss is its share of the mean over the global rows
  CHECK(kh::cross_entropy(logits, targets, 20).loss == Approx(ref / 20).epsilon(1e-14));
  const auto d20 = kh::cross_entropy_backward(logits, targets, f.lse, 1.0, 20), d5 = kh::cross_entropy_backward(logits, targets, f.lse);
  for (Extent i = 0; i < d5.numel(); ++i) CHECK(d20[i] == Approx(d5[i] / 4).epsilon(1e-13));
  kt::require_error([&] { kernels::cross_entropy(logits, targets, 3); }, {"cross_entropy", "mean over 3 rows"});
  auto loss = [&](const T2& v) { return kh::cross_entropy(v, targets).loss; };
  kt::check_grad(kh::cross_entropy_backward(logits, targets, f.lse), kt::fd_grad(logits, loss));
  auto half = kh::cross_entropy_backward(logits, targets, f.lse, 0.5);
  auto one = kh::cross_entropy_backward(logits, targets, f.lse);
  for (Extent i = 0; i < one.numel(); ++i) CHECK(half[i] == Approx(0.5 * one[i]).epsilon(1e-15));
  // float logits, int32 targets
  auto lf = kt::cast<float>(logits);
  Tensor<std::int32_t, 1> t32(Shape<1>{5});
  for (Extent i = 0; i < 5; ++i) t32[i] = std::int32_t(targets[i]);
  CHECK(kh::cross_entropy(lf, t32).loss == Approx(ref / 5).epsilon(1e-6));

  targets[2] = 7;
  kt::require_error([&] { kh::cross_entropy(logits, targets); }, {"cross_entropy", "target 7", "[0, 7)"});
  kt::require_error([&] { kernels::cross_entropy(logits, Tensor<std::int64_t, 1>(Shape<1>{4})); }, {"cross_entropy", "[5, 7]", "[4]"});
}

TEST_CASE("vocabulary-parallel cross-entropy equals the whole one", "[kernels][cross_entropy]") {
  // Columns split 4 + 0 + 3 + 4 over four "ranks" (an empty shard included).
  const Extent n = 6, v = 11;
  auto logits = kt::cast<float>(normal<double>(Shape<2>{n, v}, 5, 0, 3));
  Tensor<std::int32_t, 1> targets(Shape<1>{n});
  for (Extent i = 0; i < n; ++i) targets[i] = std::int32_t((5 * i + 2) % v);
  const std::vector<Extent> begin{0, 4, 4, 7}, width{4, 0, 3, 4};
  std::vector<Tensor<float, 2>> shard;
  for (std::size_t r = 0; r < 4; ++r) shard.push_back(logits.slice(1, begin[r], width[r]));
  // all-reduce max, then sum exp and target logit
  Tensor<double, 1> gmax = full<double>(Shape<1>{n}, -INFINITY), gsum(Shape<1>{n}), gtgt(Shape<1>{n});
  for (std::size_t r = 0; r < 4; ++r) {
    auto m = kh::vocab_parallel_ce_max(shard[r]);
    for (Extent i = 0; i < n; ++i) gmax[i] = std::max(gmax[i], m[i]);
  }
  for (std::size_t r = 0; r < 4; ++r) {
    auto s = kh::vocab_parallel_ce_sum_exp(shard[r], gmax);
    auto t = kh::vocab_parallel_ce_target_logit(shard[r], targets, begin[r]);
    for (Extent i = 0; i < n; ++i) gsum[i] += s[i], gtgt[i] += t[i];
  }
  const double loss = kh::vocab_parallel_ce_loss(gmax, gsum, gtgt);
  auto whole = kh::cross_entropy(logits, targets);
  CHECK(loss == Approx(whole.loss).epsilon(1e-12));
  auto dwhole = kh::cross_entropy_backward(logits, targets, whole.lse);
  for (std::size_t r = 0; r < 4; ++r) {
    auto d = kh::vocab_parallel_ce_backward(shard[r], targets, begin[r], gmax, gsum);
    REQUIRE(d.shape() == Shape<2>{n, width[r]});
    const auto c = compare(d, dwhole.slice(1, begin[r], width[r]), {.rtol = 1e-6, .atol = 1e-9});
    INFO(c.message);
    CHECK(c.ok);
  }
  kt::require_error([&] { kernels::vocab_parallel_ce_sum_exp(shard[0], Tensor<double, 1>(Shape<1>{n + 1})); },
                    {"vocab_parallel_ce_sum_exp", "[7]", "[6, 4]"});
}

TEST_CASE("LayerNorm and RMSNorm forward and backward", "[kernels][norm]") {
  auto x = normal<double>(Shape<3>{3, 5, 7}, 6, 1, 2);
  auto w = normal<double>(Shape<1>{7}, 7, 1, 0.5), b = normal<double>(Shape<1>{7}, 8);
  auto dy = normal<double>(x.shape(), 9);
  const double eps = 1e-5;
  auto f = kh::layer_norm(x, w, b, eps);
  auto r = kh::rms_norm(x, w, eps);
  REQUIRE(f.mean.shape() == Shape<1>{15});
  for (Extent row = 0; row < 15; ++row) {
    double mu = 0, var = 0, ms = 0;
    for (Extent j = 0; j < 7; ++j) mu += x[row * 7 + j] / 7, ms += x[row * 7 + j] * x[row * 7 + j] / 7;
    for (Extent j = 0; j < 7; ++j) var += (x[row * 7 + j] - mu) * (x[row * 7 + j] - mu) / 7;
    CHECK(f.mean[row] == Approx(mu).epsilon(1e-14));
    CHECK(f.rstd[row] == Approx(1 / std::sqrt(var + eps)).epsilon(1e-14));
    for (Extent j = 0; j < 7; ++j) {
      CHECK(f.y[row * 7 + j] == Approx((x[row * 7 + j] - mu) / std::sqrt(var + eps) * w[j] + b[j]).epsilon(1e-13));
      CHECK(r.y[row * 7 + j] == Approx(x[row * 7 + j] / std::sqrt(ms + eps) * w[j]).epsilon(1e-13));
    }
  }
  auto g = kh::layer_norm_backward(x, w, f.mean, f.rstd, dy);
  kt::check_grad(g.dx, kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::layer_norm(v, w, b, eps).y, dy); }));
  kt::check_grad(g.dweight, kt::fd_grad(w, [&](const T1& v) { return kt::dot(kh::layer_norm(x, v, b, eps).y, dy); }));
  kt::check_grad(g.dbias, kt::fd_grad(b, [&](const T1& v) { return kt::dot(kh::layer_norm(x, w, v, eps).y, dy); }));
  auto h = kh::rms_norm_backward(x, w, r.rstd, dy);
  kt::check_grad(h.dx, kt::fd_grad(x, [&](const T3& v) { return kt::dot(kh::rms_norm(v, w, eps).y, dy); }));
  kt::check_grad(h.dweight, kt::fd_grad(w, [&](const T1& v) { return kt::dot(kh::rms_norm(x, v, eps).y, dy); }));
  CHECK(h.dbias.numel() == 0);
  // float input: double statistics, float output close to the double one
  auto ff = kh::layer_norm(kt::cast<float>(x), kt::cast<float>(w), kt::cast<float>(b), eps);
  for (Extent i = 0; i < x.numel(); ++i) CHECK(double(ff.y[i]) == Approx(f.y[i]).margin(2e-6));

  kt::require_error([&] { kernels::layer_norm(x, normal<double>(Shape<1>{6}, 1), b); }, {"layer_norm", "[3, 5, 7]", "[6]"});
  kt::require_error([&] { kernels::rms_norm_backward(x, w, Tensor<double, 1>(Shape<1>{14}), dy); }, {"rms_norm_backward", "[14]", "15"});
}

TEST_CASE("embedding lookup, vocabulary shards and the scatter-add backward", "[kernels][embedding]") {
  const Extent V = 9, D = 5;
  auto table = normal<double>(Shape<2>{V, D}, 10);
  Tensor<std::int64_t, 2> ids(Shape<2>{3, 4});
  for (Extent i = 0; i < 12; ++i) ids[i] = (7 * i + 3) % V;
  ids[5] = ids[2];  // a repeated id accumulates twice in the backward
  auto y = kh::embedding(table, ids);
  REQUIRE(y.shape() == Shape<3>{3, 4, D});
  for (Extent a = 0; a < 3; ++a)
    for (Extent t = 0; t < 4; ++t)
      for (Extent j = 0; j < D; ++j) CHECK(y(a, t, j) == table(ids(a, t), j));
  auto dy = normal<double>(y.shape(), 11);
  Tensor<double, 2> dtable(table.shape());
  kh::embedding_backward(dtable, ids, dy);
  kt::check_grad(dtable, kt::fd_grad(table, [&](const T2& tb) { return kt::dot(kh::embedding(tb, ids), dy); }));

  // Shards [0,4), [4,4), [4,9): partial lookups sum to the whole; shard gradients are row blocks.
  const std::vector<Extent> begin{0, 4, 4}, rows{4, 0, 5};
  Tensor<double, 3> sum(y.shape());
  for (std::size_t r = 0; r < 3; ++r) {
    auto part = table.slice(0, begin[r], rows[r]);
    auto yr = kh::embedding_shard(part, ids, begin[r]);
    for (Extent i = 0; i < sum.numel(); ++i) sum[i] += yr[i];
    Tensor<double, 2> dpart(part.shape());
    kh::embedding_shard_backward(dpart, ids, dy, begin[r]);
    CHECK(equal(dpart, dtable.slice(0, begin[r], rows[r])));
  }
  CHECK(equal(sum, y));
  ids[3] = V;
  kt::require_error([&] { kh::embedding(table, ids); }, {"embedding", "id 9", "[0, 9)"});
  kt::require_error([&] { kernels::embedding_backward(dtable, ids, Tensor<double, 3>(Shape<3>{3, 4, D + 1})); },
                    {"embedding_backward", "[3, 4, 6]", "[3, 4]"});
}

TEST_CASE("bfloat16 row kernels of a GPT / Llama step follow the double kernels on the same values", "[kernels][bf16]") {
  // bf16 in, per-element math in float, row statistics in double, one rounding to bf16 on store:
  // against the double kernel on the bf16 values widened, an output is one bf16 rounding away
  // (relative 2^-8 = 3.9e-3; 1e-2 with an absolute floor for values near zero), and what stays
  // in double (losses, lse, norm statistics) agrees to double rounding of the double kernels.
  using bf16 = dtensor::bfloat16;
  const Tolerance one_rounding{.rtol = 1e-2, .atol = 1e-2};
  auto close = [&](const auto& narrow, const auto& exact, const char* what) {
    const auto c = compare(kt::cast<double>(narrow), exact, one_rounding);
    INFO(what << ": " << c.message);
    CHECK(c.ok);
  };
  auto widened = [](const auto& x) { return kt::cast<double>(kt::cast<bf16>(x)); };  // the bf16 values, exactly
  // Cross-entropy, whole and vocabulary-parallel (columns [4, 11) of 11).
  const auto logits = widened(normal<double>(Shape<2>{6, 11}, 31, 0, 2));
  Tensor<std::int32_t, 1> targets(Shape<1>{6});
  for (Extent i = 0; i < 6; ++i) targets[i] = std::int32_t((5 * i + 2) % 11);
  const auto lb = kt::cast<bf16>(logits);
  const auto fb = kh::cross_entropy(lb, targets), fd = kh::cross_entropy(logits, targets);
  CHECK(fb.loss == Approx(fd.loss).epsilon(1e-12));
  for (Extent i = 0; i < 6; ++i) CHECK(fb.lse[i] == Approx(fd.lse[i]).epsilon(1e-12));
  close(kh::cross_entropy_backward(lb, targets, fb.lse), kh::cross_entropy_backward(logits, targets, fd.lse), "ce backward");
  const auto part = logits.slice(1, 4, 7);
  const auto mb = kh::vocab_parallel_ce_max(kt::cast<bf16>(part)), md = kh::vocab_parallel_ce_max(part);
  const auto sb = kh::vocab_parallel_ce_sum_exp(kt::cast<bf16>(part), mb), sd = kh::vocab_parallel_ce_sum_exp(part, md);
  for (Extent i = 0; i < 6; ++i) CHECK(sb[i] == Approx(sd[i]).epsilon(1e-12));
  close(kh::vocab_parallel_ce_backward(kt::cast<bf16>(part), targets, 4, mb, sb),
        kh::vocab_parallel_ce_backward(part, targets, 4, md, sd), "vocab-parallel ce backward");
  // LayerNorm and RMSNorm, forward and backward.
  const auto x = widened(normal<double>(Shape<3>{2, 5, 24}, 32, 1, 2));
  const auto w = widened(normal<double>(Shape<1>{24}, 33, 1, 0.5)), b = widened(normal<double>(Shape<1>{24}, 34));
  const auto dy = widened(normal<double>(x.shape(), 35));
  const auto xb = kt::cast<bf16>(x), dyb = kt::cast<bf16>(dy);
  const auto wb = kt::cast<bf16>(w);
  const auto lnb = kh::layer_norm(xb, wb, kt::cast<bf16>(b), 1e-5);
  const auto lnd = kh::layer_norm(x, w, b, 1e-5);
  close(lnb.y, lnd.y, "layer_norm");
  for (Extent i = 0; i < 10; ++i) CHECK(lnb.rstd[i] == Approx(lnd.rstd[i]).epsilon(1e-6));  // float per-element math
  const auto lgb = kh::layer_norm_backward(xb, wb, lnb.mean, lnb.rstd, dyb);
  const auto lgd = kh::layer_norm_backward(x, w, lnd.mean, lnd.rstd, dy);
  close(lgb.dx, lgd.dx, "layer_norm dx");
  close(lgb.dweight, lgd.dweight, "layer_norm dweight");
  close(lgb.dbias, lgd.dbias, "layer_norm dbias");
  const auto rnb = kh::rms_norm(xb, wb);
  const auto rnd = kh::rms_norm(x, w);
  close(rnb.y, rnd.y, "rms_norm");
  const auto rgb = kh::rms_norm_backward(xb, wb, rnb.rstd, dyb);
  const auto rgd = kh::rms_norm_backward(x, w, rnd.rstd, dy);
  close(rgb.dx, rgd.dx, "rms_norm dx");
  close(rgb.dweight, rgd.dweight, "rms_norm dweight");
  // Rotary positions and repeat_interleave (GQA: over the heads) on [B, T, H, D].
  const auto q = widened(normal<double>(Shape<4>{2, 3, 5, 8}, 36));
  Tensor<std::int32_t, 2> pos(Shape<2>{2, 3});
  for (Extent i = 0; i < pos.numel(); ++i) pos[i] = std::int32_t(3 * i + 1);
  close(kh::rotary(kt::cast<bf16>(q), pos, 10000.0), kh::rotary(q, pos, 10000.0), "rotary");
  close(kh::rotary_backward(pos, kt::cast<bf16>(q), 10000.0), kh::rotary_backward(pos, q, 10000.0), "rotary_backward");
  CHECK(equal(kt::cast<double>(kh::repeat_interleave(kt::cast<bf16>(q), 2, 2)), kh::repeat_interleave(q, 2, 2)));  // a copy
  close(kh::repeat_interleave_backward(kt::cast<bf16>(q), 2, 5), kh::repeat_interleave_backward(q, 2, 5), "repeat backward");
  // Embedding: the lookup copies rows; the backward adds a repeated id's rows.
  const auto table = widened(normal<double>(Shape<2>{9, 6}, 37));
  Tensor<std::int64_t, 2> ids(Shape<2>{3, 4});
  for (Extent i = 0; i < 12; ++i) ids[i] = (7 * i + 3) % 9;
  ids[5] = ids[2];
  CHECK(equal(kt::cast<double>(kh::embedding(kt::cast<bf16>(table), ids)), kh::embedding(table, ids)));
  const auto demb = widened(normal<double>(Shape<3>{3, 4, 6}, 38));
  Tensor<bf16, 2> dtb(table.shape());
  Tensor<double, 2> dtd(table.shape());
  kh::embedding_backward(dtb, ids, kt::cast<bf16>(demb));
  kh::embedding_backward(dtd, ids, demb);
  close(dtb, dtd, "embedding_backward");
}

}  // namespace test_kernels_host_rows
