// Llama training parity on the threads backend: DP=2, TP=2, TP=2 + SP, CP=2 (ring, load
// balanced; Ulysses), CP=2 x TP=2 + SP and DP=2 x CP=2 x TP=2 + SP, each trained a few steps with
// AdamW, give the per-step losses of the one-rank ReplicatedPlan run within 1e-9 relative
// (double precision), and issue on "tp" exactly the Megatron plan's collectives (GQA and SwiGLU
// keep GPT's two entries and two exits per block). The config has grouped-query attention
// (4 heads, 2 KV heads: KV heads split over tp = 2), rotary positions, an ffn width that is not a
// multiple of dim, and a vocabulary that splits unevenly over tp.
// The same with DeepSeek's multi-head latent attention (cfg.mla, nn/latent_attention.hpp; 6 heads,
// a v head other than the q/k head): DP=2, TP=2 (+ SP), TP=3 + SP (uneven positions), CP=2 ring and
// Ulysses, CP=2 x TP=2 + SP, equal to its one-rank run, its collectives on "tp" GQA's plus MLA's
// own per block (TP: 2 all-reduces more; SP: 3 all-gathers, 1 reduce-scatter, 1 all-reduce more).
#include <catch2/catch.hpp>

#include "cp_parity.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/models/llama.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the parity test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_llama_parity {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

constexpr int llama_steps = 5;

models::GPTConfig llama_config() {
  auto c = parity_config();
  c.kv_heads = 2;
  c.ffn = 44;
  c.rope_theta = 10000;
  return c;
}

models::GPTConfig mla_config() {
  auto c = llama_config();
  c.dim = 48;  // 6 heads (over tp = 2 and 3); MLA's head sizes are its own
  c.heads = 6;
  c.kv_heads = 0;
  c.ffn = 42;  // over tp = 2 and 3
  c.mla = {.q_lora_rank = 20, .kv_lora_rank = 12, .qk_nope_head_dim = 6, .qk_rope_head_dim = 4, .v_head_dim = 5};
  return c;
}

const std::vector<double>& reference(bool mla) {
  static const auto run = [](const models::GPTConfig& c) {
    std::vector<double> l;
    threads::run(1, [&](CommPtr w) {
      l = run_cp_parity<nn::ReplicatedPlan, models::LlamaLayers>(w, {1, 1, 1}, {}, 4096, c, llama_steps).losses;
    });
    return l;
  };
  static const std::vector<double> gqa = run(llama_config()), latent = run(mla_config());
  return mla ? latent : gqa;
}
const std::vector<double>& llama_reference() { return reference(false); }

template <class Plan>
void check_config(int dp, int cp, int tp, parallel::ContextAttentionOptions o = {}, bool mla = false) {
  const auto& ref = reference(mla);
  const auto config = mla ? mla_config() : llama_config();
  auto f = on_ranks(dp * cp * tp, [&](CommPtr world, auto report) {
    auto r = run_cp_parity<Plan, models::LlamaLayers>(world, {dp, cp, tp}, o, 4096, config, llama_steps);
    report(compare_losses(r.losses, ref, 1e-9));
    Counts on_tp;
    for (const auto& [k, n] : r.model)
      if (k.ends_with("/tp")) on_tp[k] = n;
    constexpr bool tp_plan = !std::is_same_v<Plan, nn::ReplicatedPlan>;
    bool sp = false;
    if constexpr (tp_plan) sp = Plan::sequence_parallel;
    const auto layers = std::size_t(config.layers);
    auto want = expected_model_counts(tp_plan && tp > 1, sp, layers);
    if (mla && tp_plan && tp > 1) {  // MLA's collectives beyond GQA's per block (nn/latent_attention.hpp)
      if (sp) want["all_gather/tp"] += 3 * layers, want["reduce_scatter/tp"] += layers;
      want["all_reduce/tp"] += (sp ? 1 : 2) * layers;
    }
    if (on_tp != want) report("collectives on tp " + to_string(on_tp) + "; expected " + to_string(want));
  });
  INFO("dp " << dp << " cp " << cp << " tp " << tp << ": " << summary(f));
  REQUIRE(f.empty());
}

const parallel::ContextAttentionOptions ring_balanced{.kind = parallel::ContextKind::ring, .load_balanced = true};
const parallel::ContextAttentionOptions ulysses{.kind = parallel::ContextKind::ulysses, .load_balanced = true};

}  // namespace

TEST_CASE("Llama parity: the reference run trains (the loss drops)", "[parity][llama]") {
  const auto& ref = llama_reference();
  REQUIRE(ref.size() == std::size_t(llama_steps));
  INFO("first " << ref.front() << ", last " << ref.back());
  REQUIRE(ref.back() < ref.front());
}

TEST_CASE("Llama parity: DP=2", "[parity][llama]") { check_config<nn::ReplicatedPlan>(2, 1, 1); }
TEST_CASE("Llama parity: TP=2", "[parity][llama]") { check_config<parallel::MegatronPlan<false>>(1, 1, 2); }
TEST_CASE("Llama parity: TP=2 + SP", "[parity][llama]") { check_config<parallel::MegatronPlan<true>>(1, 1, 2); }
TEST_CASE("Llama parity: CP=2 ring, load balanced", "[parity][llama]") {
  check_config<nn::ReplicatedPlan>(1, 2, 1, ring_balanced);
}
TEST_CASE("Llama parity: CP=2 Ulysses", "[parity][llama]") { check_config<nn::ReplicatedPlan>(1, 2, 1, ulysses); }
TEST_CASE("Llama parity: CP=2 x TP=2 + SP", "[parity][llama]") {
  check_config<parallel::MegatronPlan<true>>(1, 2, 2, ring_balanced);
}
TEST_CASE("Llama parity: DP=2 x CP=2 x TP=2 + SP (3-D mesh)", "[parity][llama]") {
  check_config<parallel::MegatronPlan<true>>(2, 2, 2, ring_balanced);
}

TEST_CASE("Llama parity with MLA: the reference run trains", "[parity][llama][mla]") {
  const auto& ref = reference(true);
  REQUIRE(ref.size() == std::size_t(llama_steps));
  REQUIRE(ref.back() < ref.front());
  REQUIRE(ref != reference(false));  // another attention, another run
}
TEST_CASE("Llama parity with MLA: DP=2", "[parity][llama][mla]") {
  check_config<nn::ReplicatedPlan>(2, 1, 1, {}, true);
}
TEST_CASE("Llama parity with MLA: TP=2", "[parity][llama][mla]") {
  check_config<parallel::MegatronPlan<false>>(1, 1, 2, {}, true);
}
TEST_CASE("Llama parity with MLA: TP=2 + SP, TP=3 + SP", "[parity][llama][mla]") {
  check_config<parallel::MegatronPlan<true>>(1, 1, 2, {}, true);
  check_config<parallel::MegatronPlan<true>>(1, 1, 3, {}, true);
}
TEST_CASE("Llama parity with MLA: CP=2 ring (load balanced), Ulysses", "[parity][llama][mla]") {
  check_config<nn::ReplicatedPlan>(1, 2, 1, ring_balanced, true);
  check_config<nn::ReplicatedPlan>(1, 2, 1, ulysses, true);
}
TEST_CASE("Llama parity with MLA: CP=2 x TP=2 + SP", "[parity][llama][mla]") {
  check_config<parallel::MegatronPlan<true>>(1, 2, 2, ring_balanced, true);
}

}  // namespace test_llama_parity
