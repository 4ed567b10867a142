// GPT training parity with context parallelism on the threads backend: CP=2, CP=2 x TP=2 (with
// and without SP) and CP=2 x DP=2, for ring attention (load balanced and plain), all-gather-KV
// and Ulysses, trained 20 steps give the per-step losses of the one-rank ReplicatedPlan run
// within 1e-5 relative (double precision, see gpt_parity.hpp), issue on "cp" exactly the context
// attention's collectives, and sync the gradients on "cp" with one all-reduce per bucket.
#include <catch2/catch.hpp>

#include "cp_parity.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the parity test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_cp_parity {

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

// FSDP over fsdp x cp (issue 40 item 2): fully_shard on a GPT over (dp, fsdp, cp) shards every
// unit over the flattened "fsdp*cp" group, as torchtitan's dp_shard_cp: each unit all-gathered
// and reduce-scattered there, context_parallel_grads then has nothing left to reduce on "cp".
using FsdpCpMesh = DeviceMesh<"dp", "fsdp", "cp">;
constexpr std::size_t kFsdpUnits = 4;  // embed, h.0, h.1, head

struct FsdpCpRun {
  std::vector<double> losses;
  Counts step;             // forward, backward, finish_gradient_sync, sync_parameters of step 1
  Counts cp_sync;          // context_parallel_grads of step 1
  std::size_t cp_buckets = 0;
  std::size_t held = 0;    // elements of this rank's shards (fsdp.params())
  std::vector<std::size_t> units;  // each unit's flat elements
  std::size_t flat_index = 0;      // fsdp coordinate x cp + cp coordinate
};

FsdpCpRun run_fsdp_cp(CommPtr world, std::array<int, 3> shape, int stage) {
  FsdpCpMesh mesh(world, shape);
  auto cfg = parity_config();
  cfg.context = ring_balanced;
  using Model = models::GPT<double, FsdpCpMesh, nn::ReplicatedPlan>;
  Model model(mesh, cfg);
  FsdpCpRun out;
  for (auto& u : model.units()) out.units.push_back(u.group->size());
  out.flat_index = std::size_t(mesh.coordinate(1) * shape[2] + mesh.coordinate(2));
  auto fsdp = parallel::fully_shard(model, mesh, {.stage = stage});
  for (const auto& p : fsdp.params()) out.held += p.value.size();
  optim::AdamW<double, 3> opt(fsdp.params(), parity_adamw());
  auto stored = [&](Tensor<std::int32_t, 2> t) {
    return distribute_replicated<typename Model::Ids::layout>(mesh, parallel::load_balance(t, 1, shape[2]));
  };
  for (int s = 0; s < parity_steps; ++s) {
    auto [ids, tgt] = parity_tokens(s, cfg);
    opt.zero_grad();
    std::optional<CommLog> step_log(std::in_place);
    auto [loss, saved] = model.forward(stored(ids), stored(tgt));
    model.backward(std::move(saved));
    fsdp.finish_gradient_sync();
    Counts step = counts_of(*step_log);
    {
      CommLog cp_log;
      out.cp_buckets = parallel::context_parallel_grads(fsdp.params(), mesh, {.bucket_bytes = 4096});
      if (s == 0) out.cp_sync = counts_of(cp_log);
    }
    step_log.reset();
    optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
    opt.step();
    {
      CommLog sync_log;
      fsdp.sync_parameters();
      for (const auto& [k, n] : counts_of(sync_log)) step[k] += n;
    }
    if (s == 0) {
      out.step = step;
    }
    out.losses.push_back(full_tensor(loss)[0]);
  }
  return out;
}

void check_fsdp_cp(std::array<int, 3> shape, int stage) {
  const auto& ref = parity_reference();
  const int shard_ranks = shape[1] * shape[2];
  auto f = on_ranks(shape[0] * shard_ranks, [&](CommPtr world, auto report) {
    const auto r = run_fsdp_cp(world, shape, stage);
    report(compare_losses(r.losses, ref, 1e-5));
    // The step's collectives: the ring attention's on "cp"; per unit one reduce-scatter on
    // "fsdp*cp" and its all-gathers there (ZeRO-3: before each unit's forward and backward;
    // ZeRO-1/2: sync_parameters); HSDP one all-reduce of the shard per unit on "dp". Nothing on
    // "fsdp" alone, no all-reduce on "cp".
    auto want = expected_cp_counts(parallel::ContextKind::ring, shape[2], 2);
    want["reduce_scatter/fsdp*cp"] = kFsdpUnits;
    want["all_gather/fsdp*cp"] = stage == 3 ? 2 * kFsdpUnits : kFsdpUnits;
    if (shape[0] > 1) want["all_reduce/dp"] = kFsdpUnits;
    if (r.step != want) report("step collectives " + to_string(r.step) + "; expected " + to_string(want));
    if (!r.cp_sync.empty() || r.cp_buckets != 0)
      report("context_parallel_grads after FSDP over fsdp*cp: " + to_string(r.cp_sync) + ", " +
             std::to_string(r.cp_buckets) + " buckets; expected none");
    // This rank holds its chunk of each unit over the N' = fsdp x cp ranks, at its flattened
    // index f * cp + c (the group's rank order), torch.chunk's split: ceil(n / N') per rank, the
    // tail ranks fewer or none — one split over N', not fsdp's and then cp's.
    std::size_t want_held = 0;
    const auto nr = std::size_t(shard_ranks);
    for (std::size_t n : r.units) {
      const std::size_t c = (n + nr - 1) / nr, lo = std::min(n, r.flat_index * c);
      want_held += std::min(n, lo + c) - lo;
    }
    if (r.held != want_held)
      report("holds " + std::to_string(r.held) + " elements of its shards at flat index " + std::to_string(r.flat_index) +
             " of " + std::to_string(shard_ranks) + "; expected " + std::to_string(want_held));
  });
  INFO("dp " << shape[0] << " fsdp " << shape[1] << " cp " << shape[2] << " ZeRO-" << stage << ": " << summary(f));
  REQUIRE(f.empty());
}

}  // namespace

TEST_CASE("CP x FSDP: fully_shard over fsdp x cp (2 x 2, 3 x 2 uneven, HSDP 2 x 2 x 2), ZeRO-1/2/3", "[parity][cp][fsdp]") {
  for (int stage : {1, 2, 3}) check_fsdp_cp({1, 2, 2}, stage);
  for (int stage : {1, 3}) check_fsdp_cp({1, 3, 2}, stage);
  check_fsdp_cp({2, 2, 2}, 3);
}

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

}  // namespace test_cp_parity
