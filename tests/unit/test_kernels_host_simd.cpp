// The vectorized float host kernels (kernels/host/simd.hpp dispatch) against their plain double
// loops — the oracle — on every instruction set this CPU has, with row lengths around the vector
// widths (1, 7, 16, 37, 130, 300). Tolerances (float against double): GELU 1e-6 absolute
// (fast_tanh); rows (softmax, log-softmax, cross-entropy, LayerNorm) 2e-6 relative to the largest
// entry; LayerNorm's rstd 1e-6 (centred in float); AdamW 1e-6 after five steps. bfloat16 kernels
// that run the float code on widened rows: bit for bit the float kernel's result rounded once,
// and within one bf16 step of the double kernel, on rows and columns of 7, 13, 33 and 100.
// Intra-op threads (kernels/host/parallel.hpp): every kernel that splits its rows gives the same
// bits with 2 and 3 threads as serially, at sizes where it does split.
#include "test_kernels_host_util.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dtensor/kernels/host/activations.hpp"
#include "dtensor/kernels/host/attention.hpp"
#include "dtensor/kernels/host/cast.hpp"
#include "dtensor/kernels/host/cross_entropy.hpp"
#include "dtensor/kernels/host/elementwise.hpp"
#include "dtensor/kernels/host/norm.hpp"
#include "dtensor/kernels/host/optim.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/kernels/host/simd.hpp"
#include "dtensor/kernels/host/softmax.hpp"
#include "dtensor/kernels/host/transpose.hpp"

using namespace dtensor;
namespace kh = dtensor::kernels::host;

namespace {

/// The instruction sets up to the detected one; resets the cap when done.
struct EveryIsa {
  std::vector<kh::Isa> isas;
  EveryIsa() {
    for (auto isa : {kh::Isa::baseline, kh::Isa::avx2, kh::Isa::avx512})
      if (int(isa) <= int(kh::detected_host_isa())) isas.push_back(isa);
  }
  ~EveryIsa() { kh::set_host_isa_cap(kh::Isa::avx512); }
};

/// body() once per instruction set up to the detected one, the kernels capped at it.
template <class Body>
void on_every_isa(Body body) {
  EveryIsa all;
  for (auto isa : all.isas) {
    kh::set_host_isa_cap(isa);
    INFO("instruction set " << kh::isa_name(isa));
    body();
  }
}

template <std::size_t R>
Tensor<float, R> uniform_float(Shape<R> s, std::uint64_t seed, double lo, double hi) {
  return kt::cast<float>(uniform<double>(s, seed, lo, hi));
}

/// max |a - b| <= atol + rtol * max |b|
template <std::size_t R>
void check_close(const Tensor<float, R>& a, const Tensor<double, R>& b, double atol, double rtol) {
  REQUIRE(a.shape() == b.shape());
  double worst = 0, scale = 0;
  for (Extent i = 0; i < b.numel(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  INFO("max error " << worst << " against max |value| " << scale << ", extents " << to_string(b.shape()));
  CHECK(worst <= atol + rtol * scale);
}

/// Three results of a kernel (gradients, optimizer state) against the oracle's.
template <class A, class B>
void check_three(const A& got, const B& want, double atol, double rtol) {
  check_close(std::get<0>(got), std::get<0>(want), atol, rtol);
  check_close(std::get<1>(got), std::get<1>(want), atol, rtol);
  check_close(std::get<2>(got), std::get<2>(want), atol, rtol);
}

}  // namespace

TEST_CASE("the host kernels report the instruction set they run", "[kernels][host][simd]") {
  const kh::Isa isa = kh::host_isa();
  WARN("host kernels run " << kh::isa_name(isa) << " (detected " << kh::isa_name(kh::detected_host_isa()) << ")");
  EveryIsa all;
  kh::set_host_isa_cap(kh::Isa::baseline);
  CHECK(kh::host_isa() == kh::Isa::baseline);
  kh::set_host_isa_cap(kh::Isa::avx512);
  CHECK(kh::host_isa() == kh::detected_host_isa());
}

TEST_CASE("fast_exp and fast_tanh against the standard library", "[kernels][host][simd]") {
  double worst_exp = 0, worst_tanh = 0;
  for (double x = -87.0; x <= 88.0; x += 0.01) {
    const float e = kh::detail::fast_exp(float(x));
    worst_exp = std::max(worst_exp, std::abs(double(e) - std::exp(double(float(x)))) / std::exp(double(float(x))));
  }
  for (double x = -12.0; x <= 12.0; x += 0.001)
    worst_tanh = std::max(worst_tanh, std::abs(double(kh::detail::fast_tanh(float(x))) - std::tanh(double(float(x)))));
  INFO("exp relative " << worst_exp << ", tanh absolute " << worst_tanh);
  CHECK(worst_exp < 5e-7);
  CHECK(worst_tanh < 3e-7);
  CHECK(kh::detail::fast_exp(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isfinite(kh::detail::fast_exp(1000.0f)));
}

TEST_CASE("float GELU, its backward and bias+GELU against the double loops", "[kernels][host][simd]") {
  on_every_isa([&] {
    for (Extent n : {1, 7, 16, 37, 130, 300}) {
      INFO("row length " << n);
      const Shape<2> s{3, n};
      auto x = uniform<double>(s, 11 + std::uint64_t(n), -6, 6), dy = uniform<double>(s, 12, -1, 1);
      auto bias = uniform<double>(Shape<1>{n}, 13, -1, 1);
      const auto xf = kt::cast<float>(x), dyf = kt::cast<float>(dy);
      const auto bf = kt::cast<float>(bias);
      // The oracle takes the float inputs' exact values.
      const auto xd = kt::cast<double>(xf), dyd = kt::cast<double>(dyf);
      const auto bd = kt::cast<double>(bf);
      check_close(kh::gelu(xf), kh::gelu(xd), 1e-6, 1e-6);
      check_close(kh::gelu_backward(xf, dyf), kh::gelu_backward(xd, dyd), 1e-6, 1e-6);
      const auto fused = kh::bias_gelu(xf, bf);
      const auto fused_ref = kh::bias_gelu(xd, bd);
      check_close(fused.h, fused_ref.h, 0, 1e-7);
      check_close(fused.y, fused_ref.y, 1e-6, 1e-6);
    }
  });
}

TEST_CASE("float softmax, log-softmax and cross-entropy against the double loops", "[kernels][host][simd]") {
  on_every_isa([&] {
    for (Extent n : {1, 7, 16, 37, 130, 300}) {
      INFO("row length " << n);
      const Shape<2> s{5, n};
      const auto xf = uniform_float(s, 21 + std::uint64_t(n), -8, 8), dyf = uniform_float(s, 22, -1, 1);
      const auto xd = kt::cast<double>(xf), dyd = kt::cast<double>(dyf);
      check_close(kh::softmax(xf), kh::softmax(xd), 0, 2e-6);
      check_close(kh::log_softmax(xf), kh::log_softmax(xd), 0, 2e-6);
      Tensor<std::int32_t, 1> targets(Shape<1>{5});
      for (Extent i = 0; i < 5; ++i) targets[i] = std::int32_t((i * 3) % n);
      const auto f = kh::cross_entropy(xf, targets);
      const auto fd = kh::cross_entropy(xd, targets);
      CHECK(std::abs(f.loss - fd.loss) <= 1e-6 * std::abs(fd.loss) + 1e-9);
      check_close(kh::cross_entropy_backward(xf, targets, f.lse, 0.5), kh::cross_entropy_backward(xd, targets, fd.lse, 0.5),
                  0, 2e-6);
    }
  });
}

TEST_CASE("float LayerNorm forward and backward against the double loops", "[kernels][host][simd]") {
  on_every_isa([&] {
    for (Extent n : {1, 7, 16, 37, 130, 300}) {
      INFO("row length " << n);
      const Shape<3> s{2, 3, n};
      const auto xf = uniform_float(s, 31 + std::uint64_t(n), -3, 5), dyf = uniform_float(s, 32, -1, 1);
      const auto wf = uniform_float(Shape<1>{n}, 33, 0.5, 1.5), bf = uniform_float(Shape<1>{n}, 34, -1, 1);
      const auto xd = kt::cast<double>(xf), dyd = kt::cast<double>(dyf);
      const auto wd = kt::cast<double>(wf), bd = kt::cast<double>(bf);
      const auto f = kh::layer_norm(xf, wf, bf, 1e-5);
      const auto fd = kh::layer_norm(xd, wd, bd, 1e-5);
      check_close(f.y, fd.y, 0, 2e-6);
      for (Extent r = 0; r < 6; ++r) {
        CHECK(std::abs(f.mean[r] - fd.mean[r]) <= 1e-12 * (1 + std::abs(fd.mean[r])));  // double sums of the same floats
        CHECK(std::abs(f.rstd[r] - fd.rstd[r]) <= 1e-6 * fd.rstd[r]);  // centred in float
      }
      const auto g = kh::layer_norm_backward(xf, wf, f.mean, f.rstd, dyf);
      const auto gd = kh::layer_norm_backward(xd, wd, fd.mean, fd.rstd, dyd);
      check_three(std::tie(g.dx, g.dweight, g.dbias), std::tie(gd.dx, gd.dweight, gd.dbias), 1e-6, 2e-6);
    }
  });
}

TEST_CASE("float attention forward and backward against the double kernels", "[kernels][host][simd]") {
  on_every_isa([&] {
    for (Extent t : {1, 7, 37}) {
      INFO("sequence " << t);
      const Shape<4> s{2, 3, t, 8};
      const auto q = uniform_float(s, 41, -1, 1), k = uniform_float(s, 42, -1, 1), v = uniform_float(s, 43, -1, 1),
                 dout = uniform_float(s, 44, -1, 1);
      const auto f = kh::attention(q, k, v);
      const auto fd = kh::attention(kt::cast<double>(q), kt::cast<double>(k), kt::cast<double>(v));
      check_close(f.out, fd.out, 1e-6, 2e-6);
      const auto g = kh::attention_backward(q, k, v, f.out, f.lse, dout);
      const auto gd = kh::attention_backward(kt::cast<double>(q), kt::cast<double>(k), kt::cast<double>(v), fd.out, fd.lse,
                                             kt::cast<double>(dout));
      check_three(std::tie(g.dq, g.dk, g.dv), std::tie(gd.dq, gd.dk, gd.dv), 1e-6, 1e-5);
    }
  });
}

TEST_CASE("float AdamW against the double element function over several steps", "[kernels][host][simd]") {
  on_every_isa([&] {
    const Shape<1> s{37};
    auto pf = uniform_float(s, 51, -1, 1), mf = Tensor<float, 1>(s), vf = Tensor<float, 1>(s);
    auto pd = kt::cast<double>(pf), md = Tensor<double, 1>(s), vd = Tensor<double, 1>(s);
    for (long step = 1; step <= 5; ++step) {
      const auto gf = uniform_float(s, 60 + std::uint64_t(step), -1, 1);
      const kh::AdamWStep st{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = step};
      kh::adamw_update(pf, gf, mf, vf, st);
      kh::adamw_update(pd, kt::cast<double>(gf), md, vd, st);
    }
    check_three(std::tie(pf, mf, vf), std::tie(pd, md, vd), 0, 1e-6);  // float rounding of five steps of size ~lr
  });
}

TEST_CASE("sum_squares: the same bits on every ISA, bf16 as its widened values, close to the double sum",
          "[kernels][host][simd]") {
  // Uneven lengths: empty, inside one vector, a vector and a tail, around the 2048-element chunks.
  for (Extent n : {0, 1, 15, 17, 2047, 2048, 2049, 5000}) {
    INFO("n = " << n);
    const auto x = uniform_float(Shape<1>{n}, 91 + std::uint64_t(n), -2, 2);
    const auto x16 = kt::cast<dtensor::bfloat16>(x);
    const auto x16f = kt::cast<float>(x16);  // exact
    double want = 0, want16 = 0;
    for (Extent i = 0; i < n; ++i) {
      want += double(x[i]) * double(x[i]);
      want16 += double(x16f[i]) * double(x16f[i]);
    }
    std::vector<double> got;
    on_every_isa([&] {
      const double sq = kh::sum_squares(x);
      CHECK(sq == Approx(want).epsilon(1e-14));  // double sums of n <= 5000 terms of a few units
      CHECK(kh::sum_squares(x16) == kh::sum_squares(x16f));
      CHECK(kh::sum_squares(x16) == Approx(want16).epsilon(1e-14));
      got.push_back(sq);
    });
    for (double g : got) CHECK(std::bit_cast<std::uint64_t>(g) == std::bit_cast<std::uint64_t>(got.front()));
  }
}

TEST_CASE("AdamW and SGD reading a bf16 gradient equal the float update on the widened gradient", "[kernels][host][simd]") {
  // FSDP's bf16 gradient shards (ParamRef::narrow_grad) are read by the float kernels widened
  // per element: exactly the update of the fp32 copy of the same gradient, on every ISA, across
  // the vector body and the tail (37 elements).
  on_every_isa([&] {
    const Shape<1> s{37};
    auto p1 = uniform_float(s, 71, -1, 1), m1 = Tensor<float, 1>(s), v1 = Tensor<float, 1>(s);
    auto p2 = kt::cast<float>(p1), m2 = Tensor<float, 1>(s), v2 = Tensor<float, 1>(s);
    auto q1 = kt::cast<float>(p1), q2 = kt::cast<float>(p1), b1 = Tensor<float, 1>(s), b2 = Tensor<float, 1>(s);
    for (long step = 1; step <= 3; ++step) {
      const auto g16 = kt::cast<dtensor::bfloat16>(uniform_float(s, 80 + std::uint64_t(step), -1, 1));
      const auto g32 = kt::cast<float>(g16);  // exact
      const kh::AdamWStep st{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = step};
      kh::adamw_update(p1, g16, m1, v1, st);
      kh::adamw_update(p2, g32, m2, v2, st);
      const kh::SgdStep sg{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .first_step = step == 1};
      kh::sgd_update(q1, g16, b1, sg);
      kh::sgd_update(q2, g32, b2, sg);
    }
    auto d = [](const Tensor<float, 1>& t) { return kt::cast<double>(t); };  // exact: the oracle's type
    check_three(std::tie(p1, m1, v1), std::make_tuple(d(p2), d(m2), d(v2)), 0, 0);
    check_three(std::tie(q1, b1, q1), std::make_tuple(d(q2), d(b2), d(q2)), 0, 0);
  });
}

// ---------------------------------------------------------------- intra-op threads

namespace {

/// The bytes of a tensor (or of a double): "the same bits" is equality of these.
template <class T, std::size_t R>
std::vector<unsigned char> bytes(const Tensor<T, R>& t) {
  std::vector<unsigned char> b(sizeof(T) * std::size_t(t.numel()));
  if (!b.empty()) std::memcpy(b.data(), t.data(), b.size());
  return b;
}
std::vector<unsigned char> bytes(double v) {
  std::vector<unsigned char> b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

/// run() serially and with 2 and 3 intra-op threads (3: blocks that do not divide the rows):
/// each result's bytes must equal the serial run's.
template <class Run>
void same_bits_on_every_thread_count(const char* kernel, Run run) {
  INFO("kernel " << kernel);
  REQUIRE(kh::intra_op_threads() == 1);
  const std::vector<std::vector<unsigned char>> serial = run();
  for (int threads : {2, 3}) {
    const kh::IntraOpThreads scope(threads);
    REQUIRE(kh::intra_op_threads() == threads);
    INFO(threads << " intra-op threads");
    const auto got = run();
    REQUIRE(got.size() == serial.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("result " << i);
      CHECK(got[i] == serial[i]);
    }
  }
}

}  // namespace

TEST_CASE("parallel_for: contiguous blocks on the pool's threads, serial when nested, errors rethrown",
          "[kernels][host][parallel]") {
  std::mutex mu;
  std::vector<std::pair<Extent, Extent>> blocks;
  std::set<std::thread::id> ids;
  auto record = [&](Extent r0, Extent r1) {
    std::lock_guard lock(mu);
    blocks.emplace_back(r0, r1);
    ids.insert(std::this_thread::get_id());
  };
  kh::detail::parallel_for(1000, 1, record);  // no pool: one block, here
  REQUIRE(blocks == std::vector<std::pair<Extent, Extent>>{{0, 1000}});
  {
    const kh::IntraOpThreads scope(3);
    blocks.clear();
    kh::detail::parallel_for(1000, 1, record, 64);
    std::sort(blocks.begin(), blocks.end());
    REQUIRE(blocks.size() == 12);  // 4 parts per thread, every row once, boundaries multiples of 64
    CHECK(blocks.front().first == 0);
    CHECK(blocks.back().second == 1000);
    for (std::size_t i = 1; i < blocks.size(); ++i) {
      CHECK(blocks[i].first == blocks[i - 1].second);
      CHECK(blocks[i].first % 64 == 0);
    }
    // The workers take part: blocks that last long enough for them to wake.
    ids.clear();
    kh::detail::parallel_for(12, 1, [&](Extent r0, Extent r1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      record(r0, r1);
    });
    CHECK(ids.size() >= 2);
    blocks.clear();
    kh::detail::parallel_for(1000, 400, record);  // two grains of 400 fit: 2 blocks
    CHECK(blocks.size() == 2);
    blocks.clear();
    kh::detail::parallel_for(700, 400, record);  // under two grains: serial
    CHECK(blocks == std::vector<std::pair<Extent, Extent>>{{0, 700}});
    // Nested: the inner loop runs whole on the thread of its outer block.
    std::vector<int> inner_blocks(3, 0);
    kh::detail::parallel_for(3, 1, [&](Extent r0, Extent r1) {
      for (Extent r = r0; r < r1; ++r)
        kh::detail::parallel_for(100, 1, [&](Extent, Extent) { ++inner_blocks[std::size_t(r)]; });
    });
    CHECK(inner_blocks == std::vector<int>{1, 1, 1});
    // An error in a block reaches the caller; the pool runs the next loop.
    kh::detail::parallel_for(0, 1, [&](Extent, Extent) { FAIL("no rows, no call"); });
    kt::require_error([&] {
      kh::detail::parallel_for(900, 1, [&](Extent r0, Extent) {
        if (r0 > 0) throw dtensor::Error("test_block", "rows from " + std::to_string(r0));
      });
    }, {"test_block", "rows from"});
    blocks.clear();
    kh::detail::parallel_for(90, 1, record);
    CHECK(blocks.size() == 12);
    {
      const kh::IntraOpThreads one(1);  // scopes nest: 1 is serial
      CHECK(kh::intra_op_threads() == 1);
    }
    CHECK(kh::intra_op_threads() == 3);
  }
  CHECK(kh::intra_op_threads() == 1);
  kt::require_error([] { kh::IntraOpThreads bad(0); }, {"IntraOpThreads", "0"});
}

TEST_CASE("intra-op threads: norms, attention, cross-entropy, AdamW, GELU, elementwise and permute give the same bits",
          "[kernels][host][parallel]") {
  on_every_isa([&] {
    // LayerNorm (float: vectorized; double: the plain loops) and RMSNorm: 1050 rows of 130.
    const Shape<3> ns{3, 350, 130};
    const auto xf = uniform_float(ns, 91, -3, 5), dyf = uniform_float(ns, 92, -1, 1);
    const auto wf = uniform_float(Shape<1>{130}, 93, 0.5, 1.5), bf = uniform_float(Shape<1>{130}, 94, -1, 1);
    same_bits_on_every_thread_count("layer_norm float", [&] {
      const auto f = kh::layer_norm(xf, wf, bf, 1e-5);
      const auto g = kh::layer_norm_backward(xf, wf, f.mean, f.rstd, dyf);
      return std::vector{bytes(f.y), bytes(f.mean), bytes(f.rstd), bytes(g.dx), bytes(g.dweight), bytes(g.dbias)};
    });
    const auto xd = kt::cast<double>(xf), dyd = kt::cast<double>(dyf);
    const auto wd = kt::cast<double>(wf), bd = kt::cast<double>(bf);
    same_bits_on_every_thread_count("layer_norm double", [&] {
      const auto f = kh::layer_norm(xd, wd, bd, 1e-5);
      const auto g = kh::layer_norm_backward(xd, wd, f.mean, f.rstd, dyd);
      return std::vector{bytes(f.y), bytes(f.mean), bytes(f.rstd), bytes(g.dx), bytes(g.dweight), bytes(g.dbias)};
    });
    const auto xb = kt::cast<dtensor::bfloat16>(xf), dyb = kt::cast<dtensor::bfloat16>(dyf);
    const auto wb = kt::cast<dtensor::bfloat16>(wf), bb = kt::cast<dtensor::bfloat16>(bf);
    same_bits_on_every_thread_count("layer_norm dtensor::bfloat16", [&] {
      const auto f = kh::layer_norm(xb, wb, bb, 1e-5);
      const auto g = kh::layer_norm_backward(xb, wb, f.mean, f.rstd, dyb);
      return std::vector{bytes(f.y), bytes(f.mean), bytes(f.rstd), bytes(g.dx), bytes(g.dweight), bytes(g.dbias)};
    });
    same_bits_on_every_thread_count("rms_norm float", [&] {
      const auto f = kh::rms_norm(xf, wf, 1e-6);
      const auto g = kh::rms_norm_backward(xf, wf, f.rstd, dyf);
      return std::vector{bytes(f.y), bytes(f.rstd), bytes(g.dx), bytes(g.dweight)};
    });
    // Attention: 6 heads of 67 queries (causal, and a non-causal block with offsets), float and bf16.
    const Shape<4> as{2, 3, 67, 16};
    const auto q = uniform_float(as, 95, -1, 1), k = uniform_float(as, 96, -1, 1), v = uniform_float(as, 97, -1, 1),
               dout = uniform_float(as, 98, -1, 1);
    for (const kh::AttentionOptions o : {kh::AttentionOptions{}, kh::AttentionOptions{.causal = false, .q_offset = 5}}) {
      same_bits_on_every_thread_count("attention float", [&] {
        const auto f = kh::attention(q, k, v, o);
        const auto g = kh::attention_backward(q, k, v, f.out, f.lse, dout, o);
        return std::vector{bytes(f.out), bytes(f.lse), bytes(g.dq), bytes(g.dk), bytes(g.dv)};
      });
    }
    const auto qb = kt::cast<dtensor::bfloat16>(q), kb = kt::cast<dtensor::bfloat16>(k), vb = kt::cast<dtensor::bfloat16>(v),
               doutb = kt::cast<dtensor::bfloat16>(dout);
    same_bits_on_every_thread_count("attention bf16", [&] {
      const auto f = kh::attention(qb, kb, vb);
      const auto g = kh::attention_backward(qb, kb, vb, f.out, f.lse, doutb);
      return std::vector{bytes(f.out), bytes(f.lse), bytes(g.dq), bytes(g.dk), bytes(g.dv)};
    });
    // Cross-entropy: 700 rows of 91 logits.
    const auto logits = uniform_float(Shape<2>{700, 91}, 99, -6, 6);
    Tensor<std::int32_t, 1> targets(Shape<1>{700});
    for (Extent i = 0; i < 700; ++i) targets[i] = std::int32_t((i * 37) % 91);
    same_bits_on_every_thread_count("cross_entropy", [&] {
      const auto f = kh::cross_entropy(logits, targets);
      return std::vector{bytes(f.loss), bytes(f.lse), bytes(kh::cross_entropy_backward(logits, targets, f.lse, 0.5))};
    });
    // AdamW: 50001 floats over 3 steps (chunks of 64 and a tail), and 20001 doubles.
    same_bits_on_every_thread_count("adamw_update", [&] {
      const Shape<1> s{50001};
      auto p = uniform_float(s, 100, -1, 1), m = Tensor<float, 1>(s), vv = Tensor<float, 1>(s);
      auto pd = uniform<double>(Shape<1>{20001}, 101, -1, 1), md = Tensor<double, 1>(Shape<1>{20001}),
           vd = Tensor<double, 1>(Shape<1>{20001});
      for (long step = 1; step <= 3; ++step) {
        const kh::AdamWStep st{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = step};
        kh::adamw_update(p, uniform_float(s, 110 + std::uint64_t(step), -1, 1), m, vv, st);
        kh::adamw_update(pd, uniform<double>(Shape<1>{20001}, 120 + std::uint64_t(step), -1, 1), md, vd, st);
      }
      return std::vector{bytes(p), bytes(m), bytes(vv), bytes(pd), bytes(md), bytes(vd)};
    });
    // GELU (100003 elements; bias + GELU over 300 rows of 257), elementwise, bias, permute.
    const auto big = uniform_float(Shape<2>{389, 257}, 102, -4, 4), big2 = uniform_float(Shape<2>{389, 257}, 103, -1, 1);
    const auto bias = uniform_float(Shape<1>{257}, 104, -1, 1);
    same_bits_on_every_thread_count("gelu, elementwise, bias", [&] {
      const auto bg = kh::bias_gelu(big, bias);
      auto acc = kh::add(big, big2);
      kh::add_(acc, big2, 0.25f);
      return std::vector{bytes(kh::gelu(big)), bytes(kh::gelu_backward(big, big2)), bytes(bg.h), bytes(bg.y), bytes(acc),
                         bytes(kh::add_bias(big, bias)), bytes(kh::bias_grad(big2))};
    });
    const auto x4 = uniform_float(Shape<4>{4, 70, 6, 33}, 105, -1, 1);
    same_bits_on_every_thread_count("permute", [&] {
      return std::vector{bytes(kh::permute(x4, {0, 2, 1, 3})), bytes(kh::permute(x4, {3, 1, 0, 2}))};
    });
  });
}

TEST_CASE("float bias add, bias gradient and broadcast add equal the plain loops bit for bit on every ISA",
          "[kernels][host][simd]") {
  // The vectorized paths do the plain loops' arithmetic per element (bias_grad: each column summed
  // in double over the rows in order), so the bits must match exactly, not within a tolerance.
  on_every_isa([&] {
    for (const Extent n : {1, 7, 16, 37, 130}) {
      INFO("row length " << n);
      const auto x = uniform_float(Shape<3>{3, 11, n}, 130 + std::uint64_t(n), -3, 3);
      const auto b = uniform_float(Shape<1>{n}, 131, -1, 1);
      const auto y = kh::add_bias(x, b);
      const auto db = kh::bias_grad(x);
      Tensor<float, 1> db_acc = b;
      kh::bias_grad_into(db_acc, x, /*accumulate=*/true);
      for (Extent j = 0; j < n; ++j) {
        double sum = 0;
        for (Extent r = 0; r < 33; ++r) {
          CHECK(y[r * n + j] == x[r * n + j] + b[j]);
          sum += double(x[r * n + j]);
        }
        CHECK(db[j] == float(sum));
        CHECK(db_acc[j] == float(double(b[j]) + sum));
      }
      // Broadcast over the leading dimension (a position table: contiguous runs of 11 * n), over
      // a middle one (runs of n), and over the last one (no run: the element-wise odometer).
      const auto pos = uniform_float(Shape<3>{1, 11, n}, 132, -1, 1),
                 mid = uniform_float(Shape<3>{3, 1, n}, 133, -1, 1),
                 last = uniform_float(Shape<3>{3, 11, 1}, 134, -1, 1);
      const auto zp = kh::add_broadcast(x, pos), zm = kh::sub_broadcast(x, mid), zl = kh::mul_broadcast(last, x);
      for (Extent i = 0; i < 3; ++i)
        for (Extent t = 0; t < 11; ++t)
          for (Extent j = 0; j < n; ++j) {
            CHECK(zp(i, t, j) == x(i, t, j) + pos(0, t, j));
            CHECK(zm(i, t, j) == x(i, t, j) - mid(i, 0, j));
            CHECK(zl(i, t, j) == last(i, t, 0) * x(i, t, j));
          }
    }
  });
}

namespace {

/// Each element of a float tensor rounded once to bf16: what a bf16 kernel that runs the float
/// kernel's code on widened values must store, bit for bit.
template <std::size_t R>
void check_rounded_once(const Tensor<dtensor::bfloat16, R>& got, const Tensor<float, R>& float_result,
                        const char* what) {
  REQUIRE(got.shape() == float_result.shape());
  Extent mismatches = 0, first = -1;
  for (Extent i = 0; i < got.numel(); ++i)
    if (got[i].bits != dtensor::bfloat16(float_result[i]).bits && mismatches++ == 0) first = i;
  INFO(what << ": " << mismatches << " of " << got.numel() << " elements differ from the float kernel's rounded once"
            << (first >= 0 ? ", the first at " + std::to_string(first) : std::string()) << ", extents "
            << to_string(got.shape()));
  CHECK(mismatches == 0);
}

/// |got - want| within one bf16 step of want (2^-7 relative), or atol: the float arithmetic's
/// absolute error where a result is a small difference of larger terms (0: none).
template <std::size_t R>
void check_one_bf16_step(const Tensor<dtensor::bfloat16, R>& got, const Tensor<double, R>& want, const char* what,
                         double atol = 0) {
  REQUIRE(got.shape() == want.shape());
  Extent bad = 0;
  for (Extent i = 0; i < got.numel(); ++i)
    if (std::abs(double(float(got[i])) - want[i]) > std::max(std::abs(want[i]) * 0x1p-7, atol)) ++bad;
  INFO(what << ": " << bad << " of " << got.numel() << " elements more than one bf16 step from the double result");
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE(
    "dtensor::bfloat16 LayerNorm and cross-entropy backward run the float kernels on widened values, rounded once",
    "[kernels][host][simd][bf16]") {
  // The bf16 rows are widened to float (exact), run the float code and are rounded once: the
  // float kernel's result on the same values, rounded, bit for bit (statistics: the same doubles);
  // and the double kernel on those values, rounded to bf16, within one bf16 step.
  on_every_isa([&] {
    for (const Extent n : {7, 13, 33, 100}) {
      for (const Extent rows : {7, 13}) {
        INFO("rows " << rows << ", row length " << n);
        const Shape<2> s{rows, n};
        const auto xb = kt::cast<dtensor::bfloat16>(uniform<double>(s, 200 + std::uint64_t(n), -3, 5));
        const auto dyb = kt::cast<dtensor::bfloat16>(uniform<double>(s, 201, -1, 1));
        const auto wb = kt::cast<dtensor::bfloat16>(uniform<double>(Shape<1>{n}, 202, 0.5, 1.5));
        const auto bb = kt::cast<dtensor::bfloat16>(uniform<double>(Shape<1>{n}, 203, -1, 1));
        const auto xf = kt::cast<float>(xb), dyf = kt::cast<float>(dyb);
        const auto wf = kt::cast<float>(wb), bf = kt::cast<float>(bb);
        const auto fb = kh::layer_norm(xb, wb, bb, 1e-5);
        const auto ff = kh::layer_norm(xf, wf, bf, 1e-5);
        check_rounded_once(fb.y, ff.y, "layer_norm y");
        for (Extent r = 0; r < rows; ++r) {
          CHECK(fb.mean[r] == ff.mean[r]);
          CHECK(fb.rstd[r] == ff.rstd[r]);
        }
        const auto gb = kh::layer_norm_backward(xb, wb, fb.mean, fb.rstd, dyb);
        const auto gf = kh::layer_norm_backward(xf, wf, ff.mean, ff.rstd, dyf);
        check_rounded_once(gb.dx, gf.dx, "layer_norm dx");
        check_rounded_once(gb.dweight, gf.dweight, "layer_norm dweight");
        check_rounded_once(gb.dbias, gf.dbias, "layer_norm dbias");
        const auto xd = kt::cast<double>(xb), dyd = kt::cast<double>(dyb);
        const auto wd = kt::cast<double>(wb), bd = kt::cast<double>(bb);
        const auto fd = kh::layer_norm(xd, wd, bd, 1e-5);
        const auto gd = kh::layer_norm_backward(xd, wd, fd.mean, fd.rstd, dyd);
        check_one_bf16_step(fb.y, fd.y, "layer_norm y against double", 1e-6);
        check_one_bf16_step(gb.dbias, gd.dbias, "layer_norm dbias against double");
        // dx and dweight are differences of nearly equal terms: float's error is relative to the
        // terms, not the result, so against double they get the rows' float tolerance instead.
        check_close(kt::cast<float>(gb.dx), gd.dx, 0, 1e-2);
        check_close(kt::cast<float>(gb.dweight), gd.dweight, 0, 1e-2);
        // Cross-entropy backward (vocabulary of n; a shard at v0 = 3 too), the lse of the float forward.
        Tensor<std::int32_t, 1> targets(Shape<1>{rows});
        for (Extent i = 0; i < rows; ++i) targets[i] = std::int32_t((5 * i + 2) % n);
        const auto ce = kh::cross_entropy(xf, targets);
        check_rounded_once(kh::cross_entropy_backward(xb, targets, ce.lse, 0.5),
                           kh::cross_entropy_backward(xf, targets, ce.lse, 0.5), "cross_entropy_backward");
        const auto m = kh::vocab_parallel_ce_max(xf), sum = kh::vocab_parallel_ce_sum_exp(xf, m);
        check_rounded_once(kh::vocab_parallel_ce_backward(xb, targets, 3, m, sum, 2.0),
                           kh::vocab_parallel_ce_backward(xf, targets, 3, m, sum, 2.0), "vocab_parallel_ce_backward");
        check_one_bf16_step(kh::cross_entropy_backward(xb, targets, ce.lse, 0.5),
                            kh::cross_entropy_backward(xd, targets, ce.lse, 0.5),
                            "cross_entropy_backward against double", 1e-7);
      }
    }
  });
}

TEST_CASE("dtensor::bfloat16 element-wise, bias and broadcast loops and float <-> bf16 casts round once",
          "[kernels][host][simd][bf16]") {
  // Vectorized for bf16 (widened, float arithmetic, one rounding): a single add or multiply is
  // exactly bf16(float op), bias_grad bf16 of the double column sum; y + alpha x (which a vector
  // instance may fuse) within one bf16 step of the double result.
  on_every_isa([&] {
    for (const Extent n : {7, 13, 33, 100}) {
      INFO("row length " << n);
      const Shape<3> s{3, 11, n};
      const auto a = kt::cast<dtensor::bfloat16>(uniform<double>(s, 210 + std::uint64_t(n), -3, 3));
      const auto b = kt::cast<dtensor::bfloat16>(uniform<double>(s, 211, -3, 3));
      const auto bias = kt::cast<dtensor::bfloat16>(uniform<double>(Shape<1>{n}, 212, -1, 1));
      const auto pos = kt::cast<dtensor::bfloat16>(uniform<double>(Shape<3>{1, 11, n}, 213, -1, 1));
      const auto sum = kh::add(a, b), prod = kh::mul(a, b), biased = kh::add_bias(a, bias),
                 z = kh::add_broadcast(a, pos);
      auto axpy = a;
      kh::add_(axpy, b, 0.3f);
      auto want_axpy = Tensor<double, 3>::uninitialized(s);
      for (Extent i = 0; i < a.numel(); ++i) {
        const float x = float(a[i]), y = float(b[i]);
        CHECK(sum[i].bits == dtensor::bfloat16(x + y).bits);
        CHECK(prod[i].bits == dtensor::bfloat16(x * y).bits);
        CHECK(biased[i].bits == dtensor::bfloat16(x + float(bias[i % n])).bits);
        CHECK(z[i].bits == dtensor::bfloat16(x + float(pos[i % (11 * n)])).bits);
        want_axpy[i] = double(x) + double(0.3f) * double(y);
      }
      check_one_bf16_step(axpy, want_axpy, "add_ (y += alpha x)");
      const auto db = kh::bias_grad(a);
      for (Extent j = 0; j < n; ++j) {
        double col = 0;
        for (Extent r = 0; r < 33; ++r) col += double(float(a[r * n + j]));
        CHECK(db[j].bits == dtensor::bfloat16(float(col)).bits);
      }
      // float -> bf16 rounds as dtensor::bfloat16(float) does (ties to even, NaN kept a NaN, infinities,
      // the largest floats round to infinity); bf16 -> float is exact.
      auto f = kt::cast<float>(uniform<double>(Shape<1>{n + 8}, 214, -1e3, 1e3));
      const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::max(),
                                1.0f + 0x1p-8f,  // a tie: to even (1.0)
                                1.0f + 0x1p-8f + 0x1p-7f,
                                -0.0f,
                                1e-40f};
      for (int i = 0; i < 8; ++i) f[i] = specials[i];
      Tensor<dtensor::bfloat16, 1> narrow(f.shape());
      Tensor<float, 1> back(f.shape());
      kh::cast_into(narrow, f);
      kh::cast_into(back, narrow);
      for (Extent i = 0; i < f.numel(); ++i) {
        CHECK(narrow[i].bits == dtensor::bfloat16(f[i]).bits);
        CHECK(std::bit_cast<std::uint32_t>(back[i]) == std::uint32_t(narrow[i].bits) << 16);
      }
    }
  });
}
