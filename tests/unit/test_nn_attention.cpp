// nn::CausalSelfAttention and nn::TransformerBlock: backward against finite differences (one
// rank, double), Megatron TP (with and without SP) against the one-rank module, and activation
// checkpointing giving the same gradients as keeping the activations.
#include <catch2/catch.hpp>

#include "dtensor/nn/block.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "test_nn_support.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

constexpr Extent B = 4, T = 4, C = 8, H = 4, N = B * T;
const auto x_full = normal<double>(Shape<2>{N, C}, 51);
const auto r_full = normal<double>(Shape<2>{N, C}, 52);
const nn::BlockConfig bc{C, H, T, 4, 0.3, 0.3};


template <class Plan>
ModuleRun block_run(const NnMesh& mesh, bool checkpoint) {
  nn::TransformerBlock<double, NnMesh, Plan> blk("h.0", mesh, bc, 3);
  blk.set_checkpoint(checkpoint);
  auto x = distribute_replicated<typename decltype(blk)::X::layout>(mesh, x_full);
  return run_module(blk, mesh, x, r_full, fwd(blk), bwd(blk));
}

template <class Plan>
ModuleRun attn_run(const NnMesh& mesh) {
  nn::CausalSelfAttention<double, NnMesh, typename Plan::qkv, typename Plan::proj> a("attn", mesh, {C, H, T}, 3, 0.3, 0.3);
  auto x = distribute_replicated<typename decltype(a)::In::layout>(mesh, x_full);
  return run_module(a, mesh, x, r_full, fwd(a), bwd(a));
}

}  // namespace

TEST_CASE("CausalSelfAttention and TransformerBlock match finite differences", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    nn::CausalSelfAttention<double, NnMesh> a("attn", mesh, {C, H, T}, 3, 0.3, 0.3);
    auto e = fd_check(a, x, r_full, fwd(a), bwd(a));
    INFO(e);
    REQUIRE(e.empty());
    nn::TransformerBlock<double, NnMesh> blk("h.0", mesh, bc, 3);
    e = fd_check(blk, x, r_full, fwd(blk), bwd(blk));
    INFO(e);
    REQUIRE(e.empty());
  });
}

TEST_CASE("attention is causal: a token's output ignores later tokens", "[nn]") {
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    nn::CausalSelfAttention<double, NnMesh> a("attn", mesh, {C, H, T}, 3, 0.3, 0.3);
    auto x = distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full);
    const auto y0 = full_tensor(a.forward(x));
    x.local()(Extent(T - 1), 0) += 1.0;  // the last token of the first sequence
    const auto y1 = full_tensor(a.forward(x));
    for (Extent t = 0; t + 1 < T; ++t)
      for (Extent c = 0; c < C; ++c) REQUIRE(y0(t, c) == y1(t, c));
    REQUIRE(y0(T - 1, 0) != y1(T - 1, 0));
  });
}

TEST_CASE("Megatron attention and block (TP, TP+SP, checkpointing) equal the one-rank modules", "[nn][parallel]") {
  ModuleRun attn_ref, block_ref;
  threads::run(1, [&](CommPtr w) {
    NnMesh mesh(w, {1, 1});
    attn_ref = attn_run<nn::ReplicatedPlan>(mesh);
    block_ref = block_run<nn::ReplicatedPlan>(mesh, false);
    // Checkpointing recomputes the forward: the same gradients.
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
      // A block's collectives per pass: TP two all-reduces; TP + SP two all-gathers and two reduce-scatters.
      nn::TransformerBlock<double, NnMesh, parallel::MegatronPlan<true>> blk("h.0", mesh, bc, 3);
      auto x = distribute_replicated<nn::tokens<NnMesh, Shard<0>>>(mesh, x_full);
      CommLog fl;
      auto y = blk.forward(x);
      if (fl.size() != 4 || fl.count(CollectiveKind::all_gather, "tp") != 2 || fl.count(CollectiveKind::reduce_scatter, "tp") != 2)
        report("SP block forward issued:\n" + fl.to_string());
      CommLog bl;
      blk.backward(y);
      if (bl.size() != 4 || bl.count(CollectiveKind::all_gather, "tp") != 2 || bl.count(CollectiveKind::reduce_scatter, "tp") != 2)
        report("SP block backward issued:\n" + bl.to_string());
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("attention checks heads against tp and tokens against whole sequences", "[nn]") {
  threads::run(4, [&](CommPtr w) {
    NnMesh mesh(w, {1, 4});
    using A = nn::CausalSelfAttention<double, NnMesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>>;
    REQUIRE_THROWS_AS(A("attn", mesh, {C, 2, T}, 3), Error);  // 2 heads over tp = 4
    A a("attn", mesh, {C, H, 5}, 3);                             // 16 tokens are not whole sequences of 5
    REQUIRE_THROWS_AS(a.forward(distribute_replicated<nn::tokens<NnMesh>>(mesh, x_full)), Error);
  });
}
