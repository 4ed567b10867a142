// GPT training parity with context parallelism on the threads backend: CP=2, CP=2 x TP=2 (with
// and without SP) and CP=2 x DP=2, for ring attention (load balanced and plain), all-gather-KV
// and Ulysses, trained 20 steps give the per-step losses of the one-rank ReplicatedPlan run
// within 1e-5 relative (double precision, see gpt_parity.hpp), issue on "cp" exactly the context
// attention's collectives, and sync the gradients on "cp" with one all-reduce per bucket.
#include <catch2/catch.hpp>

#include "cp_parity.hpp"
#include "dtensor/comm/threads.hpp"
#include "support/on_ranks.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

const parallel::ContextAttentionOptions ring_balanced{.kind = parallel::ContextKind::ring, .load_balanced = true};
const parallel::ContextAttentionOptions ring_plain{.kind = parallel::ContextKind::ring, .load_balanced = false};
const parallel::ContextAttentionOptions allgather{.kind = parallel::ContextKind::allgather, .load_balanced = true};
const parallel::ContextAttentionOptions ulysses{.kind = parallel::ContextKind::ulysses, .load_balanced = true};

template <bool SP>
void check_config(int dp, int cp, int tp, parallel::ContextAttentionOptions o) {
  const auto& ref = parity_reference();
  auto f = on_ranks(dp * cp * tp, [&](CommPtr world, auto report) {
    auto r = run_cp_parity<parallel::MegatronPlan<SP>>(world, {dp, cp, tp}, o);
    report(compare_losses(r.losses, ref, 1e-5));
    // On "cp": the attention's collectives and nothing else (the loss and embeddings are local).
    Counts on_cp;
    for (const auto& [k, n] : r.model)
      if (k.ends_with("/cp")) on_cp[k] = n;
    const auto want = expected_cp_counts(o.kind, cp, 2);
    if (on_cp != want) report("collectives on cp " + to_string(on_cp) + "; expected " + to_string(want));
    // Gradient sync on "cp": one all-reduce per bucket, several buckets at 4 KiB.
    if (r.cp_sync != Counts{{"all_reduce/cp", r.cp_buckets}} || r.cp_buckets < 2)
      report("context_parallel_grads collectives " + to_string(r.cp_sync) + ", buckets " +
             std::to_string(r.cp_buckets));
  });
  INFO("dp " << dp << " cp " << cp << " tp " << tp << (SP ? " +SP " : " ") << parallel::name_of(o.kind)
             << (o.load_balanced ? " balanced" : "") << ": " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

TEST_CASE("CP parity: CP=2, every attention kind", "[parity][cp]") {
  for (const auto& o : {ring_balanced, ring_plain, allgather, ulysses}) check_config<false>(1, 2, 1, o);
}
TEST_CASE("CP parity: CP=2 x TP=2 + SP, every attention kind", "[parity][cp]") {
  for (const auto& o : {ring_balanced, allgather, ulysses}) check_config<true>(1, 2, 2, o);
}
TEST_CASE("CP parity: CP=2 x TP=2 without SP (ring, balanced)", "[parity][cp]") {
  check_config<false>(1, 2, 2, ring_balanced);
}
TEST_CASE("CP parity: CP=2 x DP=2, every attention kind", "[parity][cp]") {
  for (const auto& o : {ring_balanced, allgather, ulysses}) check_config<false>(2, 2, 1, o);
}
