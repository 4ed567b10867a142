// nn::CausalSelfAttention and nn::TransformerBlock: backward against finite differences (one
// rank, double), Megatron TP (with and without SP) against the one-rank module, and activation
// checkpointing (nn::Checkpointed) giving the same gradients as keeping the activations.
// Activations [B, T, C]: B = 3 splits unevenly over dp = 2, T = 6 over tp = 4 under sequence
// parallelism (2, 2, 2, 0), shorter than the configured sequence (8).
#include <catch2/catch.hpp>

#include "dtensor/nn/block.hpp"
#include "dtensor/nn/checkpoint.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "test_nn_support.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_nn_attention {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

constexpr Extent B = 3, T = 6, C = 8, H = 4, SEQ = 8;
const auto x_full = normal<double>(Shape<3>{B, T, C}, 51);
const auto r_full = normal<double>(Shape<3>{B, T, C}, 52);
const nn::BlockConfig bc{C, H, SEQ, 4, 0.3, 0.3};

template <class Plan>
ModuleRun<3> block_run(const NnMesh& mesh, bool checkpoint) {
  nn::Checkpointed<nn::TransformerBlock<double, NnMesh, Plan>> blk(checkpoint, "h.0", mesh, bc, 3);
  auto x = distribute_replicated<typename decltype(blk)::In::layout>(mesh, x_full);
  return run_module(blk, mesh, x, r_full);
}

template <class Plan>
ModuleRun<3> attn_run(const NnMesh& mesh) {
  nn::CausalSelfAttention<double, NnMesh, typename Plan::qkv, typename Plan::proj> a("attn", mesh, {C, H, SEQ}, 3, 0.3,
                                                                                       0.3);
  auto x = distribute_replicated<typename decltype(a)::In::layout>(mesh, x_full);
  return run_module(a, mesh, x, r_full);
}

}  // namespace

TEST_CASE("CausalSelfAttention and TransformerBlock match finite differences", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    nn::CausalSelfAttention<double, NnMesh> a("attn", mesh, {C, H, SEQ}, 3, 0.3, 0.3);
    auto e = fd_check(a, x, r_full);
    INFO(e);
    REQUIRE(e.empty());
    nn::TransformerBlock<double, NnMesh> blk("h.0", mesh, bc, 3);
    e = fd_check(blk, x, r_full);
    INFO(e);
    REQUIRE(e.empty());
  });
}

TEST_CASE("attention is causal: a position's output ignores later positions and other sequences", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::CausalSelfAttention<double, NnMesh> a("attn", mesh, {C, H, SEQ}, 3, 0.3, 0.3);
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    const auto y0 = full_tensor(a.forward(x).y);
    x.local()(Extent(1), Extent(T - 1), Extent(0)) += 1.0;  // the last position of the second sequence
    const auto y1 = full_tensor(a.forward(x).y);
    for (Extent b = 0; b < B; ++b)
      for (Extent t = 0; t < T; ++t)
        for (Extent c = 0; c < C; ++c)
          if (b != 1 || t + 1 < T) REQUIRE(y0(b, t, c) == y1(b, t, c));
    REQUIRE(y0(1, T - 1, 0) != y1(1, T - 1, 0));
  });
}

TEST_CASE("Megatron attention and block (TP, TP+SP, checkpointing) equal the one-rank modules", "[nn][parallel]") {
  ModuleRun<3> attn_ref, block_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    attn_ref = attn_run<nn::ReplicatedPlan>(mesh);
    block_ref = block_run<nn::ReplicatedPlan>(mesh, false);
    // Checkpointing recomputes the forward: the same gradients, bit for bit.
    REQUIRE(compare_runs(block_run<nn::ReplicatedPlan>(mesh, true), block_ref, 0).empty());
  });
  for (std::array<int, 2> shape : {std::array{1, 4}, std::array{2, 2}}) {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      report(compare_runs(attn_run<parallel::MegatronPlan<false>>(mesh), attn_ref));
      report(compare_runs(attn_run<parallel::MegatronPlan<true>>(mesh), attn_ref));
      report(compare_runs(block_run<parallel::MegatronPlan<false>>(mesh, false), block_ref));
      report(compare_runs(block_run<parallel::MegatronPlan<true>>(mesh, false), block_ref));
      report(compare_runs(block_run<parallel::MegatronPlan<true>>(mesh, true), block_ref));
      // A block's collectives per pass: TP two all-reduces; TP + SP forward two all-gathers and two
      // reduce-scatters, backward the same plus the re-gather of qkv's and fc1's saved input shards.
      nn::TransformerBlock<double, NnMesh, parallel::MegatronPlan<true>> blk("h.0", mesh, bc, 3);
      auto x = distribute_replicated<nn::tokens<NnMesh, nn::SeqSplit>>(mesh, x_full);
      CommLog fl;
      auto [y, saved] = blk.forward(x);
      if (fl.size() != 4 || fl.count(CollectiveKind::all_gather, "tp") != 2 || fl.count(CollectiveKind::reduce_scatter, "tp") != 2)
        report("SP block forward issued:\n" + fl.to_string());
      CommLog bl;
      auto [dx, wctx] = blk.backward_input(std::move(saved), y);
      if (bl.size() != 6 || bl.count(CollectiveKind::all_gather, "tp") != 4 || bl.count(CollectiveKind::reduce_scatter, "tp") != 2)
        report("SP block backward issued:\n" + bl.to_string());
      CommLog wl;
      blk.backward_weight(std::move(wctx));
      if (wl.size() != 0) report("backward_weight communicated:\n" + wl.to_string());
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("attention checks heads against tp and positions against the configured sequence", "[nn]") {
  auto f = on_ranks(4, [&](CommPtr w, auto report) {
    NnMesh mesh(w, {1, 4});
    using A = nn::CausalSelfAttention<double, NnMesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>>;
    try {
      A("attn", mesh, {C, 2, SEQ}, 3);  // 2 heads over tp = 4
      report("no error for 2 heads over tp = 4");
    } catch (const Error& e) {
      if (std::string(e.what()).find("heads") == std::string::npos) report(e.what());
    }
    A a("attn", mesh, {C, H, T - 1}, 3);  // T positions, more than the T - 1 configured
    try {
      (void)a.forward(distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full));
      report("no error for more positions than the configured sequence");
    } catch (const Error& e) {
      if (std::string(e.what()).find("nn::CausalSelfAttention::forward") == std::string::npos) report(e.what());
    }
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

}  // namespace test_nn_attention
