// The module protocol (nn/module.hpp): several micro-batches in flight with their backwards in
// another order (1F1B, weight gradients deferred) give the sequential run's gradients bit for
// bit; nn::Checkpointed gives the same gradients and repeats the forward's collectives; a mesh
// whose dimensions get their roles from mesh_roles computes what ("dp", "tp") computes; models::GPT
// keeps each unit's parameters contiguous in a flat group and trains the same after a move; the
// same GPT step on meta tensors over the sim backend issues the threads run's collectives and
// allocates its bytes, rank by rank (DDP and FSDP, TP + SP).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/comm/sim.hpp"
#include "dtensor/nn/block.hpp"
#include "dtensor/nn/checkpoint.hpp"
#include "dtensor/nn/swiglu.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "test_nn_support.hpp"

// A mesh whose dimension names have no conventional role: the roles are given here.
using RoleMesh = dtensor::DeviceMesh<"data", "model">;
template <>
struct dtensor::mesh_roles<RoleMesh> : dtensor::roles<dtensor::Role::data, dtensor::Role::tensor> {};

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_nn_protocol {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

static_assert(role_of<RoleMesh>(0) == Role::data && role_of<RoleMesh>(1) == Role::tensor);
static_assert(std::is_same_v<nn::tokens<RoleMesh, nn::SeqSplit>, nn::tokens<NnMesh, nn::SeqSplit>>,
              "the layouts follow the roles, not the names");

constexpr Extent B = 3, T = 6, C = 8, H = 4, SEQ = 8;
constexpr int MICRO = 4;
const nn::BlockConfig bc{C, H, SEQ, 4, 0.3, 0.3};

Tensor<double, 3> micro_x(int mb) { return normal<double>(Shape<3>{B, T, C}, 600 + std::uint64_t(mb)); }
Tensor<double, 3> micro_dy(int mb) { return normal<double>(Shape<3>{B, T, C}, 700 + std::uint64_t(mb)); }

/// One step of a schedule: 'F' forward, 'I' backward_input, 'W' backward_weight of micro-batch mb.
struct Op {
  char kind;
  int mb;
};
using Schedule = std::vector<Op>;

Schedule sequential() {
  Schedule s;
  for (int mb = 0; mb < MICRO; ++mb) s.insert(s.end(), {{'F', mb}, {'I', mb}, {'W', mb}});
  return s;
}
/// 1F1B with two in flight: F0 F1 B0 F2 B1 F3 B2 B3, each B its input then its weight gradients.
Schedule one_f_one_b() {
  return {{'F', 0}, {'F', 1}, {'I', 0}, {'W', 0}, {'F', 2}, {'I', 1}, {'W', 1},
          {'F', 3}, {'I', 2}, {'W', 2}, {'I', 3}, {'W', 3}};
}
/// 1F1B with every weight gradient deferred to the end (zero-bubble's W), in micro-batch order.
Schedule one_f_one_b_deferred() {
  return {{'F', 0}, {'F', 1}, {'I', 0}, {'F', 2}, {'I', 1}, {'F', 3}, {'I', 2}, {'I', 3},
          {'W', 0}, {'W', 1}, {'W', 2}, {'W', 3}};
}
/// Input gradients out of micro-batch order, weights deferred: the weight gradients still
/// accumulate in micro-batch order, so the sums are the sequential run's.
Schedule shuffled_inputs_deferred() {
  return {{'F', 0}, {'F', 1}, {'F', 2}, {'I', 2}, {'F', 3}, {'I', 0}, {'I', 3}, {'I', 1},
          {'W', 0}, {'W', 1}, {'W', 2}, {'W', 3}};
}

struct ScheduleRun {
  std::vector<double> grads;        // the block's flat gradient buffer (this rank, before any sync)
  std::vector<Tensor<double, 3>> dx;  // this rank's piece of each micro-batch's input gradient
};

template <class Block>
ScheduleRun run_schedule(const NnMesh& mesh, const Schedule& schedule) {
  using XL = typename Block::In::layout;
  Block blk("h.0", mesh, bc, 3);
  auto group = nn::flatten<double, 2>("h.0", blk);
  std::vector<std::optional<typename Block::Saved>> saved(MICRO);
  std::vector<std::optional<typename Block::WeightCtx>> weight(MICRO);
  ScheduleRun out;
  out.dx.resize(MICRO);
  for (const auto& [kind, mb] : schedule) {
    const auto k = std::size_t(mb);
    if (kind == 'F') {
      saved[k].emplace(blk.forward(distribute_replicated<XL>(mesh, micro_x(mb))).saved);
    } else if (kind == 'I') {
      auto [dx, w] = blk.backward_input(std::move(*saved[k]), distribute_replicated<XL>(mesh, micro_dy(mb)));
      saved[k].reset();
      out.dx[k] = dx.to_local();
      weight[k].emplace(std::move(w));
    } else {
      blk.backward_weight(std::move(*weight[k]));
      weight[k].reset();
    }
  }
  out.grads.assign(group->grads().begin(), group->grads().end());
  return out;
}

std::string compare_schedules(const ScheduleRun& got, const ScheduleRun& ref, const char* name) {
  if (got.grads != ref.grads) return detail::cat(name, ": accumulated gradients differ from the sequential run");
  for (int mb = 0; mb < MICRO; ++mb)
    if (!equal(got.dx[std::size_t(mb)], ref.dx[std::size_t(mb)]))
      return detail::cat(name, ": input gradient of micro-batch ", mb, " differs from the sequential run");
  return {};
}

template <class Plan>
void check_schedules(std::array<int, 2> shape) {
  using Block = nn::TransformerBlock<double, NnMesh, Plan>;
  auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
    NnMesh mesh(world, shape);
    const auto ref = run_schedule<Block>(mesh, sequential());
    // The micro-batches differ, so a saved state used for the wrong one would show.
    if (equal(ref.dx[0], ref.dx[1]) && ref.dx[0].numel() > 0) report("micro-batches 0 and 1 have the same dx");
    if (std::all_of(ref.grads.begin(), ref.grads.end(), [](double g) { return g == 0; })) report("no gradient");
    report(compare_schedules(run_schedule<Block>(mesh, one_f_one_b()), ref, "1F1B"));
    report(compare_schedules(run_schedule<Block>(mesh, one_f_one_b_deferred()), ref, "1F1B, weights deferred"));
    report(compare_schedules(run_schedule<Block>(mesh, shuffled_inputs_deferred()), ref, "inputs shuffled, weights deferred"));
  });
  INFO(Plan::name << " on " << to_string(shape) << ": " << summary(f));
  REQUIRE(f.empty());
}

// A small GPT: vocabulary 29 splits unevenly over tp = 2 (15, 14).
models::GPTConfig gpt_config() {
  return {.vocab = 29, .seq = SEQ, .dim = 16, .heads = 4, .layers = 2, .mlp_ratio = 2, .checkpoint = false, .seed = 5};
}

template <class Ids, class Mesh>
std::pair<Ids, Ids> gpt_batch(const Mesh& mesh, int mb) {
  const auto v = gpt_config().vocab;
  return {distribute_replicated<typename Ids::layout>(mesh, randint<std::int32_t>(Shape<2>{B, T}, 900 + std::uint64_t(mb), 0, v)),
          distribute_replicated<typename Ids::layout>(mesh, randint<std::int32_t>(Shape<2>{B, T}, 950 + std::uint64_t(mb), 0, v))};
}

/// Every unit's flat gradient buffer, one after the other (this rank).
template <class Model>
std::vector<double> unit_grads(Model& model) {
  std::vector<double> g;
  for (auto& u : model.units()) g.insert(g.end(), u.group->grads().begin(), u.group->grads().end());
  return g;
}
template <class Model>
std::vector<double> unit_values(Model& model) {
  std::vector<double> v;
  for (auto& u : model.units()) v.insert(v.end(), u.group->values().begin(), u.group->values().end());
  return v;
}

}  // namespace

TEST_CASE("micro-batches in flight, backwards in another order: the sequential run's gradients bit for bit",
          "[nn][protocol]") {
  for (std::array<int, 2> shape : {std::array{1, 2}, std::array{2, 2}}) {
    check_schedules<parallel::MegatronPlan<false>>(shape);
    check_schedules<parallel::MegatronPlan<true>>(shape);
  }
}

TEST_CASE("models::GPT: four micro-batches forward, backward_input in reverse, weights deferred == sequential",
          "[nn][protocol]") {
  using Model = models::GPT<double, NnMesh, parallel::MegatronPlan<true>>;
  for (std::array<int, 2> shape : {std::array{1, 2}, std::array{2, 2}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      Model seq(mesh, gpt_config()), split(mesh, gpt_config());
      std::vector<double> seq_loss, split_loss;
      for (int mb = 0; mb < MICRO; ++mb) {  // sequential: forward + backward per micro-batch
        auto [ids, tgt] = gpt_batch<Model::Ids>(mesh, mb);
        auto [loss, saved] = seq.forward(ids, tgt);
        seq.backward(std::move(saved));
        seq_loss.push_back(full_tensor(loss)[0]);
      }
      std::vector<Model::Saved> saved;
      for (int mb = 0; mb < MICRO; ++mb) {
        auto [ids, tgt] = gpt_batch<Model::Ids>(mesh, mb);
        auto [loss, s] = split.forward(ids, tgt);
        saved.push_back(std::move(s));
        split_loss.push_back(full_tensor(loss)[0]);
      }
      std::vector<std::optional<Model::WeightCtx>> weight(MICRO);
      for (int mb = MICRO; mb-- > 0;) weight[std::size_t(mb)].emplace(split.backward_input(std::move(saved[std::size_t(mb)])));
      const auto untouched = unit_grads(split);
      if (std::any_of(untouched.begin(), untouched.end(), [](double g) { return g != 0; }))
        report("backward_input touched a parameter gradient");
      for (int mb = 0; mb < MICRO; ++mb) split.backward_weight(std::move(*weight[std::size_t(mb)]));
      if (seq_loss != split_loss) report("losses differ");
      if (unit_grads(seq) != unit_grads(split)) report("accumulated gradients differ from the sequential run");
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("nn::Checkpointed: the same dx and gradients bit for bit, the forward's collectives again in backward",
          "[nn][protocol]") {
  using Block = nn::TransformerBlock<double, NnMesh, parallel::MegatronPlan<true>>;
  for (std::array<int, 2> shape : {std::array{1, 2}, std::array{2, 2}, std::array{1, 4}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      nn::Checkpointed<Block> on(true, "h.0", mesh, bc, 3), off(false, "h.0", mesh, bc, 3);
      auto on_group = nn::flatten<double, 2>("h.0", on);
      auto off_group = nn::flatten<double, 2>("h.0", off);
      const auto x = distribute_replicated<Block::In::layout>(mesh, micro_x(0));
      const auto dy = distribute_replicated<Block::In::layout>(mesh, micro_dy(0));
      CommLog log;  // cleared before each phase
      auto [on_y, on_saved] = on.forward(x);
      if (on_saved.index() != 1) report("an enabled checkpoint saved more than its input");
      const std::size_t on_fwd = log.size();
      log.clear();
      auto [off_y, off_saved] = off.forward(x);
      if (off_saved.index() != 0) report("a disabled checkpoint did not keep the inner saved state");
      // SP block: 2 all-gathers + 2 reduce-scatters per pass.
      if (log.size() != 4 || on_fwd != 4 || log.count(CollectiveKind::all_gather, "tp") != 2)
        report(detail::cat("forward issued (checkpointed: ", on_fwd, " collectives):\n", log.to_string()));
      if (!equal(on_y.to_local(), off_y.to_local())) report("outputs differ");
      log.clear();
      auto [on_dx, on_w] = on.backward_input(std::move(on_saved), dy);
      // The forward's 2 AG + 2 RS again, then backward's own: 2 AG + 2 RS (the adjoints) and the
      // re-gather of qkv's and fc1's saved input shards (2 AG).
      if (log.size() != 10 || log.count(CollectiveKind::all_gather, "tp") != 6 ||
          log.count(CollectiveKind::reduce_scatter, "tp") != 4)
        report("checkpointed backward did not repeat the forward's collectives:\n" + log.to_string());
      log.clear();
      auto [off_dx, off_w] = off.backward_input(std::move(off_saved), dy);
      if (log.size() != 6) report("backward issued:\n" + log.to_string());
      on.backward_weight(std::move(on_w));
      off.backward_weight(std::move(off_w));
      if (!equal(on_dx.to_local(), off_dx.to_local())) report("input gradients differ");
      if (!std::ranges::equal(on_group->grads(), off_group->grads())) report("weight gradients differ");
      if (std::ranges::all_of(off_group->grads(), [](double g) { return g == 0; })) report("no gradient");
      // Per block at run time.
      off.set_enabled(true);
      if (off.forward(x).saved.index() != 1) report("set_enabled(true) did not checkpoint");
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
}

TEST_CASE("nn::Recompute: per-module recomputation gives the same dx and gradients bit for bit", "[nn][protocol]") {
  using Plan = parallel::MegatronPlan<true>;
  using Gelu = nn::TransformerBlock<double, NnMesh, Plan>;
  using Swi = nn::TransformerBlock<double, NnMesh, Plan, nn::SwiGLU<double, NnMesh, Plan::fc1, Plan::fc2>>;
  // (list, backward collectives beyond the 4 AG + 2 RS of a block without recomputation): only
  // the whole feed-forward's recomputation issues collectives again (fc1's AG, fc2's RS).
  const std::pair<const char*, std::size_t> lists[] = {
      {"core_attn", 0}, {"norm", 0}, {"act", 0}, {"mlp", 2}, {"core_attn,norm,act", 0}, {"norm,mlp", 2}};
  auto run = [&]<class Block>(std::type_identity<Block>, const NnMesh& mesh, auto report) {
    auto make = [&](nn::Recompute r) {
      nn::BlockConfig c = bc;
      c.recompute = r;
      if constexpr (std::is_same_v<Block, Swi>)
        return Block("h.0", mesh, c, 3, typename Block::Mlp("h.0.mlp", mesh, C, 4 * C, 5, 0.3, 0.3));
      else return Block("h.0", mesh, c, 3);
    };
    const auto x = distribute_replicated<typename Block::In::layout>(mesh, micro_x(0));
    const auto dy = distribute_replicated<typename Block::In::layout>(mesh, micro_dy(0));
    auto ref = make({});
    auto ref_group = nn::flatten<double, 2>("h.0", ref);
    auto [ref_y, ref_saved] = ref.forward(x);
    auto [ref_dx, ref_w] = ref.backward_input(std::move(ref_saved), dy);
    ref.backward_weight(std::move(ref_w));
    for (const auto& [list, extra] : lists) {
      auto blk = make(nn::Recompute::parse(list));
      auto group = nn::flatten<double, 2>("h.0", blk);
      CommLog log;
      auto [y, saved] = blk.forward(x);
      if (log.size() != 4) report(detail::cat(list, ": forward issued:\n", log.to_string()));
      log.clear();
      auto [dx, w] = blk.backward_input(std::move(saved), dy);
      if (log.size() != 6 + extra) report(detail::cat(list, ": backward issued:\n", log.to_string()));
      blk.backward_weight(std::move(w));
      if (!equal(y.to_local(), ref_y.to_local())) report(detail::cat(list, ": outputs differ"));
      if (!equal(dx.to_local(), ref_dx.to_local())) report(detail::cat(list, ": input gradients differ"));
      if (!std::ranges::equal(group->grads(), ref_group->grads())) report(detail::cat(list, ": weight gradients differ"));
    }
  };
  for (std::array<int, 2> shape : {std::array{1, 2}, std::array{2, 2}}) {
    auto f = on_ranks(shape[0] * shape[1], [&](CommPtr world, auto report) {
      NnMesh mesh(world, shape);
      run(std::type_identity<Gelu>{}, mesh, report);
      run(std::type_identity<Swi>{}, mesh, report);
    });
    INFO(to_string(shape) << ": " << summary(f));
    REQUIRE(f.empty());
  }
  // The flag's spellings, and bad ones named.
  CHECK(nn::Recompute::parse("selective") == nn::Recompute{.core_attn = true});
  CHECK(nn::Recompute::parse("layernorm,moe") == nn::Recompute{.norm = true, .mlp = true});
  for (const char* text : {"none", "full", "selective", "norm,act", "core_attn,norm,act,mlp"})
    CHECK(nn::Recompute::parse(nn::Recompute::parse(text).to_string()) == nn::Recompute::parse(text));
  CHECK_THROWS_WITH(nn::Recompute::parse("norm,attn"), Catch::Contains("unknown module \"attn\""));
  CHECK_THROWS_WITH(nn::Recompute::parse("norm,"), Catch::Contains("trailing comma"));
  CHECK_THROWS_WITH(nn::Recompute::parse(""), Catch::Contains("empty"));
}

TEST_CASE("mesh roles: DeviceMesh<\"data\", \"model\"> with given roles computes what (\"dp\", \"tp\") computes",
          "[nn][protocol][roles]") {
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    auto step = [&]<class Mesh>(const Mesh& mesh, const char* data, const char* tensor) {
      using Model = models::GPT<double, Mesh, parallel::MegatronPlan<true>>;
      Model model(mesh, gpt_config());
      nn::ParamList<double, 2> ps;
      model.collect(ps);
      optim::AdamW<double, 2> opt(ps, {.lr = 1e-2});
      parallel::DataParallel<Mesh> ddp(mesh, {.bucket_bytes = 2048});
      ddp.attach(model);
      auto [ids, tgt] = gpt_batch<typename Model::Ids>(mesh, 0);
      CommLog log;
      auto [loss, saved] = model.forward(ids, tgt);
      model.backward(std::move(saved));
      ddp.finish_gradient_sync();
      parallel::sequence_parallel_grads(ps, mesh);
      // The collectives go to the groups of the dimensions with those roles, whatever their names.
      const auto e = parallel::megatron_tp_collectives(true, 2);
      if (log.count(CollectiveKind::all_gather, tensor) != e.all_gather ||
          log.count(CollectiveKind::reduce_scatter, tensor) != e.reduce_scatter ||
          log.count(CollectiveKind::all_reduce, data) == 0)
        report(detail::cat("on (", data, ", ", tensor, "):\n", log.to_string()));
      std::pair<double, std::vector<double>> out{full_tensor(loss)[0], unit_grads(model)};
      opt.step();
      auto v = unit_values(model);
      out.second.insert(out.second.end(), v.begin(), v.end());
      return out;
    };
    const auto named = step(NnMesh(world, {2, 2}), "dp", "tp");
    const auto roles = step(RoleMesh(world, {2, 2}), "data", "model");
    if (named.first != roles.first) report(detail::cat("loss ", roles.first, " vs ", named.first));
    if (named.second != roles.second) report("gradients or updated parameters differ");
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("models::GPT: each unit's parameters lie contiguously in its flat group; a moved GPT trains the same",
          "[nn][protocol][flat]") {
  using Model = models::GPT<double, NnMesh, parallel::MegatronPlan<true>>;
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    NnMesh mesh(world, {2, 2});
    const auto cfg = gpt_config();
    Model model(mesh, cfg), ref(mesh, cfg);
    // Units: embed, h.0 .. h.{L-1}, head; each group holds its parameters one after the other,
    // each in a slot of its largest piece over the ranks (the vocabulary's rows split 15, 14 over
    // tp = 2 here: a rank with the shorter piece has zeros after it), so that every rank's group
    // has the same size and layout.
    std::vector<std::string> want{"embed"};
    for (Extent l = 0; l < cfg.layers; ++l) want.push_back("h." + std::to_string(l));
    want.push_back("head");
    if (model.units().size() != want.size()) report(detail::cat(model.units().size(), " units"));
    std::set<const double*> unit_values_at;
    for (std::size_t u = 0; u < model.units().size() && u < want.size(); ++u) {
      auto& [group, params] = model.units()[u];
      if (group->name() != want[u]) report("unit " + group->name() + ", expected " + want[u]);
      const auto& entries = group->entries();
      if (entries.empty() || entries.size() != params.size()) report(group->name() + ": entries and views differ");
      std::size_t next = 0;
      for (std::size_t i = 0; i < entries.size() && i < params.size(); ++i) {
        const auto& e = entries[i];
        if (e.offset != next) report(detail::cat(group->name(), ": ", e.name, " at ", e.offset, ", expected ", next));
        if (e.slot != 0 && e.slot < e.numel) report(detail::cat(group->name(), ": ", e.name, " slot ", e.slot, " < ", e.numel));
        next = e.offset + e.reserved();
        if (e.name.rfind(want[u] == "embed" ? "w" : want[u] == "head" ? "l" : want[u], 0) != 0)
          report(e.name + " in unit " + group->name());
        if (params[i].name != e.name || params[i].value.data() != group->values().data() + e.offset ||
            params[i].grad.data() != group->grads().data() + e.offset || params[i].value.size() != e.numel)
          report(group->name() + ": the view of " + e.name + " is not its entry's window");
        unit_values_at.insert(params[i].value.data());
      }
      if (next != group->size()) report(detail::cat(group->name(), ": entries cover ", next, " of ", group->size()));
    }
    nn::ParamList<double, 2> before_move;
    model.collect(before_move);
    if (before_move.size() != unit_values_at.size()) report("a parameter is in no unit, or in two");
    for (const auto& p : before_move)
      if (!unit_values_at.contains(p.value.data())) report(p.name + " is not a unit's view");

    // Move-construct, then move-assign: the moved-to model trains as the reference does.
    Model moved(std::move(model));
    Model assigned(mesh, {.vocab = 5, .seq = 2, .dim = 4, .heads = 2, .layers = 1, .seed = 9});
    assigned = std::move(moved);
    nn::ParamList<double, 2> ref_ps, ps;
    ref.collect(ref_ps);
    assigned.collect(ps);
    optim::AdamW<double, 2> ref_opt(ref_ps, {.lr = 1e-2}), opt(ps, {.lr = 1e-2});
    for (int s = 0; s < 2; ++s) {
      auto [ids, tgt] = gpt_batch<Model::Ids>(mesh, s);
      ref_opt.zero_grad();
      opt.zero_grad();
      auto [ref_loss, ref_saved] = ref.forward(ids, tgt);
      ref.backward(std::move(ref_saved));
      auto [loss, saved] = assigned.forward(ids, tgt);
      assigned.backward(std::move(saved));
      if (full_tensor(loss)[0] != full_tensor(ref_loss)[0]) report(detail::cat("step ", s, ": loss differs"));
      if (unit_grads(assigned) != unit_grads(ref)) report(detail::cat("step ", s, ": gradients differ"));
      // The views taken before the moves see the same gradients: the groups did not move.
      for (std::size_t i = 0; i < before_move.size() && i < ps.size(); ++i)
        if (before_move[i].grad.data() != ps[i].grad.data()) report(ps[i].name + ": the move re-homed a gradient");
      parallel::DataParallel<NnMesh>(mesh).all_reduce_gradients(ps);
      parallel::DataParallel<NnMesh>(mesh).all_reduce_gradients(ref_ps);
      parallel::sequence_parallel_grads(ps, mesh);
      parallel::sequence_parallel_grads(ref_ps, mesh);
      opt.step();
      ref_opt.step();
    }
    if (unit_values(assigned) != unit_values(ref)) report("parameters differ after two steps");
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

// ---------------------------------------------------------------- the same step on meta tensors

namespace {

/// What a rank did in one training step: every collective (kind, group, group size, bytes) in
/// order, and the ledger's peak bytes per tag in the step's memory space.
struct StepRecord {
  std::vector<std::string> collectives;
  std::map<std::string, std::int64_t> peaks;
  friend bool operator==(const StepRecord&, const StepRecord&) = default;
};

/// One step of GPT (TP + SP on "tp", DDP or ZeRO-3 on the data dimension, clipping, AdamW) on
/// `mesh`, whatever its memory space: the forward's ids are data on host and nothing on meta.
template <class Mesh, bool Sharded>
std::vector<std::string> one_gpt_step(const Mesh& mesh, std::map<std::string, std::int64_t>& peaks) {
  using Space = mesh_space_t<Mesh>;
  models::GPTConfig cfg{
      .vocab = 29, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .mlp_ratio = 4, .checkpoint = false, .seed = 3};
  MemoryLedger ledger;
  CommLog log;
  models::GPT<double, Mesh, parallel::MegatronPlan<true>> model(mesh, cfg);
  using Ids = typename decltype(model)::Ids;
  auto tokens = [&](std::uint64_t seed) {
    Tensor<std::int32_t, 2> host = randint<std::int32_t>(Shape<2>{5, cfg.seq}, seed, 0, cfg.vocab);
    return distribute_replicated<typename Ids::layout>(mesh, into_space<Space>(std::move(host)));
  };
  const auto step = [&](auto& params, auto&& finish_sync) {
    optim::AdamW<double, Mesh::ndim, Space> opt(params, {.lr = 1e-3});
    {
      MemoryTagScope activations(MemoryTag::activations);  // what the passes allocate, unless tagged inside
      auto [loss, saved] = model.forward(tokens(1), tokens(2));
      model.backward(std::move(saved));
    }
    finish_sync();
    parallel::sequence_parallel_grads(params, mesh);
    optim::clip_grad_norm(params, mesh, 1.0);
    opt.step();
  };
  if constexpr (Sharded) {
    auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3});
    step(fsdp.params(), [&] { fsdp.finish_gradient_sync(); });
  } else {
    nn::ParamList<double, Mesh::ndim, Space> ps;
    model.collect(ps);
    parallel::DataParallel<Mesh> ddp(mesh, {.bucket_bytes = 2048});
    ddp.attach(model);
    step(ps, [&] { ddp.finish_gradient_sync(); });
  }
  // Not MemoryTag::other: the token ids are drawn on the host, which is the step's space on the
  // threads run and not on the dry run.
  for (auto tag : {MemoryTag::parameters, MemoryTag::gradients, MemoryTag::optimizer_state, MemoryTag::activations,
                   MemoryTag::communication})
    peaks[std::string(name_of(tag))] = ledger.peak(Space::name, tag);
  std::vector<std::string> out;
  for (const auto& r : log.records())
    out.push_back(std::string(name_of(r.kind)) + " " + r.group + "/" + std::to_string(r.group_size) + " " +
                  std::to_string(r.bytes));
  return out;
}

/// The step on 4 thread ranks (host) and, rank by rank, on meta tensors over the sim backend.
template <class HostMesh, class DryMesh, bool Sharded>
void check_dry_step_equals_real(std::array<int, 2> shape) {
  std::vector<StepRecord> real(4);
  threads::run(4, [&](CommPtr world) {
    auto& r = real[std::size_t(world->rank())];
    r.collectives = one_gpt_step<HostMesh, Sharded>(HostMesh(world, shape), r.peaks);
  });
  for (int rank = 0; rank < 4; ++rank) {
    StepRecord dry;
    dry.collectives = one_gpt_step<DryMesh, Sharded>(DryMesh(sim::world(rank, 4), shape), dry.peaks);
    INFO("rank " << rank);
    CHECK(dry.collectives == real[std::size_t(rank)].collectives);
    const auto text = [](const std::map<std::string, std::int64_t>& m) {
      std::string t;
      for (const auto& [tag, bytes] : m) t += tag + "=" + std::to_string(bytes) + " ";
      return t;
    };
    CHECK(text(dry.peaks) == text(real[std::size_t(rank)].peaks));
    CHECK(dry.collectives.size() > 20);
    CHECK(dry.peaks["parameters"] > 0);
    CHECK(dry.peaks["activations"] > 0);
  }
}

}  // namespace

TEST_CASE("a GPT step on meta tensors over the sim backend issues and allocates what the threads run does",
          "[nn][meta][sim]") {
  SECTION("DDP x TP + SP") {
    check_dry_step_equals_real<DeviceMesh<"dp", "tp">, MetaMesh<"dp", "tp">, false>({2, 2});
  }
  SECTION("FSDP (ZeRO-3) x TP + SP, uneven shards") {
    check_dry_step_equals_real<DeviceMesh<"fsdp", "tp">, MetaMesh<"fsdp", "tp">, true>({2, 2});
  }
}

}  // namespace test_nn_protocol
