// Context parallelism: ring (balanced or not, with and without overlap), all-gather-KV and
// Ulysses attention against one-rank attention (forward and backward, double, 1e-10) on 1-, 2-
// and 3-D meshes, CP = 2 and 4, uneven sequence lengths and fewer positions than ranks; their
// collectives (CommLog); the load-balanced permutation; per-rank attention work; the ring's
// split-phase order; the transformer block on meshes with a context dimension (CP, CP x DP,
// CP x TP, CP x TP with sequence parallelism) against the one-rank block; the attention's saved
// activation bytes per rank falling as 1/cp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/block.hpp"
#include "dtensor/parallel/context_grads.hpp"
#include "dtensor/parallel/context_parallel.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "support/on_ranks.hpp"
#include "test_nn_support.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_context_parallel {

using namespace dtensor;
using namespace dtensor::testing;
using parallel::ContextKind;
using kernels::host::HostTensor;

namespace {

constexpr Extent B = 2, H = 4, D = 3;

struct Reference {
  HostTensor<double, 4> q, k, v, dout, out, dq, dk, dv;
};

Reference reference(Extent seq, std::uint64_t seed) {
  Reference r;
  const Shape<4> s{B, H, seq, D};
  r.q = normal<double>(s, seed), r.k = normal<double>(s, seed + 1), r.v = normal<double>(s, seed + 2);
  r.dout = normal<double>(s, seed + 3);
  auto f = kernels::host::attention(r.q, r.k, r.v);
  auto g = kernels::host::attention_backward(r.q, r.k, r.v, f.out, f.lse, r.dout);
  r.out = std::move(f.out), r.dq = std::move(g.dq), r.dk = std::move(g.dk), r.dv = std::move(g.dv);
  return r;
}

std::string differs(const char* what, const HostTensor<double, 4>& got, const HostTensor<double, 4>& want) {
  auto c = compare(got, want, {.rtol = 1e-10, .atol = 1e-10});
  return c ? std::string{} : std::string(what) + ": " + c.message;
}

struct RunStats {
  std::size_t pairs = 0, fwd_send_recv = 0, bwd_send_recv = 0, fwd_a2a = 0, bwd_a2a = 0, fwd_ag = 0, bwd_ag = 0,
              bwd_rs = 0, other = 0;
};

/// Forward and backward of context attention on `mesh` (layout L: Shard<2> on "cp") against the
/// reference; returns this rank's counts.
template <class L, class Mesh>
RunStats run_case(const Mesh& mesh, const Reference& ref, parallel::ContextAttentionOptions o,
                  const std::function<void(const std::string&)>& report) {
  const int cp = parallel::context_size(mesh);
  const auto stored = [&](const HostTensor<double, 4>& x) {
    return distribute_replicated<L>(mesh, o.load_balanced ? parallel::load_balance(x, 2, cp) : x);
  };
  const auto original = [&](const auto& x) {
    auto full = full_tensor(x);
    return o.load_balanced ? parallel::undo_load_balance(full, 2, cp) : full;
  };
  auto q = stored(ref.q), k = stored(ref.k), v = stored(ref.v), dout = stored(ref.dout);
  RunStats st;
  const auto count = [&](const CommLog& log, std::size_t& send_recv, std::size_t& a2a, std::size_t& ag,
                         std::size_t* rs) {
    for (const auto& rec : log.records()) {
      if (rec.kind == CollectiveKind::send_recv) ++send_recv;
      else if (rec.kind == CollectiveKind::all_to_all) ++a2a;
      else if (rec.kind == CollectiveKind::all_gather) ++ag;
      else if (rec.kind == CollectiveKind::reduce_scatter && rs) ++*rs;
      else ++st.other;
      if (rec.group != "cp") ++st.other;
    }
  };
  auto [out, saved] = [&] {
    CommLog log;
    auto r = parallel::context_attention(q, k, v, o);
    count(log, st.fwd_send_recv, st.fwd_a2a, st.fwd_ag, nullptr);
    return r;
  }();
  st.pairs = saved.pairs;
  auto g = [&] {
    CommLog log;
    auto r = parallel::context_attention_backward(dout, q, k, v, out, saved, o);
    count(log, st.bwd_send_recv, st.bwd_a2a, st.bwd_ag, &st.bwd_rs);
    return r;
  }();
  report(differs("out", original(out), ref.out));
  report(differs("dq", original(g.dq), ref.dq));
  report(differs("dk", original(g.dk), ref.dk));
  report(differs("dv", original(g.dv), ref.dv));
  return st;
}

/// The collectives each kind must issue per forward and backward on a context group of cp.
std::string expected_collectives(ContextKind kind, int cp, const RunStats& s) {
  const auto n = std::size_t(cp);
  bool ok = s.other == 0;
  if (kind == ContextKind::ring)
    ok = ok && s.fwd_send_recv == 2 * (n - 1) && s.bwd_send_recv == 2 * (n - 1) + 2 * n && s.fwd_a2a + s.fwd_ag == 0;
  if (kind == ContextKind::allgather) ok = ok && s.fwd_ag == 2 && s.bwd_ag == 2 && s.bwd_rs == 2 && s.fwd_send_recv == 0;
  if (kind == ContextKind::ulysses) ok = ok && s.fwd_a2a == 4 && s.bwd_a2a == 4 && s.fwd_send_recv == 0;
  if (ok) return {};
  return detail::cat(name_of(kind), " cp ", cp, ": forward send_recv ", s.fwd_send_recv, ", all_to_all ", s.fwd_a2a,
                     ", all_gather ", s.fwd_ag, "; backward send_recv ", s.bwd_send_recv, ", all_to_all ", s.bwd_a2a,
                     ", all_gather ", s.bwd_ag, ", reduce_scatter ", s.bwd_rs, "; other ", s.other);
}

const std::vector<parallel::ContextAttentionOptions> every_option = {
    {.kind = ContextKind::ring},
    {.kind = ContextKind::ring, .load_balanced = true},
    {.kind = ContextKind::ring, .load_balanced = true, .overlap = false},
    {.kind = ContextKind::allgather},
    {.kind = ContextKind::allgather, .load_balanced = true},
    {.kind = ContextKind::ulysses},
    {.kind = ContextKind::ulysses, .load_balanced = true},
};

}  // namespace

TEST_CASE("load-balanced order: rank r stores chunks r and 2cp-1-r, a permutation undone exactly", "[cp]") {
  const auto order = parallel::load_balanced_order(16, 2);
  REQUIRE(order == std::vector<Extent>{0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11});
  for (Extent seq : {0, 1, 3, 7, 13, 16, 31}) {
    for (int cp : {1, 2, 3, 4}) {
      auto o = parallel::load_balanced_order(seq, cp);
      std::sort(o.begin(), o.end());
      std::vector<Extent> iota(static_cast<std::size_t>(seq));
      std::iota(iota.begin(), iota.end(), Extent(0));
      REQUIRE(o == iota);
      // Each rank's pieces cover exactly what Shard<1> gives it.
      for (int r = 0; r < cp; ++r) {
        Extent n = 0;
        for (const auto& p : parallel::context_pieces(seq, cp, r, true)) n += p.size;
        REQUIRE(n == chunk_range(seq, cp, r).size());
      }
    }
  }
  const auto x = normal<double>(Shape<3>{2, 13, 3}, 5);
  REQUIRE(equal(parallel::undo_load_balance(parallel::load_balance(x, 1, 3), 1, 3), x));
  REQUIRE_FALSE(equal(parallel::load_balance(x, 1, 3), x));
  REQUIRE(parallel::parse_context_kind("ulysses") == ContextKind::ulysses);
  REQUIRE_THROWS_AS(parallel::parse_context_kind("zigzag"), Error);
}

TEST_CASE("context attention (ring, all-gather, Ulysses) equals one-rank attention, with its collectives", "[cp]") {
  using Mesh = DeviceMesh<"cp">;
  for (int cp : {2, 4}) {
    for (Extent seq : {Extent(16), Extent(13), Extent(3)}) {  // even, uneven, fewer than 2cp (some ranks empty)
      const auto ref = reference(seq, 100 + std::uint64_t(seq));
      for (const auto& o : every_option) {
        INFO("cp " << cp << ", T " << seq << ", " << name_of(o.kind) << (o.load_balanced ? " balanced" : "")
                   << (o.overlap ? "" : " no overlap"));
        auto f = on_ranks(cp, [&](CommPtr world, auto report) {
          Mesh mesh(world, {cp});
          report(expected_collectives(o.kind, cp, run_case<Layout<Shard<2>>>(mesh, ref, o, report)));
        });
        INFO((f.empty() ? "" : f.front()));
        REQUIRE(f.empty());
      }
    }
  }
}

TEST_CASE("one context rank: one kernel call, bit for bit the one-rank attention, no collective", "[cp]") {
  // issue 32: with cp = 1 the pieces' slices, the merge with an empty block and the copies back
  // are skipped; the result must be exactly kernels::attention's (the reference here)
  using Mesh = DeviceMesh<"cp">;
  for (Extent seq : {Extent(16), Extent(13), Extent(3)}) {
    const auto ref = reference(seq, 300 + std::uint64_t(seq));
    for (const auto& o : every_option) {
      if (o.kind == ContextKind::ulysses) continue;  // its own path (heads over ranks), not the chunked one
      INFO("T " << seq << ", " << name_of(o.kind) << (o.load_balanced ? " balanced" : ""));
      auto f = on_ranks(1, [&](CommPtr world, auto report) {
        Mesh mesh(world, {1});
        const auto st = run_case<Layout<Shard<2>>>(mesh, ref, o, report);
        if (st.fwd_send_recv + st.bwd_send_recv + st.fwd_a2a + st.bwd_a2a + st.fwd_ag + st.bwd_ag + st.bwd_rs + st.other)
          report("a collective on a context group of one rank");
        if (st.pairs != std::size_t(B * H * seq * (seq + 1) / 2)) report("pairs " + std::to_string(st.pairs));
        const auto x = [&](const HostTensor<double, 4>& t) { return distribute_replicated<Layout<Shard<2>>>(mesh, t); };
        auto [out, saved] = parallel::context_attention(x(ref.q), x(ref.k), x(ref.v), o);
        auto g = parallel::context_attention_backward(x(ref.dout), x(ref.q), x(ref.k), x(ref.v), out, saved, o);
        if (!equal(out.to_local(), ref.out) || !equal(g.dq.to_local(), ref.dq) || !equal(g.dk.to_local(), ref.dk) ||
            !equal(g.dv.to_local(), ref.dv))
          report("not bit for bit the one-rank kernel's out / dq / dk / dv");
      });
      INFO((f.empty() ? "" : f.front()));
      REQUIRE(f.empty());
    }
  }
  // shared KV heads (kv_repeat 2): one rank against the chunked ring of cp = 2
  const auto ref = reference(13, 400);
  const auto kv = [](const HostTensor<double, 4>& t) {  // the first H / 2 heads
    auto h = HostTensor<double, 4>::uninitialized(Shape<4>{B, H / 2, t.extent(2), D});
    copy_box(t, Shape<4>{}, h, Shape<4>{}, h.shape());
    return h;
  };
  const auto k = kv(ref.k), v = kv(ref.v);
  const auto run = [&](int cp) {
    std::array<HostTensor<double, 4>, 4> r;
    threads::run(cp, [&](CommPtr w) {
      Mesh mesh(w, {cp});
      const parallel::ContextAttentionOptions o{.kind = ContextKind::ring, .kv_repeat = 2};
      const auto x = [&](const HostTensor<double, 4>& t) { return distribute_replicated<Layout<Shard<2>>>(mesh, t); };
      auto [out, saved] = parallel::context_attention(x(ref.q), x(k), x(v), o);
      auto g = parallel::context_attention_backward(x(ref.dout), x(ref.q), x(k), x(v), out, saved, o);
      std::array<HostTensor<double, 4>, 4> mine{full_tensor(out), full_tensor(g.dq), full_tensor(g.dk), full_tensor(g.dv)};
      if (w->rank() == 0) r = std::move(mine);
    });
    return r;
  };
  const auto one = run(1), two = run(2);
  const char* names[] = {"kv_repeat 2: out", "kv_repeat 2: dq", "kv_repeat 2: dk", "kv_repeat 2: dv"};
  for (std::size_t i = 0; i < 4; ++i) CHECK(differs(names[i], one[i], two[i]).empty());
}

TEST_CASE("context attention composes with data and tensor parallelism (2-D and 3-D meshes)", "[cp]") {
  const auto ref = reference(11, 7);
  for (const auto& o : every_option) {
    INFO(name_of(o.kind) << (o.load_balanced ? " balanced" : ""));
    auto f = on_ranks(4, [&](CommPtr world, auto report) {  // ("dp", "cp"): batch and sequence split
      DeviceMesh<"dp", "cp"> mesh(world, {2, 2});
      report(expected_collectives(o.kind, 2, run_case<Layout<Shard<0>, Shard<2>>>(mesh, ref, o, report)));
    });
    INFO((f.empty() ? "" : f.front()));
    REQUIRE(f.empty());
    f = on_ranks(8, [&](CommPtr world, auto report) {  // ("dp", "cp", "tp"): heads split by tp first
      DeviceMesh<"dp", "cp", "tp"> mesh(world, {2, 2, 2});
      report(expected_collectives(o.kind, 2, run_case<Layout<Shard<0>, Shard<2>, Shard<1>>>(mesh, ref, o, report)));
    });
    INFO((f.empty() ? "" : f.front()));
    REQUIRE(f.empty());
  }
}

TEST_CASE("Ulysses needs the local heads to divide by the context size", "[cp]") {
  const auto ref = reference(8, 3);  // 4 heads: 2 per tp rank, not divisible by cp = 4
  auto f = on_ranks(8, [&](CommPtr world, auto report) {
    DeviceMesh<"cp", "tp"> mesh(world, {4, 2});
    using L = Layout<Shard<2>, Shard<1>>;
    auto q = distribute_replicated<L>(mesh, ref.q);
    try {
      (void)parallel::context_attention(q, q, q, {.kind = ContextKind::ulysses});
      report("no error");
    } catch (const Error& e) {
      if (std::string(e.what()).find("heads") == std::string::npos) report(std::string("unclear error: ") + e.what());
    }
  });
  INFO((f.empty() ? "" : f.front()));
  REQUIRE(f.empty());
}

TEST_CASE("causal load balancing evens the per-rank attention work", "[cp]") {
  for (Extent seq : {Extent(64), Extent(250)}) {
    const int cp = 4;
    const auto ref = reference(seq, 9);
    std::vector<std::size_t> pairs_plain(cp), pairs_balanced(cp);
    for (bool balanced : {false, true}) {
      auto f = on_ranks(cp, [&](CommPtr world, auto report) {
        DeviceMesh<"cp"> mesh(world, {cp});
        const auto st = run_case<Layout<Shard<2>>>(mesh, ref, {.load_balanced = balanced}, report);
        (balanced ? pairs_balanced : pairs_plain)[std::size_t(world->rank())] = st.pairs;
      });
      REQUIRE(f.empty());
    }
    const auto spread = [](const std::vector<std::size_t>& p) {
      const auto [lo, hi] = std::minmax_element(p.begin(), p.end());
      return double(*hi - *lo) / double(*hi);
    };
    // Every causal score is computed exactly once, whichever the layout.
    const auto total = std::size_t(B * H) * std::size_t(seq * (seq + 1) / 2);
    REQUIRE(std::accumulate(pairs_plain.begin(), pairs_plain.end(), std::size_t(0)) == total);
    REQUIRE(std::accumulate(pairs_balanced.begin(), pairs_balanced.end(), std::size_t(0)) == total);
    WARN("T " << seq << ", cp " << cp << ": per-rank (q, k) scores, plain " << pairs_plain[0] << " .. " << pairs_plain[3]
              << " (spread " << spread(pairs_plain) << "), balanced " << pairs_balanced[0] << " .. "
              << pairs_balanced[3] << " (spread " << spread(pairs_balanced) << ")");
    REQUIRE(spread(pairs_balanced) < 0.05);
    REQUIRE(spread(pairs_plain) > 0.5);
  }
}

TEST_CASE("ring attention issues the next K/V transfer before the current chunk's attention", "[cp]") {
  const auto ref = reference(12, 4);
  for (bool overlap : {true, false}) {
    std::vector<parallel::ContextEvent> trace;
    auto f = on_ranks(3, [&](CommPtr world, auto report) {
      DeviceMesh<"cp"> mesh(world, {3});
      std::vector<parallel::ContextEvent> mine;
      parallel::ContextAttentionOptions o{.load_balanced = true, .overlap = overlap, .trace = &mine};
      run_case<Layout<Shard<2>>>(mesh, ref, o, report);
      if (world->rank() == 1) trace = mine;
    });
    REQUIRE(f.empty());
    using E = parallel::ContextEvent;
    const std::vector<E> split_phase{{E::issue, 1}, {E::compute, 0}, {E::wait, 1}, {E::issue, 2},
                                     {E::compute, 1}, {E::wait, 2},  {E::compute, 2}};
    const std::vector<E> serial{{E::compute, 0}, {E::issue, 1}, {E::wait, 1}, {E::compute, 1},
                                {E::issue, 2},   {E::wait, 2},  {E::compute, 2}};
    REQUIRE(trace == (overlap ? split_phase : serial));
  }
}

namespace {

constexpr Extent block_batch = 2, block_seq = 9, block_dim = 8, block_heads = 4;
const auto block_x = normal<double>(Shape<3>{block_batch, block_seq, block_dim}, 61);
const auto block_r = normal<double>(Shape<3>{block_batch, block_seq, block_dim}, 62);

/// The block's forward and backward of J = sum(y * r) on `mesh`, the gradient syncs (context,
/// sequence parallel, data), and the output, input gradient and whole gradients, in original order.
template <class Plan, class Mesh>
ModuleRun<3> cp_block_run(const Mesh& mesh, parallel::ContextAttentionOptions o, bool causal = true) {
  nn::BlockConfig cfg{block_dim, block_heads, block_seq, 4, 0.3, 0.3};
  cfg.context = o;
  cfg.causal = causal;
  nn::TransformerBlock<double, Mesh, Plan, nn::MLP<double, Mesh, typename Plan::fc1, typename Plan::fc2>,
                       nn::LayerNorm<double, Mesh, typename Plan::between>, parallel::PlanAttention<double, Mesh, Plan>>
      blk("h.0", mesh, cfg, 3);
  using X = typename decltype(blk)::X;
  const int cp = parallel::context_size(mesh);
  const bool balanced = o.load_balanced && cp > 1;
  const auto stored = [&](const Tensor<double, 3>& t) {
    return distribute_replicated<typename X::layout>(mesh, balanced ? parallel::load_balance(t, 1, cp) : t);
  };
  const auto original = [&](const X& t) {
    auto full = full_tensor(t);
    return balanced ? parallel::undo_load_balance(full, 1, cp) : full;
  };
  nn::ParamList<double, Mesh::ndim> ps;
  nn::collect(blk, ps);
  for (auto& p : ps) p.zero_grad();
  auto [y, saved] = blk.forward(stored(block_x));
  auto [dx, wctx] = blk.backward_input(std::move(saved), stored(block_r));
  blk.backward_weight(std::move(wctx));
  parallel::context_parallel_grads(ps, mesh);
  parallel::sequence_parallel_grads(ps, mesh);
  if constexpr (has_role<Mesh, Role::data>) parallel::DataParallel<Mesh>(mesh).all_reduce_gradients(ps);
  return {original(y), original(dx), whole_grads(blk)};
}

}  // namespace

TEST_CASE("transformer block with a context dimension equals the one-rank block", "[cp][nn]") {
  ModuleRun<3> ref;
  threads::run(1, [&](CommPtr w) { ref = cp_block_run<nn::ReplicatedPlan>(NnMesh(w, {1, 1}), {}); });
  for (const auto& o : every_option) {
    INFO(name_of(o.kind) << (o.load_balanced ? " balanced" : ""));
    auto f = on_ranks(2, [&](CommPtr world, auto report) {  // CP = 2
      report(compare_runs(cp_block_run<nn::ReplicatedPlan>(DeviceMesh<"cp">(world, {2}), o), ref, 1e-10));
    });
    INFO((f.empty() ? "" : f.front()));
    REQUIRE(f.empty());
    f = on_ranks(4, [&](CommPtr world, auto report) {  // CP = 2 x DP = 2
      report(compare_runs(cp_block_run<nn::ReplicatedPlan>(DeviceMesh<"dp", "cp">(world, {2, 2}), o), ref, 1e-10));
    });
    INFO((f.empty() ? "" : f.front()));
    REQUIRE(f.empty());
    f = on_ranks(4, [&](CommPtr world, auto report) {  // CP = 2 x TP = 2, without and with SP
      DeviceMesh<"cp", "tp"> mesh(world, {2, 2});
      report(compare_runs(cp_block_run<parallel::MegatronPlan<false>>(mesh, o), ref, 1e-10));
      report(compare_runs(cp_block_run<parallel::MegatronPlan<true>>(mesh, o), ref, 1e-10));
    });
    INFO((f.empty() ? "" : f.front()));
    REQUIRE(f.empty());
  }
}

TEST_CASE("non-causal attention (an encoder block) on one rank equals cp = 2: ring, all-gather, Ulysses", "[cp][nn]") {
  // The mask is the attention module's parameter (AttentionConfig::causal, BlockConfig::causal),
  // honoured by the local core and the context-parallel core alike, so an encoder block gives the
  // same output and gradients on every mesh (double: 1e-12).
  ModuleRun<3> ref, causal_ref;
  threads::run(1, [&](CommPtr w) {
    ref = cp_block_run<nn::ReplicatedPlan>(NnMesh(w, {1, 1}), {}, /*causal=*/false);
    causal_ref = cp_block_run<nn::ReplicatedPlan>(NnMesh(w, {1, 1}), {}, /*causal=*/true);
  });
  REQUIRE_FALSE(compare_runs(ref, causal_ref, 1e-6).empty());  // the flag is honoured on one rank too
  for (const auto& o : every_option) {
    INFO(name_of(o.kind) << (o.load_balanced ? " balanced" : ""));
    auto f = on_ranks(2, [&](CommPtr world, auto report) {  // CP = 2
      report(compare_runs(cp_block_run<nn::ReplicatedPlan>(DeviceMesh<"cp">(world, {2}), o, false), ref, 1e-12));
    });
    INFO((f.empty() ? "" : f.front()));
    REQUIRE(f.empty());
    f = on_ranks(4, [&](CommPtr world, auto report) {  // CP = 2 x TP = 2 with SP
      report(compare_runs(cp_block_run<parallel::MegatronPlan<true>>(DeviceMesh<"cp", "tp">(world, {2, 2}), o, false), ref,
                          1e-12));
    });
    INFO((f.empty() ? "" : f.front()));
    REQUIRE(f.empty());
  }
}

namespace {

/// The bytes this rank's attention saved state refers to between forward and backward (its
/// activation memory): the qkv and out projections' inputs, q, k, v, out and the statistics, and
/// under context parallelism what context attention keeps (Ulysses: the head-split tensors).
template <class Saved>
std::size_t attention_saved_bytes(const Saved& s) {
  std::size_t n = 0;
  const auto add = [&](const auto&... t) { ((n += std::size_t(t.numel()) * sizeof(*t.data())), ...); };
  add(s.qkv.x.to_local(), s.q.to_local(), s.k.to_local(), s.v.to_local(), s.out.to_local(), s.proj.x.to_local());
  add(s.core.lse, s.core.q, s.core.k, s.core.v, s.core.out);
  return n;
}

}  // namespace

TEST_CASE("attention activation memory per rank falls as 1/cp", "[cp][memory]") {
  // A long sequence for a narrow model: the saved activations ([B, T, C] and [B, H, T]) dwarf the
  // 4 C^2 parameters, and all of them split with the sequence.
  constexpr Extent batch = 1, seq = 256, dim = 16, heads = 4;
  const auto x = normal<double>(Shape<3>{batch, seq, dim}, 71);
  using Mesh = DeviceMesh<"cp">;
  using Attention = parallel::PlanAttention<double, Mesh, nn::ReplicatedPlan>;
  for (const auto& o : every_option) {
    std::map<int, std::vector<std::size_t>> bytes;  // cp -> per rank
    for (int cp : {1, 2, 4}) {
      std::mutex m;
      bytes[cp].resize(std::size_t(cp));
      threads::run(cp, [&](CommPtr world) {
        Mesh mesh(world, {cp});
        Attention attn("attn", mesh, {dim, heads, seq, o}, 5);
        auto xs = distribute_replicated<typename Attention::In::layout>(
            mesh, o.load_balanced ? parallel::load_balance(x, 1, cp) : x);
        const auto saved = attn.forward(xs).saved;
        std::lock_guard lock(m);
        bytes[cp][std::size_t(world->rank())] = attention_saved_bytes(saved);
      });
    }
    const std::size_t whole = bytes[1][0];
    INFO(name_of(o.kind) << (o.load_balanced ? " balanced" : "") << ": one rank " << whole << " bytes; cp 2: "
                         << bytes[2][0] << ", " << bytes[2][1] << "; cp 4: " << bytes[4][0] << " .. " << bytes[4][3]);
    REQUIRE(whole > std::size_t(seq * dim) * sizeof(double) * 6);  // at least [B,T,C] x (x, q, k, v, out, proj's x)
    for (int cp : {2, 4})
      for (std::size_t r : bytes[cp]) REQUIRE(r * std::size_t(cp) == whole);
  }
}

}  // namespace test_context_parallel
