// GPT training parity on the threads backend: {1 rank, TP=2, TP=4, TP=2+SP, DP=2, DP=2xTP=2,
// DP=2xTP=2+SP} trained 20 steps with AdamW give the per-step losses of the one-rank
// ReplicatedPlan run within 1e-5 relative (double precision, see gpt_parity.hpp), and issue
// exactly the collectives of the plan.
#include <catch2/catch.hpp>

#include "dtensor/comm/threads.hpp"
#include "gpt_parity.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the parity test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_gpt_parity {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

template <bool SP>
void check_config(int dp, int tp, ParityOptions o = {}) {
  const auto& ref = parity_reference();
  const bool checkpoint = o.checkpoint;
  auto f = on_ranks(dp * tp, [&](CommPtr world, auto report) {
    auto r = run_parity<parallel::MegatronPlan<SP>>(world, {dp, tp}, o);
    report(compare_losses(r.losses, ref, 1e-5));
    // Forward + backward: exactly the plan's collectives (checkpointing repeats each block's forward ones).
    // A tensor dimension of size 1 issues nothing (size-1 groups never communicate).
    auto want = expected_model_counts(tp > 1, SP, 2);
    if (checkpoint && tp > 1) {
      if (SP) want["all_gather/tp"] += 2 * 2, want["reduce_scatter/tp"] += 2 * 2;
      else want["all_reduce/tp"] += 2 * 2;
    }
    if (r.model != want) report("model collectives " + to_string(r.model) + "; expected " + to_string(want));
    // SP gradient sync: all-reduces on tp only, one per bucket, and only under SP.
    if (SP ? (r.sp_sync.size() != 1 || r.sp_sync.count("all_reduce/tp") != 1) : !r.sp_sync.empty())
      report("sequence-parallel gradient sync " + to_string(r.sp_sync));
    // DDP: one all-reduce on dp per bucket.
    const Counts dp_want{{"all_reduce/dp", r.dp_buckets}};
    if (r.dp_sync != dp_want) report("DDP collectives " + to_string(r.dp_sync) + "; expected " + to_string(dp_want));
    if (r.dp_buckets < 2) report("expected several DDP buckets at 4 KiB, got " + std::to_string(r.dp_buckets));
    // Every DDP bucket is a span of a flat group, reduced in place; with overlap, issued during the backward.
    if (r.dp_copied_bytes != 0) report("DDP copied " + std::to_string(r.dp_copied_bytes) + " gradient bytes");
    if (dp > 1 && o.ddp_overlap && !r.dp_overlapped) report("no DDP all-reduce was issued during the backward");
    // Clipping: one all-reduce over the whole mesh.
    if (r.clip != Counts{{"all_reduce/dp*tp", 1}}) report("clip_grad_norm collectives " + to_string(r.clip));
  });
  INFO("dp " << dp << " tp " << tp << (SP ? " +SP" : "") << ": " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

TEST_CASE("GPT parity: the reference run trains (the loss drops)", "[parity]") {
  const auto& ref = parity_reference();
  REQUIRE(ref.size() == std::size_t(parity_steps));
  INFO("first " << ref.front() << ", last " << ref.back());
  REQUIRE(ref.back() < ref.front() - 0.3);
}

TEST_CASE("GPT parity: the Megatron plan on one rank", "[parity]") { check_config<false>(1, 1); }
TEST_CASE("GPT parity: TP=2", "[parity]") { check_config<false>(1, 2); }
TEST_CASE("GPT parity: TP=4 (vocabulary split unevenly)", "[parity]") { check_config<false>(1, 4); }
TEST_CASE("GPT parity: TP=2 + SP", "[parity]") { check_config<true>(1, 2); }
TEST_CASE("GPT parity: DP=2", "[parity]") { check_config<false>(2, 1); }
TEST_CASE("GPT parity: DP=2 x TP=2", "[parity]") { check_config<false>(2, 2); }
TEST_CASE("GPT parity: DP=2 x TP=2 + SP", "[parity]") { check_config<true>(2, 2); }
TEST_CASE("GPT parity: DP=2 x TP=2 + SP with activation checkpointing", "[parity]") {
  check_config<true>(2, 2, {.checkpoint = true});
}
TEST_CASE("GPT parity: DP=2 x TP=2 with DDP after the backward (no overlap)", "[parity]") {
  check_config<false>(2, 2, {.ddp_overlap = false});
}
TEST_CASE("GPT parity: DP=3 (the batch of 4 splits 2, 2, 0: one rank holds no sequence)", "[parity]") {
  check_config<false>(3, 1);
}

}  // namespace test_gpt_parity
