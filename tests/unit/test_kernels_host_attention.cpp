// Causal multi-head attention on host: against a naive double loop, the backward against finite
// differences, and the blockwise (context-parallel) form against the whole; bf16 against float.
#include "test_kernels_host_util.hpp"

#include <array>
#include <cmath>
#include <vector>

#include "dtensor/kernels/attention.hpp"  // kernels::attention: the checked front (kernels/generic/)
#include "dtensor/kernels/attention_chunk.hpp"
#include "dtensor/kernels/host/attention.hpp"
#include "support/naive_attention.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_kernels_host_attention {

using namespace dtensor;
namespace kh = dtensor::kernels::host;
using T4 = Tensor<double, 4>;

namespace {

void check_close(const T4& a, const T4& b, double tol = 1e-12) {
  const auto c = compare(a, b, {.rtol = tol, .atol = tol});
  INFO(c.message);
  CHECK(c.ok);
}

}  // namespace

TEST_CASE("attention forward matches a naive loop, causal or not", "[kernels][attention]") {
  auto q = normal<double>(Shape<4>{2, 3, 5, 4}, 1), k = normal<double>(Shape<4>{2, 3, 5, 4}, 2);
  auto v = normal<double>(Shape<4>{2, 3, 5, 3}, 3);
  for (bool causal : {true, false}) {
    auto f = kh::attention(q, k, v, {.causal = causal});
    REQUIRE(f.out.shape() == Shape<4>{2, 3, 5, 3});
    REQUIRE(f.lse.shape() == Shape<3>{2, 3, 5});
    check_close(f.out, testing::naive_attention(q, k, v, causal).out);
  }
  // float follows double
  auto ff = kh::attention(kt::cast<float>(q), kt::cast<float>(k), kt::cast<float>(v));
  auto fd = kh::attention(q, k, v);
  for (Extent i = 0; i < fd.out.numel(); ++i) CHECK(double(ff.out[i]) == Approx(fd.out[i]).margin(1e-5));
  kt::require_error([&] { kernels::attention(q, normal<double>(Shape<4>{2, 3, 5, 5}, 1), v); },
                    {"attention", "[2, 3, 5, 4]", "[2, 3, 5, 5]"});
}

TEST_CASE("attention backward against finite differences", "[kernels][attention]") {
  auto q = normal<double>(Shape<4>{1, 2, 5, 3}, 4), k = normal<double>(Shape<4>{1, 2, 5, 3}, 5);
  auto v = normal<double>(Shape<4>{1, 2, 5, 2}, 6), dout = normal<double>(Shape<4>{1, 2, 5, 2}, 7);
  for (bool causal : {true, false}) {
    const kh::AttentionOptions o{.causal = causal};
    auto f = kh::attention(q, k, v, o);
    auto g = kh::attention_backward(q, k, v, f.out, f.lse, dout, o);
    kt::check_grad(g.dq, kt::fd_grad(q, [&](const T4& x) { return kt::dot(kh::attention(x, k, v, o).out, dout); }));
    kt::check_grad(g.dk, kt::fd_grad(k, [&](const T4& x) { return kt::dot(kh::attention(q, x, v, o).out, dout); }));
    kt::check_grad(g.dv, kt::fd_grad(v, [&](const T4& x) { return kt::dot(kh::attention(q, k, x, o).out, dout); }));
  }
  auto f = kh::attention(q, k, v);
  kt::require_error([&] { kernels::attention_backward(q, k, v, f.out, f.lse, q); }, {"attention_backward", "[1, 2, 5, 3]"});
}

TEST_CASE("blockwise attention with offsets merges to the whole (ring attention)", "[kernels][attention]") {
  // Sequence of 7; this rank's queries are rows [3, 7); keys come in blocks [0, 3) and [3, 7).
  auto q_all = normal<double>(Shape<4>{2, 2, 7, 4}, 8), k = normal<double>(Shape<4>{2, 2, 7, 4}, 9);
  auto v = normal<double>(Shape<4>{2, 2, 7, 3}, 10);
  auto q = q_all.slice(2, 3, 4);
  auto k1 = k.slice(2, 0, 3), v1 = v.slice(2, 0, 3), k2 = k.slice(2, 3, 4), v2 = v.slice(2, 3, 4);
  const kh::AttentionOptions whole{.q_offset = 3, .k_offset = 0}, o1{.q_offset = 3, .k_offset = 0},
      o2{.q_offset = 3, .k_offset = 3};
  auto ref = kh::attention(q, k, v, whole);
  check_close(ref.out, testing::naive_attention(q_all, k, v, true).out.slice(2, 3, 4));
  auto a = kh::attention(q, k1, v1, o1), b = kh::attention(q, k2, v2, o2);
  auto m = kh::merge_attention_blocks(a.out, a.lse, b.out, b.lse);
  check_close(m.out, ref.out);
  for (Extent i = 0; i < m.lse.numel(); ++i) CHECK(m.lse[i] == Approx(ref.lse[i]).epsilon(1e-13));
  // The merge is symmetric.
  check_close(kh::merge_attention_blocks(b.out, b.lse, a.out, a.lse).out, ref.out);

  // Backward per block with the merged out and lse: dk, dv are the block's rows, dq adds up.
  auto dout = normal<double>(ref.out.shape(), 11);
  auto g = kh::attention_backward(q, k, v, ref.out, ref.lse, dout, whole);
  auto g1 = kh::attention_backward(q, k1, v1, m.out, m.lse, dout, o1);
  auto g2 = kh::attention_backward(q, k2, v2, m.out, m.lse, dout, o2);
  check_close(g1.dk, g.dk.slice(2, 0, 3));
  check_close(g2.dk, g.dk.slice(2, 3, 4));
  check_close(g1.dv, g.dv.slice(2, 0, 3));
  check_close(g2.dv, g.dv.slice(2, 3, 4));
  T4 dq = g1.dq;
  for (Extent i = 0; i < dq.numel(); ++i) dq[i] += g2.dq[i];
  check_close(dq, g.dq);

  // A key block wholly in the future of every query: zero output, lse -inf, neutral in the merge.
  auto early = q_all.slice(2, 0, 3);
  auto none = kh::attention(early, k2, v2, {.q_offset = 0, .k_offset = 3});
  for (Extent i = 0; i < none.lse.numel(); ++i) CHECK(std::isinf(none.lse[i]));
  for (Extent i = 0; i < none.out.numel(); ++i) CHECK(none.out[i] == 0);
  auto seen = kh::attention(early, k1, v1, {.q_offset = 0, .k_offset = 0});
  check_close(kh::merge_attention_blocks(seen.out, seen.lse, none.out, none.lse).out, seen.out);
  auto gn = kh::attention_backward(early, k2, v2, seen.out, seen.lse, normal<double>(seen.out.shape(), 12),
                                   {.q_offset = 0, .k_offset = 3});
  for (Extent i = 0; i < gn.dk.numel(); ++i) CHECK(gn.dk[i] == 0);
}

namespace {

/// The plain (untiled) backward from the whole probability matrix, in double: the oracle of the
/// blocked kernel. Returns dq, dk, dv.
std::array<T4, 3> naive_attention_backward(const T4& q, const T4& k, const T4& v, const T4& dout, bool causal,
                                           Extent q0, Extent k0) {
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), tk = k.extent(2), dv = v.extent(3);
  T4 dq(q.shape()), dk(k.shape()), dvv(v.shape());
  const double scale = 1 / std::sqrt(double(d));
  for (Extent b = 0; b < B; ++b)
    for (Extent h = 0; h < H; ++h)
      for (Extent i = 0; i < tq; ++i) {
        std::vector<double> p(static_cast<std::size_t>(tk), 0.0);
        double m = -1e300, z = 0;
        Extent seen = 0;
        for (Extent j = 0; j < tk && (!causal || k0 + j <= q0 + i); ++j, ++seen) {
          double dot = 0;
          for (Extent x = 0; x < d; ++x) dot += q(b, h, i, x) * k(b, h, j, x);
          p[std::size_t(j)] = dot * scale;
          m = std::max(m, p[std::size_t(j)]);
        }
        for (Extent j = 0; j < seen; ++j) z += std::exp(p[std::size_t(j)] - m);
        for (Extent j = 0; j < seen; ++j) p[std::size_t(j)] = std::exp(p[std::size_t(j)] - m) / z;
        std::vector<double> dp(static_cast<std::size_t>(seen));
        double delta = 0;
        for (Extent j = 0; j < seen; ++j) {
          for (Extent x = 0; x < dv; ++x) {
            dp[std::size_t(j)] += dout(b, h, i, x) * v(b, h, j, x);
            dvv(b, h, j, x) += p[std::size_t(j)] * dout(b, h, i, x);
          }
          delta += p[std::size_t(j)] * dp[std::size_t(j)];
        }
        for (Extent j = 0; j < seen; ++j) {
          const double ds = p[std::size_t(j)] * (dp[std::size_t(j)] - delta) * scale;
          for (Extent x = 0; x < d; ++x) {
            dq(b, h, i, x) += ds * k(b, h, j, x);
            dk(b, h, j, x) += ds * q(b, h, i, x);
          }
        }
      }
  return {dq, dk, dvv};
}

}  // namespace

TEST_CASE("blocked attention over several tiles against the untiled oracle", "[kernels][attention]") {
  // 300 queries and 2 x 128 + 44 keys: three tiles a side, the last uneven; offsets as ring
  // attention's blocks have them (keys before, level with and after the queries).
  const Extent tile = kh::detail::attention_tile;
  REQUIRE(tile < 300);
  auto q = normal<double>(Shape<4>{1, 2, 300, 5}, 21), k = normal<double>(Shape<4>{1, 2, 270, 5}, 22);
  auto v = normal<double>(Shape<4>{1, 2, 270, 3}, 23), dout = normal<double>(Shape<4>{1, 2, 300, 3}, 24);
  for (bool causal : {true, false})
    for (Extent k0 : {Extent(0), Extent(150), Extent(-40)}) {
      INFO("causal " << causal << ", key offset " << k0);
      const kh::AttentionOptions o{.causal = causal, .q_offset = 100, .k_offset = 100 + k0};
      const auto f = kh::attention(q, k, v, o);
      check_close(f.out, testing::naive_attention(q, k, v, causal, 100, 100 + k0).out, 1e-12);
      const auto g = kh::attention_backward(q, k, v, f.out, f.lse, dout, o);
      const auto [dq, dk, dv] = naive_attention_backward(q, k, v, dout, causal, 100, 100 + k0);
      check_close(g.dq, dq, 1e-12);
      check_close(g.dk, dk, 1e-12);
      check_close(g.dv, dv, 1e-12);
      // float through the same tiles follows double (tolerance of float rounding over 270 keys)
      const auto ff = kh::attention(kt::cast<float>(q), kt::cast<float>(k), kt::cast<float>(v), o);
      for (Extent i = 0; i < f.out.numel(); ++i) CHECK(double(ff.out[i]) == Approx(f.out[i]).margin(2e-5));
    }
}

TEST_CASE("bfloat16 attention is the float kernel on the widened inputs, rounded once", "[kernels][attention]") {
  // bf16 q, k, v: the kernel widens each head to float, runs the float kernel and rounds out
  // (dq, dk, dv) to bf16 once, keeping the lse of the float run. So it equals, bit for bit, the
  // float kernel on the same values rounded to bf16 — over several tiles, with ring offsets and
  // through the block merge — and it follows the double oracle within bf16's precision.
  using bf16 = dtensor::bfloat16;
  auto q = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, 300, 5}, 31)), k = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, 270, 5}, 32));
  auto v = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, 270, 3}, 33));
  auto dout = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, 300, 3}, 34));
  auto qf = kt::cast<float>(q), kf = kt::cast<float>(k), vf = kt::cast<float>(v), doutf = kt::cast<float>(dout);
  auto rounded_equal = [](const auto& narrow, const auto& wide) {
    REQUIRE(narrow.shape() == wide.shape());
    Extent differ = 0;
    for (Extent i = 0; i < wide.numel(); ++i) differ += narrow[i].bits != bf16(wide[i]).bits;
    CHECK(differ == 0);
  };
  // bf16's unit roundoff is 2^-9 = 2e-3: the output's own rounding plus the rounding of out and
  // dout that the backward reads stay within 2e-2 of the double oracle for these O(1) values.
  auto near_oracle = [](const auto& narrow, const T4& exact) {
    const auto c = compare(kt::cast<double>(narrow), exact, {.rtol = 2e-2, .atol = 2e-2});
    INFO(c.message);
    CHECK(c.ok);
  };
  for (bool causal : {true, false})
    for (Extent k0 : {Extent(0), Extent(150), Extent(-40)}) {
      INFO("causal " << causal << ", key offset " << k0);
      const kh::AttentionOptions o{.causal = causal, .q_offset = 100, .k_offset = 100 + k0};
      const auto f = kh::attention(q, k, v, o);
      const auto ff = kh::attention(qf, kf, vf, o);
      rounded_equal(f.out, ff.out);
      for (Extent i = 0; i < f.lse.numel(); ++i) CHECK(f.lse[i] == ff.lse[i]);
      near_oracle(f.out, testing::naive_attention(kt::cast<double>(q), kt::cast<double>(k), kt::cast<double>(v), causal,
                                                  100, 100 + k0)
                             .out);
      const auto g = kh::attention_backward(q, k, v, f.out, f.lse, dout, o);
      const auto gf = kh::attention_backward(qf, kf, vf, kt::cast<float>(f.out), ff.lse, doutf, o);
      rounded_equal(g.dq, gf.dq);
      rounded_equal(g.dk, gf.dk);
      rounded_equal(g.dv, gf.dv);
      const auto [dq, dk, dv] = naive_attention_backward(kt::cast<double>(q), kt::cast<double>(k), kt::cast<double>(v),
                                                         kt::cast<double>(dout), causal, 100, 100 + k0);
      near_oracle(g.dq, dq);
      near_oracle(g.dk, dk);
      near_oracle(g.dv, dv);
    }
  // Ring attention's merge of two key blocks, in bf16: rounded once from the float merge.
  const kh::AttentionOptions o1{.q_offset = 270, .k_offset = 0}, o2{.q_offset = 270, .k_offset = 135};
  auto k1 = k.slice(2, 0, 135), v1 = v.slice(2, 0, 135), k2 = k.slice(2, 135, 135), v2 = v.slice(2, 135, 135);
  auto a = kh::attention(q, k1, v1, o1), b = kh::attention(q, k2, v2, o2);
  auto m = kh::merge_attention_blocks(a.out, a.lse, b.out, b.lse);
  auto mf = kh::merge_attention_blocks(kt::cast<float>(a.out), a.lse, kt::cast<float>(b.out), b.lse);
  rounded_equal(m.out, mf.out);
  near_oracle(
      m.out, testing::naive_attention(kt::cast<double>(q), kt::cast<double>(k), kt::cast<double>(v), true, 270, 0).out);
}

TEST_CASE("bfloat16 chunked attention (ring attention's local part) against the double oracle", "[kernels][attention]") {
  // 40 queries against keys arriving in 5 chunks of 8 (out of order): the merged output and the
  // summed dq are kept in float and rounded once, so they stay within bf16's precision of the
  // double oracle (2e-2 as above) however many chunks the sequence is cut into.
  using bf16 = dtensor::bfloat16;
  const Extent T = 40, chunk = 8;
  auto q = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, T, 8}, 41)), k = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, T, 8}, 42));
  auto v = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, T, 4}, 43)), dout = kt::cast<bf16>(normal<double>(Shape<4>{1, 2, T, 4}, 44));
  const auto qd = kt::cast<double>(q), kd = kt::cast<double>(k), vd = kt::cast<double>(v), doutd = kt::cast<double>(dout);
  auto near_oracle = [](const auto& narrow, const T4& exact, const char* what) {
    const auto c = compare(kt::cast<double>(narrow), exact, {.rtol = 2e-2, .atol = 2e-2});
    INFO(what << ": " << c.message);
    CHECK(c.ok);
  };
  const std::vector<dtensor::kernels::SeqPiece> q_pieces{{.local = 0, .global = 0, .size = T}};
  const std::vector<dtensor::kernels::SeqPiece> k_pieces{{.local = 0, .global = 0, .size = chunk}};
  const std::vector<Extent> order{3, 0, 4, 1, 2};
  auto key_pieces = [&](Extent c) {
    auto p = k_pieces;
    p[0].global = c * chunk;
    return p;
  };
  dtensor::kernels::ChunkedAttention<bf16> fwd(q, q_pieces, v.extent(3), {});
  for (Extent c : order) fwd.add_chunk(k.slice(2, c * chunk, chunk), v.slice(2, c * chunk, chunk), key_pieces(c));
  auto f = std::move(fwd).result();
  near_oracle(f.out, testing::naive_attention(qd, kd, vd, true).out, "chunked out");
  dtensor::kernels::ChunkedAttentionBackward<bf16> bwd(q, f.out, f.lse, dout, q_pieces, {});
  const auto [dq, dk, dv] = naive_attention_backward(qd, kd, vd, doutd, true, 0, 0);
  for (Extent c : order) {
    auto [dkc, dvc] = bwd.chunk(k.slice(2, c * chunk, chunk), v.slice(2, c * chunk, chunk), key_pieces(c));
    near_oracle(dkc, dk.slice(2, c * chunk, chunk), "chunk dk");
    near_oracle(dvc, dv.slice(2, c * chunk, chunk), "chunk dv");
  }
  near_oracle(std::move(bwd).dq(), dq, "summed dq");
}

}  // namespace test_kernels_host_attention
