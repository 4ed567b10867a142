// MoE GPT training parity (threads backend): expert parallel runs — EP alone, EP x DP, EP x TP —
// against the one-rank MoE GPT (also with experts that do not divide over ep), 20 AdamW steps in
// double, losses within 1e-5 relative; the same for the Llama MoE (SwiGLU experts); and the
// expert collectives of a step (per MoE block: 1 count exchange + 2 all_to_all_v each way).
#include <catch2/catch.hpp>

#include <mutex>

#include "dtensor/comm/threads.hpp"

#include "moe_parity.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

/// The one-rank run of a configuration (Dense: the blocks, GPT's or Llama's).
template <class Dense = models::DenseLayers>
std::vector<double> reference(const models::MoELayersConfig& mc) {
  std::vector<double> l;
  threads::run(1, [&](CommPtr w) {
    l = run_moe_parity<nn::ReplicatedPlan, GptMesh, ExpertMesh, Dense>(w, {1, 1}, 1, mc).losses;
  });
  return l;
}

/// Every rank of a (dp, tp) x ep run matches the reference and issues the expert collectives.
template <class Plan, class Dense = models::DenseLayers>
void check_moe(int dp, int tp, int ep, const models::MoELayersConfig& mc, const std::vector<double>& ref) {
  const std::size_t moe_blocks = std::size_t(parity_config().layers / mc.every);
  std::mutex m;
  std::vector<std::string> errors;
  threads::run(dp * tp, [&](CommPtr world) {
    auto r = run_moe_parity<Plan, GptMesh, ExpertMesh, Dense>(world, {dp, tp}, ep, mc);
    std::string e = compare_losses(r.losses, ref, 1e-5);
    // The node-level dispatch (mc.node_size): the same per stage, across the nodes and inside one.
    const Counts expected = mc.node_size > 0
                                ? Counts{{"all_to_all/ep_across", moe_blocks},
                                         {"all_to_all/ep_node", moe_blocks},
                                         {"all_to_all_v/ep_across", 4 * moe_blocks},
                                         {"all_to_all_v/ep_node", 4 * moe_blocks}}
                                : Counts{{"all_to_all/ep", moe_blocks}, {"all_to_all_v/ep", 4 * moe_blocks}};
    Counts got;
    for (const auto& [k, n] : r.model)
      if (k.ends_with("/ep") || k.ends_with("/ep_across") || k.ends_with("/ep_node")) got[k] = n;
    if (got != expected) e += " expert collectives " + to_string(got) + " expected " + to_string(expected);
    if (!e.empty()) {
      std::lock_guard lock(m);
      errors.push_back("rank " + std::to_string(world->rank()) + ": " + e);
    }
  });
  std::string all;
  for (const auto& e : errors) all += e + "\n";
  INFO("dp " << dp << " tp " << tp << " ep " << ep << " every " << mc.every << "\n" << all);
  CHECK(errors.empty());
}

}  // namespace

TEST_CASE("MoE GPT parity: the reference trains, and its loss includes the auxiliary losses", "[parity][moe]") {
  auto mc = moe_parity_config(4, 2, 1);
  const auto ref = reference(mc);
  REQUIRE(ref.size() == std::size_t(parity_steps));
  CHECK(ref.back() < 0.8 * ref.front());
  mc.router.aux_loss_coeff = 0.5;  // a larger coefficient adds more to the step-1 loss (same parameters)
  CHECK(reference(mc).front() > ref.front());
}

TEST_CASE("MoE GPT parity: EP=2 and EP=4, every block MoE (E=4, k=2)", "[parity][moe]") {
  const auto mc = moe_parity_config(4, 2, 1);
  const auto ref = reference(mc);
  check_moe<nn::ReplicatedPlan>(2, 1, 2, mc, ref);
  check_moe<nn::ReplicatedPlan>(4, 1, 4, mc, ref);
}

TEST_CASE("MoE GPT parity: every other block MoE, EP=2 (E=4, k=1)", "[parity][moe]") {
  const auto mc = moe_parity_config(4, 1, 2);
  check_moe<nn::ReplicatedPlan>(2, 1, 2, mc, reference(mc));
}

TEST_CASE("MoE GPT parity: EP=2 x DP=2 and EP x TP on 4 and 8 threads", "[parity][moe]") {
  const auto mc = moe_parity_config(4, 2, 1);
  const auto ref = reference(mc);
  check_moe<nn::ReplicatedPlan>(4, 1, 2, mc, ref);           // edp 2 x ep 2
  check_moe<parallel::MegatronPlan<false>>(2, 2, 2, mc, ref);  // ep 2 x tp 2
  check_moe<parallel::MegatronPlan<false>>(4, 2, 2, mc, ref);  // edp 2 x ep 2 x tp 2
  check_moe<parallel::MegatronPlan<false>>(4, 2, 4, mc, ref);  // ep 4 x tp 2
}

TEST_CASE("MoE GPT parity: experts that do not divide over ep (3 over 2: 2 + 1; 3 over 4: 1 + 1 + 1 + 0)",
          "[parity][moe][uneven]") {
  const auto mc = moe_parity_config(3, 2, 1);
  const auto ref = reference(mc);
  check_moe<nn::ReplicatedPlan>(2, 1, 2, mc, ref);
  check_moe<nn::ReplicatedPlan>(4, 1, 4, mc, ref);           // the last expert rank owns none
  check_moe<parallel::MegatronPlan<false>>(4, 2, 2, mc, ref);  // edp 2 x ep 2 x tp 2
}

TEST_CASE("MoE GPT parity: the node-level dispatch, EP 4 in nodes of 2 (x TP 2), uneven experts",
          "[parity][moe][nodes]") {
  // parallel/node_dispatch.hpp through models::MoELayers (one pair of node groups for every MoE
  // block): 20 AdamW steps within 1e-5 of the one-rank run, and per block the collectives of
  // both stages (on "ep_across" and "ep_node").
  for (Extent experts : {4, 3}) {  // 3 over 4 ranks: 1, 1, 1, 0 (nodes of 2 own 2 and 1)
    auto mc = moe_parity_config(experts, 2, 1);
    const auto ref = reference(mc);
    mc.node_size = 2;
    check_moe<nn::ReplicatedPlan>(4, 1, 4, mc, ref);
    if (experts == 4) check_moe<parallel::MegatronPlan<false>>(4, 2, 4, mc, ref);  // ep 4 x tp 2
  }
}

TEST_CASE("Llama MoE parity (SwiGLU experts, RMSNorm, rotary attention): EP, EP x DP, EP x TP, uneven experts",
          "[parity][moe][llama]") {
  // models::LlamaMoE's blocks: SwiGLU experts (w1, w3, w2, no biases) and SwiGLU dense
  // feed-forwards in the blocks without experts (every other block here).
  auto mc = moe_parity_config(3, 2, 2);  // 3 experts over ep 2: 2 + 1
  const auto ref = reference<models::LlamaLayers>(mc);
  REQUIRE(ref.size() == std::size_t(parity_steps));
  CHECK(ref.back() < 0.8 * ref.front());
  CHECK(ref.front() != reference(mc).front());  // not the GPT's blocks
  check_moe<nn::ReplicatedPlan, models::LlamaLayers>(2, 1, 2, mc, ref);
  check_moe<parallel::MegatronPlan<false>, models::LlamaLayers>(4, 2, 2, mc, ref);  // edp 2 x ep 2 x tp 2
  // DeepSeek's shared experts: 2 x the experts' width in one SwiGLU every token passes through,
  // split by Megatron's styles under TP (with SP too: on the block's layout, no gather).
  mc.shared = 2;
  const auto shared = reference<models::LlamaLayers>(mc);
  CHECK(shared.front() != ref.front());
  CHECK(shared.back() < 0.8 * shared.front());
  check_moe<nn::ReplicatedPlan, models::LlamaLayers>(4, 1, 2, mc, shared);             // edp 2 x ep 2
  check_moe<parallel::MegatronPlan<false>, models::LlamaLayers>(4, 2, 2, mc, shared);  // edp 2 x ep 2 x tp 2
  check_moe<parallel::MegatronPlan<true>, models::LlamaLayers>(2, 2, 2, mc, shared);   // ep 2 x tp 2 + SP
}

TEST_CASE("MoE GPT parity: shared experts (GELU MLP) beside the routed ones, EP x TP + SP", "[parity][moe]") {
  auto mc = moe_parity_config(4, 2, 1);
  mc.shared = 1;
  const auto ref = reference(mc);
  CHECK(ref.back() < 0.8 * ref.front());
  check_moe<nn::ReplicatedPlan>(2, 1, 2, mc, ref);
  check_moe<parallel::MegatronPlan<true>>(4, 2, 2, mc, ref);  // edp 2 x ep 2 x tp 2 + SP
}

TEST_CASE("MoE GPT parity: a capacity that drops drops the same tokens on every mesh", "[parity][moe]") {
  auto mc = moe_parity_config(4, 2, 1);
  mc.router.capacity_factor = 0.5;  // 2 slots per expert per sequence of 8 tokens x 2 choices
  std::int64_t dropped = 0;
  std::vector<double> ref;
  threads::run(1, [&](CommPtr w) {
    auto r = run_moe_parity<nn::ReplicatedPlan>(w, {1, 1}, 1, mc);
    ref = r.losses;
    dropped = r.dropped;
  });
  CHECK(dropped > 0);
  check_moe<nn::ReplicatedPlan>(4, 1, 2, mc, ref);
}

namespace {
/// Runs f(world) -> MoEGroupsRun on n threads; the errors `check(run)` finds, per rank.
template <class F, class C>
std::string on_threads(int n, F f, C check) {
  std::mutex m;
  std::string errors;
  threads::run(n, [&](CommPtr world) {
    auto r = f(world);
    std::string e = check(r);
    if (!e.empty()) {
      std::lock_guard lock(m);
      errors += "rank " + std::to_string(world->rank()) + ": " + e + "\n";
    }
  });
  return errors;
}
}  // namespace

TEST_CASE("MoE GPT: DataParallel and fully_shard take every parameter group, the experts over \"edp\" (E=5 over ep 2)",
          "[parity][moe][groups]") {
  // 5 experts over 2 expert ranks (3 + 2), edp 2 x ep 2 on 4 ranks; no caller code for the experts.
  const auto mc = moe_parity_config(5, 2, 1);
  const auto ref = reference(mc);
  const std::size_t moe_blocks = std::size_t(parity_config().layers / mc.every);

  SECTION("DataParallel::attach: the experts' buckets all-reduced on edp, the dense ones on dp") {
    const auto errors = on_threads(
        4, [&](CommPtr w) { return run_moe_ddp_groups<nn::ReplicatedPlan>(w, {4, 1}, 2, mc); },
        [&](const MoEGroupsRun& r) {
          std::string e = compare_losses(r.losses, ref, 1e-12);
          const Counts expected{{"all_reduce/edp", r.expected_edp_buckets}};
          if (r.expected_edp_buckets < moe_blocks || r.expert_sync != expected)
            e += " edp collectives " + to_string(r.expert_sync) + " expected " + to_string(expected);
          if (r.dense_sync.count("all_reduce/dp") == 0) e += " no all-reduce on dp";
          return e;
        });
    INFO(errors);
    CHECK(errors.empty());
  }
  for (int zero : {1, 2, 3}) {
    DYNAMIC_SECTION("fully_shard ZeRO-" << zero << ": the experts sharded over edp, the dense units over fsdp") {
      const auto errors = on_threads(
          4, [&](CommPtr w) { return run_moe_fsdp<nn::ReplicatedPlan>(w, {1, 4, 1}, 2, mc, zero); },
          [&](const MoEGroupsRun& r) {
            std::string e = compare_losses(r.losses, ref, 1e-12);
            // Per expert unit: one reduce-scatter of its gradients; its values all-gathered once
            // after the step (ZeRO-1/2) or before its forward and its backward (ZeRO-3).
            const std::size_t u = r.expert_units;
            const Counts expected{{"all_gather/edp", zero == 3 ? 2 * u : u}, {"reduce_scatter/edp", u}};
            if (u != moe_blocks || r.expert_sync != expected)
              e += " edp collectives " + to_string(r.expert_sync) + " (" + std::to_string(u) + " expert units) expected " +
                   to_string(expected);
            if (r.dense_sync.count("reduce_scatter/fsdp") == 0) e += " no reduce-scatter on fsdp";
            // The 2-expert ranks' expert units hold 2 experts, no zero gap of a third (nn::FlatEntry::slot).
            if (r.expert_gap != 0) e += " the expert units hold " + std::to_string(r.expert_gap) + " elements of gap";
            return e;
          });
      INFO(errors);
      CHECK(errors.empty());
    }
  }
}

TEST_CASE("MoE GPT: fully_shard of experts that do not divide over ep, 3 over 2 (2 + 1) and over 4 (1 + 1 + 1 + 0)",
          "[parity][moe][groups][uneven]") {
  // ZeRO-3 over "edp" 2: each expert rank's units hold its own experts only (no gap up to the
  // largest share), and a rank with no expert (ep 4) holds units of no elements, which FSDP
  // shards as any other (chunks of 0); 20 AdamW steps within 1e-12 of one rank.
  const auto mc = moe_parity_config(3, 2, 1);
  const auto ref = reference(mc);
  for (const int ep : {2, 4}) {
    const int ranks = 2 * ep;  // edp 2
    const auto errors = on_threads(
        ranks, [&](CommPtr w) { return run_moe_fsdp<nn::ReplicatedPlan>(w, {1, ranks, 1}, ep, mc, 3); },
        [&](const MoEGroupsRun& r) {
          std::string e = compare_losses(r.losses, ref, 1e-12);
          if (r.expert_gap != 0) e += " the expert units hold " + std::to_string(r.expert_gap) + " elements of gap";
          return e;
        });
    INFO("ep " << ep << ": " << errors);
    CHECK(errors.empty());
  }
}

TEST_CASE("MoE GPT: bad configurations are errors", "[moe]") {
  threads::run(2, [&](CommPtr world) {
    GptMesh mesh(world, {2, 1});
    auto emesh = parallel::make_expert_mesh<ExpertMesh>(mesh, 2);
    auto mc = moe_parity_config(4, 2, 1);
    mc.every = 0;
    CHECK_THROWS_AS((models::MoELayers<double, ExpertMesh>(emesh, mc)), Error);
    mc = moe_parity_config(4, 5, 1);  // k > E
    CHECK_THROWS_AS((models::MoELayers<double, ExpertMesh>(emesh, mc)), Error);
  });
}
