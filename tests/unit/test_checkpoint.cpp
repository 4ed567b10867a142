// Distributed checkpoints (checkpoint/): a GPT trained on dp 2 x tp 2 threads, saved and resumed
// on the same mesh continues bit for bit as the straight run; loaded onto one rank, tp 4 and
// FSDP (uneven flat shards, HSDP) every piece equals the saved full tensors, and training continues
// within rounding of the straight run; corrupted, truncated and missing pieces, a different
// configuration, an unwritable directory, a Partial tensor and a save that fails or is killed
// mid-write are clear errors that leave the previous checkpoint loadable. The overlap plan and
// the flat-range boxes are checked against brute force on random layouts and extents.
#include <catch2/catch.hpp>
#include <set>

#include <csignal>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "dtensor/models/gpt_config.hpp"
#include "dtensor/checkpoint/safetensors.hpp"
#include "dtensor/checkpoint/training_state.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "dtensor/nn/cross_mesh_params.hpp"
#include "dtensor/comm/sim.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_checkpoint {

using namespace dtensor;
using namespace dtensor::testing;
namespace fs = std::filesystem;

namespace {

using Mesh2 = DeviceMesh<"dp", "tp">;
using FsdpMesh = DeviceMesh<"dp", "fsdp", "tp">;
using TpModel = models::GPT<double, Mesh2, parallel::MegatronPlan<true>>;
using OneModel = models::GPT<double, Mesh2, nn::ReplicatedPlan>;
using Full = std::map<std::string, std::pair<std::vector<Extent>, std::vector<double>>>;  // name -> (shape, values)

constexpr Extent kBatch = 4, kPositions = 6;
constexpr int kSaveAt = 3, kMore = 2;  // train 3 steps, save, 2 more

// vocab 29 splits unevenly over tp 2 (15, 14) and tp 4 (8, 8, 8, 5).
models::GPTConfig config() {
  return {.vocab = 29, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .mlp_ratio = 2, .checkpoint = false, .seed = 5};
}
optim::AdamWOptions adam() { return {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}; }

/// A model with its parameter views and AdamW, as a trainer holds them.
template <class Model, class Mesh>
struct Run {
  static nn::ParamList<double, Mesh::ndim> views(Model& m) {
    nn::ParamList<double, Mesh::ndim> ps;
    m.collect(ps);
    return ps;
  }
  explicit Run(const Mesh& mesh, const models::GPTConfig& c = config())
      : model(mesh, c), ps(views(model)), opt(ps, adam()) {}
  Model model;
  nn::ParamList<double, Mesh::ndim> ps;
  optim::AdamW<double, Mesh::ndim> opt;
};
using TpRun = Run<TpModel, Mesh2>;
using OneRun = Run<OneModel, Mesh2>;

/// This process's directory for the tests' checkpoints, removed at exit.
const fs::path& scratch_root() {
  struct Root {
    fs::path path = fs::temp_directory_path() / ("dtensor-ckpt-" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Root root;
  return root.path;
}

/// A fresh directory for one test (removed first, so a failed earlier run leaves nothing).
fs::path scratch(const std::string& name) {
  const auto dir = scratch_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

template <class Model, class Mesh>
auto batch(const Mesh& mesh, int step) {
  using L = typename Model::Ids::layout;
  const auto v = config().vocab;
  return std::pair{distribute_replicated<L>(mesh, randint<std::int32_t>(Shape<2>{kBatch, kPositions}, 100 + std::uint64_t(step), 0, v)),
                   distribute_replicated<L>(mesh, randint<std::int32_t>(Shape<2>{kBatch, kPositions}, 200 + std::uint64_t(step), 0, v))};
}

/// Steps [from, to) of AdamW on the model (DDP + sequence-parallel gradient syncs); the losses.
template <class Model, class Mesh>
std::vector<double> train(Run<Model, Mesh>& r, const Mesh& mesh, int from, int to) {
  auto& [model, ps, opt] = r;
  std::vector<double> losses;
  for (int s = from; s < to; ++s) {
    opt.zero_grad();
    auto [ids, tgt] = batch<Model>(mesh, s);
    auto [loss, saved] = model.forward(ids, tgt);
    model.backward(std::move(saved));
    parallel::sequence_parallel_grads(ps, mesh);
    parallel::DataParallel<Mesh>(mesh).all_reduce_gradients(ps);
    opt.step();
    losses.push_back(full_tensor(loss)[0]);
  }
  return losses;
}

template <class Model>
std::vector<double> unit_values(Model& model) {
  std::vector<double> v;
  for (auto& u : model.units()) v.insert(v.end(), u.group->values().begin(), u.group->values().end());
  return v;
}
template <class Opt>
std::vector<double> moments(const Opt& opt) {
  std::vector<double> v;
  for (std::size_t k = 0; k < opt.params().size(); ++k) {
    v.insert(v.end(), opt.exp_avg(k).begin(), opt.exp_avg(k).end());
    v.insert(v.end(), opt.exp_avg_sq(k).begin(), opt.exp_avg_sq(k).end());
  }
  return v;
}

checkpoint::TrainingMeta meta_at(int step) {
  return {.step = step,
          .data_position = std::uint64_t(step) * kBatch,
          .rng_state = std::string("rng\0state\n", 10),
          .config = models::config_of(config())};
}

/// Trains kSaveAt steps on dp 2 x tp 2 and saves at `dir`; returns the losses of kSaveAt + kMore
/// straight steps (the oracle of every resume).
std::vector<double> save_reference(const fs::path& dir) {
  std::vector<double> straight;
  threads::run(4, [&](CommPtr world) {
    Mesh2 mesh(world, {2, 2});
    TpRun model_run(mesh);

    auto& [model, ps, opt] = model_run;
    auto losses = train(model_run, mesh, 0, kSaveAt);
    checkpoint::save_training_state(dir, mesh, model, opt, meta_at(kSaveAt));
    auto more = train(model_run, mesh, kSaveAt, kSaveAt + kMore);
    losses.insert(losses.end(), more.begin(), more.end());
    if (world->rank() == 0) straight = losses;
  });
  return straight;
}

/// Every tensor of the checkpoint, whole: loaded on one rank.
Full load_full(const fs::path& dir) {
  Full full;
  threads::run(1, [&](CommPtr world) {
    Mesh2 mesh(world, {1, 1});
    OneRun model_run(mesh);

    auto& [model, ps, opt] = model_run;
    checkpoint::load_training_state(dir, mesh, model, opt, models::config_of(config()));
    for (const auto& s : checkpoint::detail::with_moments(checkpoint::parameter_slots(model.units(), mesh), opt))
      full[s.name] = {s.shape, std::vector<double>(s.data, s.data + s.box.numel())};
  });
  return full;
}

/// "" or the first slot whose elements differ from its box of the full tensors.
template <class T>
std::string compare_slots(const checkpoint::Slots<T>& slots, const Full& full) {
  for (const auto& s : slots) {
    const auto it = full.find(s.name);
    if (it == full.end()) return "no full tensor " + s.name;
    const auto& [shape, values] = it->second;
    std::vector<double> want(std::size_t(s.box.numel()));
    checkpoint::copy_region(values.data(), checkpoint::Region{std::vector<Extent>(shape.size(), 0), shape}, want.data(), s.box,
                            s.box, sizeof(double));
    for (std::size_t i = 0; i < want.size(); ++i)
      if (s.data[i] != want[i]) return detail::cat(s.name, " box ", checkpoint::to_string(s.box), " element ", i, ": ", s.data[i], " vs ", want[i]);
  }
  return {};
}

std::string compare_losses(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  if (got.size() != want.size()) return detail::cat(got.size(), " losses, expected ", want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= rtol * std::abs(want[i])))
      return detail::cat("loss ", i, ": ", got[i], " vs ", want[i]);
  return {};
}

const fs::path& reference_dir() {
  static const fs::path dir = scratch("reference");
  return dir;
}
const std::vector<double>& straight_losses() {
  static const std::vector<double> losses = save_reference(reference_dir());
  return losses;
}

}  // namespace

TEST_CASE("checkpoint: train 3, save, resume, train 2 == 5 straight, bit for bit (dp 2 x tp 2)", "[checkpoint]") {
  const auto& straight = straight_losses();
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    Mesh2 mesh(world, {2, 2});
    auto other = config();
    other.seed = 99;  // other initial values, and another configuration
    TpRun model_run(mesh, other);
    auto& [model, ps, opt] = model_run;
    auto before = unit_values(model);
    // The seed differs, so the configuration does: refused, and nothing loaded.
    try {
      checkpoint::load_training_state(reference_dir(), mesh, model, opt, models::config_of(model.config()));
      report("a checkpoint of another configuration loaded");
    } catch (const Error& e) {
      if (std::string(e.what()).find("seed: 5 in the checkpoint, 99 here") == std::string::npos) report(e.what());
    }
    const auto meta = checkpoint::load_training_state(reference_dir(), mesh, model, opt, {{"model", "gpt"}, {"vocab", "29"}, {"seq", "8"}, {"dim", "16"}, {"heads", "4"}, {"layers", "2"}, {"mlp_ratio", "2"}, {"kv_heads", "0"}, {"ffn", "0"}, {"seed", "5"}});
    if (unit_values(model) == before) report("nothing loaded");
    if (meta.step != kSaveAt || meta.data_position != std::uint64_t(kSaveAt) * kBatch || meta.rng_state != meta_at(0).rng_state ||
        opt.steps() != kSaveAt)
      report(detail::cat("metadata: step ", meta.step, ", data position ", meta.data_position, ", optimizer steps ", opt.steps()));
    const auto losses = train(model_run, mesh, kSaveAt, kSaveAt + kMore);
    const std::vector<double> want(straight.begin() + kSaveAt, straight.end());
    if (losses != want) report("resumed losses differ: " + compare_losses(losses, want, 0));
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("checkpoint: the same mesh restores parameters and AdamW moments bit for bit", "[checkpoint]") {
  const auto dir = scratch("same-mesh");
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    Mesh2 mesh(world, {2, 2});
    TpRun saved_run(mesh), loaded_run(mesh);
    auto &saved = saved_run.model, &loaded = loaded_run.model;
    auto &opt = saved_run.opt, &opt2 = loaded_run.opt;
    train(saved_run, mesh, 0, 2);
    checkpoint::save_training_state(dir, mesh, saved, opt, meta_at(2), {.max_piece_bytes = 512});  // many slabs
    checkpoint::load_training_state(dir, mesh, loaded, opt2, models::config_of(config()));
    if (unit_values(loaded) != unit_values(saved)) report("parameters differ");
    if (moments(opt2) != moments(opt) || opt2.steps() != 2) report("optimizer state differs");
    // Each saved box is written once: pieces tile every tensor (checked by save), no more.
    const auto m = checkpoint::read_manifest(dir);
    for (const auto& t : m.tensors) {
      Extent held = 0, total = 1;
      for (const auto& p : t.pieces) held += p.box.numel();
      for (Extent e : t.shape) total *= e;
      if (held != total) report(detail::cat(t.name, ": pieces hold ", held, " of ", total));
    }
    if (m.mesh_names != std::vector<std::string>{"dp", "tp"} || m.mesh_shape != std::vector<int>{2, 2}) report("mesh metadata");
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("checkpoint: loaded on one rank, tp 4 and FSDP, every piece equals the saved full tensors", "[checkpoint]") {
  const auto& straight = straight_losses();
  const Full full = load_full(reference_dir());
  // The one-rank load is the whole saved parameters: the training run's full tensors.
  threads::run(4, [&](CommPtr world) {  // recompute them from a fresh dp 2 x tp 2 run of 3 steps
    Mesh2 mesh(world, {2, 2});
    TpRun model_run(mesh);

    auto& [model, ps, opt] = model_run;
    train(model_run, mesh, 0, kSaveAt);
    std::string bad;
    nn::for_each_parameter(model, [&](auto& p) {
      if (!p.defined()) return;
      const auto whole = full_tensor(p.value());
      const auto& got = full.at(p.name()).second;
      if (!std::equal(got.begin(), got.end(), whole.span().begin(), whole.span().end())) bad = p.name();
    });
    if (world->rank() == 0) {
      INFO("parameter " << bad << " loaded on one rank differs from full_tensor of the saving run");
      CHECK(bad.empty());
    }
  });
  SECTION("one rank, then 2 more steps within rounding of the straight run") {
    threads::run(1, [&](CommPtr world) {
      Mesh2 mesh(world, {1, 1});
      OneRun model_run(mesh);

      auto& [model, ps, opt] = model_run;
      checkpoint::load_training_state(reference_dir(), mesh, model, opt, models::config_of(config()));
      const auto losses = train(model_run, mesh, kSaveAt, kSaveAt + kMore);
      const auto msg = compare_losses(losses, {straight.begin() + kSaveAt, straight.end()}, 1e-10);
      INFO(msg);
      CHECK(msg.empty());
    });
  }
  SECTION("tp 4 (vocab 29 as 8, 8, 8, 5), then 2 more steps") {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      Mesh2 mesh(world, {1, 4});
      TpRun model_run(mesh);

      auto& [model, ps, opt] = model_run;
      checkpoint::LoadStats stats;
      auto slots = checkpoint::detail::with_moments(checkpoint::parameter_slots(model.units(), mesh), opt);
      checkpoint::load(reference_dir(), mesh, slots, {}, &stats);
      report(compare_slots(slots, full));
      // Only overlapping pieces are read: at most the needed bytes plus one slab per slot edge.
      if (stats.bytes_read < stats.bytes_needed || stats.bytes_read > 3 * stats.bytes_needed)
        report(detail::cat("read ", stats.bytes_read, " bytes for ", stats.bytes_needed));
      opt.set_steps(kSaveAt);
      const auto losses = train(model_run, mesh, kSaveAt, kSaveAt + kMore);
      report(compare_losses(losses, {straight.begin() + kSaveAt, straight.end()}, 1e-10));
    });
    INFO(summary(f));
    REQUIRE(f.empty());
  }
  SECTION("FSDP x TP 2 x 2 (ZeRO-3), then 2 more steps; FSDP over 3 ranks (uneven) and HSDP 2 x 2, saved again, whole on one rank") {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      FsdpMesh mesh(world, {1, 2, 2});
      models::GPT<double, FsdpMesh, parallel::MegatronPlan<true>> model(mesh, config());
      auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3});
      optim::AdamW<double, 3> opt(fsdp.params(), adam());
      checkpoint::load_training_state(reference_dir(), mesh, model, fsdp, opt, models::config_of(config()));
      report(compare_slots(checkpoint::detail::with_moments(checkpoint::fsdp_parameter_slots(model.units(), fsdp, mesh), opt), full));
      std::vector<double> losses;
      for (int s = kSaveAt; s < kSaveAt + kMore; ++s) {
        opt.zero_grad();
        auto [ids, tgt] = batch<decltype(model)>(mesh, s);
        auto [loss, saved] = model.forward(ids, tgt);
        model.backward(std::move(saved));
        fsdp.finish_gradient_sync();
        parallel::sequence_parallel_grads(fsdp.params(), mesh);
        opt.step();
        fsdp.sync_parameters();
        losses.push_back(full_tensor(loss)[0]);
      }
      report(compare_losses(losses, {straight.begin() + kSaveAt, straight.end()}, 1e-10));
    });
    INFO(summary(f));
    REQUIRE(f.empty());
    const auto dir = scratch("fsdp3");
    f = on_ranks(3, [&](CommPtr world, auto report) {
      FsdpMesh mesh(world, {1, 3, 1});
      models::GPT<double, FsdpMesh, nn::ReplicatedPlan> model(mesh, config());
      auto fsdp = parallel::fully_shard(model, mesh, {.stage = 2});
      optim::AdamW<double, 3> opt(fsdp.params(), adam());
      checkpoint::load_training_state(reference_dir(), mesh, model, fsdp, opt, models::config_of(config()));
      // ZeRO-2 keeps full values: sync_parameters (in load) made them the loaded ones.
      report(compare_slots(checkpoint::parameter_slots(model.units(), mesh), full));
      checkpoint::save_training_state(dir, mesh, model, fsdp, opt, meta_at(kSaveAt), {.max_piece_bytes = 256});
    });
    INFO(summary(f));
    REQUIRE(f.empty());
    const Full again = load_full(dir);
    CHECK(again == full);
    // HSDP 2 x 2: the replicas on "dp" are written once (save throws if a box is written twice).
    const auto hsdp_dir = scratch("hsdp");
    f = on_ranks(4, [&](CommPtr world, auto report) {
      FsdpMesh mesh(world, {2, 2, 1});
      models::GPT<double, FsdpMesh, nn::ReplicatedPlan> model(mesh, config());
      auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3});
      optim::AdamW<double, 3> opt(fsdp.params(), adam());
      checkpoint::load_training_state(reference_dir(), mesh, model, fsdp, opt, models::config_of(config()));
      checkpoint::save_training_state(hsdp_dir, mesh, model, fsdp, opt, meta_at(kSaveAt));
      if (mesh.coordinate(0) == 1 && fs::file_size(hsdp_dir / ("rank-0000" + std::to_string(world->rank()) + ".bin")) != 0)
        report("a replica on dp 1 wrote pieces");
    });
    INFO(summary(f));
    REQUIRE(f.empty());
    CHECK(load_full(hsdp_dir) == full);
  }
}

TEST_CASE("checkpoint: FSDP over fsdp x cp saves each shard once and loads at fsdp 4 x cp 1 and on one rank", "[checkpoint]") {
  // Issue 40 item 2: under context parallelism FSDP shards each unit over the flattened
  // ("fsdp", "cp") group (flat index f * cp + c, one torch.chunk split over fsdp x cp ranks), so
  // every context rank writes its own boxes (Shard on "cp", not Replicate). Loaded at fsdp 2 x
  // cp 2 and at fsdp 3 x cp 2 (uneven over 6) from the dp 2 x tp 2 reference, saved there, and
  // the saved files loaded at fsdp 4 x cp 1, fsdp 1 (HSDP dp 2) and whole on one rank.
  using CpMesh = DeviceMesh<"dp", "fsdp", "cp">;
  using CpModel = models::GPT<double, CpMesh, nn::ReplicatedPlan>;
  straight_losses();  // the reference checkpoint
  const Full full = load_full(reference_dir());
  for (const std::array<int, 3> saving : {std::array{1, 2, 2}, std::array{1, 3, 2}}) {
    INFO("saved at fsdp " << saving[1] << " x cp " << saving[2]);
    const auto dir = scratch("fsdp-cp-" + std::to_string(saving[1]));
    auto f = on_ranks(saving[1] * saving[2], [&](CommPtr world, auto report) {
      CpMesh mesh(world, saving);
      CpModel model(mesh, config());
      auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3});
      optim::AdamW<double, 3> opt(fsdp.params(), adam());
      checkpoint::load_training_state(reference_dir(), mesh, model, fsdp, opt, models::config_of(config()));
      const auto slots = checkpoint::detail::with_moments(checkpoint::fsdp_parameter_slots(model.units(), fsdp, mesh), opt);
      report(compare_slots(slots, full));
      for (const auto& s : slots)
        if (!s.writer) report("slot " + s.name + " not written by its rank: FSDP shards over \"cp\" are no replicas");
      checkpoint::save_training_state(dir, mesh, model, fsdp, opt, meta_at(kSaveAt), {.max_piece_bytes = 256});
    });
    INFO(summary(f));
    REQUIRE(f.empty());
    CHECK(load_full(dir) == full);  // every element saved (and, else save throws, once)
    for (const std::array<int, 3> loading : {std::array{1, 4, 1}, std::array{2, 1, 1}}) {
      f = on_ranks(loading[0] * loading[1] * loading[2], [&](CommPtr world, auto report) {
        CpMesh mesh(world, loading);
        CpModel model(mesh, config());
        auto fsdp = parallel::fully_shard(model, mesh, {.stage = 1});
        optim::AdamW<double, 3> opt(fsdp.params(), adam());
        checkpoint::load_training_state(dir, mesh, model, fsdp, opt, models::config_of(config()));
        report(compare_slots(checkpoint::detail::with_moments(checkpoint::fsdp_parameter_slots(model.units(), fsdp, mesh), opt), full));
        report(compare_slots(checkpoint::parameter_slots(model.units(), mesh), full));  // ZeRO-1's full values, gathered
      });
      INFO("loaded at dp " << loading[0] << " fsdp " << loading[1] << " cp " << loading[2] << ": " << summary(f));
      CHECK(f.empty());
    }
  }
}

namespace {

/// Flips one byte (or cuts the file) and returns what loading on dp 2 x tp 2 says, "" if it loads.
std::string load_error(const fs::path& dir) {
  std::vector<std::string> errors(4);
  threads::run(4, [&](CommPtr world) {
    Mesh2 mesh(world, {2, 2});
    TpRun model_run(mesh);

    auto& [model, ps, opt] = model_run;
    try {
      checkpoint::load_training_state(dir, mesh, model, opt, models::config_of(config()));
    } catch (const Error& e) {
      errors[std::size_t(world->rank())] = e.what();
    }
  });
  for (const auto& e : errors)
    if (e.empty() != errors[0].empty()) return "only some ranks failed: " + errors[0];  // all ranks learn of it
  return errors[0];
}

void copy_checkpoint(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

}  // namespace

TEST_CASE("checkpoint: corrupted, truncated and missing pieces are errors naming the tensor and file", "[checkpoint][errors]") {
  straight_losses();
  const auto dir = scratch("damaged");
  SECTION("a flipped byte") {
    copy_checkpoint(reference_dir(), dir);
    std::fstream f(dir / "rank-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c = char(c ^ 0x10);
    f.write(&c, 1);
    f.close();
    const auto e = load_error(dir);
    INFO(e);
    CHECK(e.find("corrupted (checksum mismatch)") != std::string::npos);
    CHECK(e.find("rank-00001.bin") != std::string::npos);
    CHECK(e.find("tensor ") != std::string::npos);
  }
  SECTION("a truncated file") {
    copy_checkpoint(reference_dir(), dir);
    fs::resize_file(dir / "rank-00000.bin", fs::file_size(dir / "rank-00000.bin") - 24);
    const auto e = load_error(dir);
    INFO(e);
    CHECK(e.find("is truncated") != std::string::npos);
    CHECK(e.find("rank-00000.bin") != std::string::npos);
  }
  SECTION("a missing file") {
    copy_checkpoint(reference_dir(), dir);
    fs::remove(dir / "rank-00001.bin");  // rank 2 (dp 1) wrote nothing: rank 0 (dp 0) wrote the replicated pieces
    const auto e = load_error(dir);
    INFO(e);
    CHECK(e.find("rank-00001.bin of piece") != std::string::npos);
    CHECK(e.find("is missing") != std::string::npos);
  }
  SECTION("a piece missing from the manifest (resealed)") {
    copy_checkpoint(reference_dir(), dir);
    auto m = checkpoint::read_manifest(dir);
    std::string name;
    for (auto& t : m.tensors)
      if (t.name == "h.0.attn.qkv.weight") t.pieces.pop_back(), name = t.name;
    std::ofstream(dir / "MANIFEST", std::ios::trunc) << checkpoint::serialize(m);
    const auto e = load_error(dir);
    INFO(e);
    CHECK(!name.empty());
    CHECK(e.find("tensor h.0.attn.qkv.weight: the checkpoint's pieces cover") != std::string::npos);
  }
  SECTION("a damaged manifest, and none") {
    copy_checkpoint(reference_dir(), dir);
    fs::resize_file(dir / "MANIFEST", fs::file_size(dir / "MANIFEST") - 30);
    CHECK(load_error(dir).find("MANIFEST") != std::string::npos);
    fs::remove_all(dir);
    CHECK(load_error(dir).find("no checkpoint at") != std::string::npos);
  }
}

TEST_CASE("checkpoint: a failed or killed save leaves the previous checkpoint loadable", "[checkpoint][errors]") {
  straight_losses();
  const auto dir = scratch("crash");
  copy_checkpoint(reference_dir(), dir);
  const Full before = load_full(dir);
  // Saves a model trained 1 step (different values) at dir, with a failure injected.
  auto save_failing = [&](const std::string& stage, int failing_rank) {
    std::vector<std::string> errors(4);
    threads::run(4, [&](CommPtr world) {
      Mesh2 mesh(world, {2, 2});
      TpRun model_run(mesh);

      auto& [model, ps, opt] = model_run;
      train(model_run, mesh, 0, 1);
      checkpoint::SaveOptions o;
      o.before_stage = [&](std::string_view s) {
        if (s == stage && world->rank() == failing_rank) throw Error("test", "simulated crash before " + stage);
      };
      try {
        checkpoint::save_training_state(dir, mesh, model, opt, meta_at(1), o);
      } catch (const Error& e) {
        errors[std::size_t(world->rank())] = e.what();
      }
    });
    return errors;
  };
  for (const auto& [stage, rank] : std::vector<std::pair<std::string, int>>{{"data", 2}, {"manifest", 1}, {"commit", 0}}) {
    const auto errors = save_failing(stage, rank);
    for (const auto& e : errors) {
      INFO(stage << " on rank " << rank << ": " << e);
      CHECK(e.find("simulated crash before " + stage) != std::string::npos);  // every rank learns of it
    }
    INFO("after a failure before " << stage);
    CHECK(load_full(dir) == before);
  }
  SECTION("an unwritable directory") {
    const auto file = scratch("a-file");
    std::ofstream(file) << "not a directory";
    std::vector<std::string> errors(2);
    threads::run(2, [&](CommPtr world) {
      Mesh2 mesh(world, {2, 1});
      OneRun model_run(mesh);

      auto& [model, ps, opt] = model_run;
      try {
        checkpoint::save_training_state(file / "ckpt", mesh, model, opt, meta_at(0));
      } catch (const Error& e) {
        errors[std::size_t(world->rank())] = e.what();
      }
    });
    for (const auto& e : errors) {
      INFO(e);
      CHECK(e.find("cannot create " + (file / "ckpt.partial").string()) != std::string::npos);
    }
  }
  SECTION("a directory that names a regular file or a directory of other files: refused, left as it was") {
    // Regression: the commit's rename replaced a regular file given as the directory (data loss).
    const auto file = scratch("user-file");
    std::ofstream(file) << "the user's data";
    const auto other = scratch("user-dir");
    fs::create_directories(other);
    std::ofstream(other / "notes.txt") << "more of the user's data";
    for (const auto& [target, words] : std::vector<std::pair<fs::path, std::string>>{
             {file, "exists and is not a directory (a regular file)"}, {other, "holds files but no checkpoint"}}) {
      std::vector<std::string> errors(2);
      threads::run(2, [&](CommPtr world) {
        Mesh2 mesh(world, {2, 1});
        OneRun model_run(mesh);
        auto& [model, ps, opt] = model_run;
        try {
          checkpoint::save_training_state(target, mesh, model, opt, meta_at(0));
        } catch (const Error& e) {
          errors[std::size_t(world->rank())] = e.what();
        }
      });
      for (const auto& e : errors) {
        INFO(e);
        CHECK(e.find("checkpoint::save") != std::string::npos);
        CHECK(e.find(target.string()) != std::string::npos);
        CHECK(e.find(words) != std::string::npos);  // every rank learns of it
      }
      CHECK_FALSE(fs::exists(checkpoint::detail::staging_path(target)));
    }
    std::ifstream in(file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text == "the user's data");
    CHECK(fs::exists(other / "notes.txt"));
  }
  SECTION("the writer process killed mid-write (SIGKILL), then a save that succeeds") {
    const auto marker = scratch("marker");
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // the writer: pieces written, killed before its manifest
      threads::run(2, [&](CommPtr world) {
        Mesh2 mesh(world, {1, 2});
        TpRun model_run(mesh);

        auto& [model, ps, opt] = model_run;
        checkpoint::SaveOptions o;
        o.before_stage = [&](std::string_view s) {
          if (s != "manifest") return;
          if (world->rank() == 0) std::ofstream(marker) << "ready";
          for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        };
        checkpoint::save_training_state(dir, mesh, model, opt, meta_at(7), o);
      });
      ::_exit(0);
    }
    for (int i = 0; i < 6000 && !fs::exists(marker); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const bool reached = fs::exists(marker);
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(reached);
    CHECK(WIFSIGNALED(status));
    CHECK(fs::exists(fs::path(dir.string() + ".partial") / "rank-00000.bin"));  // what the writer left
    CHECK(load_full(dir) == before);
    // The next save removes the stale staging directory and commits.
    straight_losses();
    threads::run(4, [&](CommPtr world) {
      Mesh2 mesh(world, {2, 2});
      TpRun model_run(mesh);

      auto& [model, ps, opt] = model_run;
      checkpoint::save_training_state(dir, mesh, model, opt, meta_at(0));
    });
    CHECK(!fs::exists(fs::path(dir.string() + ".partial")));
    CHECK(checkpoint::read_manifest(dir).meta.step == 0);
    CHECK(load_full(dir) != before);
  }
}

TEST_CASE("checkpoint: a Partial tensor, a tensor of other extents or type, an unknown tensor are errors", "[checkpoint][errors]") {
  straight_losses();
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    Mesh2 mesh(world, {2, 1});
    std::vector<double> data(29 * 16, 1.0);
    std::vector<float> narrow(29 * 16);
    auto expect = [&](const std::string& what, auto&& fn) {
      try {
        fn();
        report("accepted: " + what);
      } catch (const Error& e) {
        if (std::string(e.what()).find(what) == std::string::npos) report(e.what());
      }
    };
    checkpoint::Slots<double> slots;
    expect("tensor grad.w has layout (P(sum), R) on (dp, tp): a Partial value cannot be saved", [&] {
      checkpoint::add_slot(slots, mesh, "grad.w", {2, 3}, checkpoint::Region{{0, 0}, {2, 3}}, data.data(),
                           Layout<Partial<>, Replicate>::desc);
    });
    // The layout could place rows 0..14 of wte.weight on this rank, but the model is another.
    const auto rows = chunk_range(29, 2, mesh.coordinate(0));
    checkpoint::Slots<double> wider;
    checkpoint::add_slot(wider, mesh, "wte.weight", {29, 32}, checkpoint::Region{{rows.begin, 0}, {rows.size(), 16}},
                         data.data(), Layout<Shard<0>, Replicate>::desc);
    expect("tensor wte.weight is float64 [29, 16] in the checkpoint, float64 [29, 32] here",
           [&] { checkpoint::load(reference_dir(), mesh, wider); });
    checkpoint::Slots<float> floats;
    checkpoint::add_slot(floats, mesh, "wte.weight", {29, 16}, checkpoint::Region{{rows.begin, 0}, {rows.size(), 16}},
                         narrow.data(), Layout<Shard<0>, Replicate>::desc);
    expect("float64 [29, 16] in the checkpoint, float32 [29, 16] here", [&] { checkpoint::load(reference_dir(), mesh, floats); });
    checkpoint::Slots<double> unknown;
    checkpoint::add_slot(unknown, mesh, "wte.bias", {29}, checkpoint::Region{{rows.begin}, {rows.size()}}, data.data(),
                         Layout<Shard<0>, Replicate>::desc);
    expect("tensor wte.bias is not in the checkpoint", [&] { checkpoint::load(reference_dir(), mesh, unknown); });
  });
  INFO(summary(f));
  REQUIRE(f.empty());
}

TEST_CASE("checkpoint regions: flat ranges as boxes, and the overlap plan, against brute force", "[checkpoint][plan]") {
  std::mt19937_64 rng(11);
  auto pick = [&](Extent lo, Extent hi) { return std::uniform_int_distribution<Extent>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t rank = std::size_t(pick(1, 3));
    std::vector<Extent> extent(rank);
    for (auto& e : extent) e = pick(1, 7);
    Extent n = 1;
    for (Extent e : extent) n *= e;
    const Extent b = pick(0, n), e = pick(b, n);
    // Boxes in increasing order, each contiguous, covering [b, e) exactly.
    Extent next = b;
    std::size_t count = 0;
    for (const auto& part : checkpoint::flat_range_boxes(extent, b, e)) {
      const auto st = [&] {
        std::vector<Extent> s(rank, 1);
        for (std::size_t d = rank - 1; d-- > 0;) s[d] = s[d + 1] * extent[d + 1];
        return s;
      }();
      Extent first = 0;
      for (std::size_t d = 0; d < rank; ++d) first += part.box.offset[d] * st[d];
      REQUIRE(first == next);
      REQUIRE(part.at == first - b);
      next += part.box.numel();
      ++count;
    }
    REQUIRE(next == e);
    REQUIRE(count <= 2 * rank - 1);
  }
  // The pieces of random layouts on random 2-D meshes, queried with another layout's boxes.
  for (int trial = 0; trial < 200; ++trial) {
    const std::array<int, 2> old_mesh{int(pick(1, 4)), int(pick(1, 4))}, new_mesh{int(pick(1, 4)), int(pick(1, 4))};
    const Shape<2> global{pick(1, 13), pick(1, 13)};
    auto layout = [&] {
      LayoutDesc<2> l;
      for (auto& p : l.placements) p = pick(0, 2) == 0 ? PlacementDesc::replicate() : PlacementDesc::shard(int(pick(0, 1)));
      l.priority = pick(0, 1) ? std::array<int, 2>{0, 1} : std::array<int, 2>{1, 0};
      return l;
    };
    const auto from = layout(), to = layout();
    auto boxes = [&](const LayoutDesc<2>& l, std::array<int, 2> mesh) {
      std::vector<checkpoint::Region> out;
      for (int i = 0; i < mesh[0]; ++i)
        for (int j = 0; j < mesh[1]; ++j) {
          if ((l.placements[0].is_replicate() && i) || (l.placements[1].is_replicate() && j)) continue;  // written once
          const auto bx = local_box(l, mesh, {i, j}, global);
          out.push_back({{bx.offset[0], bx.offset[1]}, {bx.extent[0], bx.extent[1]}});
        }
      return out;
    };
    const auto saved = boxes(from, old_mesh);
    const checkpoint::OverlapIndex index(saved);
    for (const auto& q : boxes(to, new_mesh)) {
      std::vector<std::size_t> got, want;
      index.for_each_overlap(q, [&](std::size_t i, const checkpoint::Region& c) {
        REQUIRE(c == checkpoint::intersect(saved[i], q));
        got.push_back(i);
      });
      for (std::size_t i = 0; i < saved.size(); ++i)
        if (!checkpoint::intersect(saved[i], q).empty()) want.push_back(i);
      std::sort(got.begin(), got.end());
      INFO("from " << to_string(from) << " on " << to_string(old_mesh) << " to " << to_string(to) << " on " << to_string(new_mesh));
      REQUIRE(got == want);
    }
  }
}

// ---- safetensors (checkpoint/safetensors_format.hpp, checkpoint/safetensors.hpp) ----------------

namespace {

void write_bytes(const fs::path& file, const std::string& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}
/// A safetensors file byte for byte as the Python package lays it out: the length, the header
/// padded with spaces to a multiple of 8, the data.
std::string st_file(std::string header, const std::string& data) {
  while (header.size() % 8) header += ' ';
  const std::uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}
template <class T>
std::string raw(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

}  // namespace

TEST_CASE("safetensors: a file laid out as Python's package writes it reads back by boxes", "[checkpoint][safetensors]") {
  namespace st = checkpoint::safetensors;
  const fs::path file = scratch("st-format") / "python.safetensors";
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},"c":{"dtype":"F64","shape":[],"data_offsets":[28,36]}})";
  write_bytes(file, st_file(header, raw<float>({0, 0.5f, 1, 1.5f, 2, 2.5f}) + raw<std::uint16_t>({0x3F80, 0xC000}) + raw<double>({3.25})));
  const st::FileInfo info = st::read_header(file);
  CHECK(info.metadata.at("format") == "pt");
  REQUIRE(info.tensors.size() == 3);
  CHECK(info.tensors.at("a").shape == std::vector<Extent>{2, 3});
  CHECK(info.tensors.at("b").dtype == "BF16");
  std::vector<double> part(2);
  st::read_box(info, "a", checkpoint::Region{{1, 1}, {1, 2}}, part.data());  // a[1, 1:3]
  CHECK(part == std::vector<double>{2, 2.5});
  std::vector<double> column(2);
  st::read_box(info, "a", checkpoint::Region{{0, 2}, {2, 1}}, column.data());  // a[:, 2]: two runs
  CHECK(column == std::vector<double>{1, 2.5});
  std::vector<float> b(2);
  st::read_box(info, "b", checkpoint::Region{{0}, {2}}, b.data());
  CHECK(b == std::vector<float>{1, -2});
  double c = 0;
  st::read_box(info, "c", checkpoint::Region{{}, {}}, &c);
  CHECK(c == 3.25);
  // What this writer writes reads back the same, header padded to 8 bytes, offsets packed.
  const fs::path mine = file.parent_path() / "mine.safetensors";
  const std::vector<double> values{1, 2, 3, 4, 5, 6};
  st::write<double>(mine, {{"x", {3, 2}, values.data()}, {"y", {1}, values.data() + 5}});
  const st::FileInfo back = st::read_header(mine);
  CHECK((back.data_start - 8) % 8 == 0);
  CHECK(back.file_size == back.data_start + 7 * 8);
  std::vector<double> x(6);
  st::read_box(back, "x", checkpoint::Region{{0, 0}, {3, 2}}, x.data());
  CHECK(x == values);
}

TEST_CASE("safetensors: bad files are errors naming the file and tensor", "[checkpoint][safetensors][errors]") {
  namespace st = checkpoint::safetensors;
  using Catch::Contains;
  const fs::path dir = scratch("st-bad");
  auto bad = [&](const std::string& name, const std::string& bytes) {
    write_bytes(dir / name, bytes);
    return dir / name;
  };
  CHECK_THROWS_WITH(st::read_header(bad("short", "abcd")), Contains("short") && Contains("shorter than the 8-byte header length"));
  CHECK_THROWS_WITH(st::read_header(bad("long", raw<std::uint64_t>({1000000}) + "{}")), Contains("header length 1000000 does not fit"));
  CHECK_THROWS_WITH(st::read_header(bad("json", st_file(R"({"a":{"dtype":"F32",)", ""))), Contains("invalid JSON"));
  CHECK_THROWS_WITH(st::read_header(bad("size", st_file(R"({"a":{"dtype":"F32","shape":[2,4],"data_offsets":[0,24]}})", std::string(24, '\0')))),
                    Contains("tensor 'a'") && Contains("F32 of shape [2, 4] is 32 bytes, data_offsets give 24"));
  CHECK_THROWS_WITH(st::read_header(bad("beyond", st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0')))),
                    Contains("are not inside the 8 data bytes"));
  CHECK_THROWS_WITH(st::read_header(bad("overlap", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, '\0')))),
                    Contains("'a' and 'b' overlap"));
  CHECK_THROWS_WITH(st::read_header(bad("fields", st_file(R"({"a":{"dtype":"F32","shape":[2]}})", ""))), Contains("needs \"dtype\""));
  const auto ints = st::read_header(bad("ints", st_file(R"({"i":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})", "ab")));
  std::vector<double> out(2);
  CHECK_THROWS_WITH(st::read_box(ints, "i", checkpoint::Region{{0}, {2}}, out.data()), Contains("is I8; readable dtypes are F64, F32 and BF16"));
  CHECK_THROWS_WITH(st::read_box(ints, "j", checkpoint::Region{{0}, {2}}, out.data()), Contains("has no tensor 'j'"));
  CHECK_THROWS_WITH(st::read_header(dir / "absent"), Contains("cannot read") && Contains("absent"));
}

TEST_CASE("safetensors: a GPT exported from dp 2 x tp 2 holds the full tensors; imported on one rank, tp 4 and "
          "from a sharded index it equals them", "[checkpoint][safetensors]") {
  const fs::path dir = scratch("st-gpt");
  fs::create_directories(dir);
  const fs::path file = dir / "model.safetensors";
  Full want;
  threads::run(4, [&](CommPtr world) {
    Mesh2 mesh(world, {2, 2});
    TpRun model_run(mesh);
    train(model_run, mesh, 0, 2);
    checkpoint::export_safetensors(file, mesh, checkpoint::parameter_slots(model_run.model.units(), mesh));
    Full full;
    nn::for_each_parameter(model_run.model, [&](auto& p) {
      if (!p.defined()) return;
      const auto whole = full_tensor(p.value());
      full[p.name()] = {std::vector<Extent>(whole.shape().begin(), whole.shape().end()),
                        std::vector<double>(whole.span().begin(), whole.span().end())};
    });
    if (world->rank() == 0) want = full;
  });
  // The file on its own: every parameter whole, F64, equal to full_tensor of the training run.
  const auto info = checkpoint::safetensors::read_header(file);
  REQUIRE(info.tensors.size() == want.size());
  for (const auto& [name, tensor] : want) {
    const auto& [shape, values] = tensor;
    CAPTURE(name);
    REQUIRE(info.tensors.count(name) == 1);
    CHECK(info.tensors.at(name).dtype == "F64");
    CHECK(info.tensors.at(name).shape == shape);
    std::vector<double> got(values.size());
    checkpoint::safetensors::read_box(info, name, checkpoint::Region{std::vector<Extent>(shape.size(), 0), shape}, got.data());
    CHECK(got == values);
  }
  SECTION("one rank") {
    threads::run(1, [&](CommPtr world) {
      Mesh2 mesh(world, {1, 1});
      OneRun model_run(mesh);
      auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
      checkpoint::import_safetensors(file, mesh, slots);
      const auto msg = compare_slots(slots, want);
      INFO(msg);
      CHECK(msg.empty());
    });
  }
  SECTION("tp 4: each rank reads its own boxes (vocab 29 as 8, 8, 8, 5)") {
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      Mesh2 mesh(world, {1, 4});
      TpRun model_run(mesh);
      auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
      checkpoint::import_safetensors(file, mesh, slots);
      report(compare_slots(slots, want));
    });
    INFO(summary(f));
    CHECK(f.empty());
  }
  SECTION("sharded in two files with an index, as Hugging Face lays out large models") {
    std::vector<checkpoint::safetensors::Named<double>> first, second;
    std::string weight_map;
    int i = 0;
    for (const auto& [name, tensor] : want) {
      (i % 2 ? second : first).push_back({name, tensor.first, tensor.second.data()});
      weight_map += detail::cat(i ? "," : "", "\"", name, "\":\"model-0000", i % 2 + 1, "-of-00002.safetensors\"");
      ++i;
    }
    checkpoint::safetensors::write(dir / "model-00001-of-00002.safetensors", first);
    checkpoint::safetensors::write(dir / "model-00002-of-00002.safetensors", second);
    write_bytes(dir / "model.safetensors.index.json", "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" + weight_map + "}}");
    auto f = on_ranks(2, [&](CommPtr world, auto report) {
      Mesh2 mesh(world, {1, 2});
      TpRun model_run(mesh);
      auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
      checkpoint::import_safetensors(dir / "model.safetensors.index.json", mesh, slots);
      report(compare_slots(slots, want));
    });
    INFO(summary(f));
    CHECK(f.empty());
  }
  SECTION("written sharded from dp 2 x tp 2 (3 files and an index, each rank its own boxes), read on tp 4 and one rank") {
    const fs::path sharded = dir / "sharded";
    fs::path index;
    threads::run(4, [&](CommPtr world) {
      Mesh2 mesh(world, {2, 2});
      TpRun model_run(mesh);
      train(model_run, mesh, 0, 2);
      const auto at = checkpoint::export_safetensors_sharded(sharded, mesh, checkpoint::parameter_slots(model_run.model.units(), mesh), 3);
      if (world->rank() == 0) index = at;
    });
    CHECK(index == sharded / "model.safetensors.index.json");
    const auto map = checkpoint::safetensors::read_index(index);
    std::set<std::string> names;
    for (const auto& [name, file] : map) names.insert(file.filename().string());
    CHECK(names == std::set<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                         "model-00003-of-00003.safetensors"});
    CHECK(map.size() == want.size());
    for (const auto& [name, tensor] : want) {  // every tensor whole in the file the index names
      CAPTURE(name);
      const auto info = checkpoint::safetensors::read_header(map.at(name));
      CHECK(info.metadata.count("dtensor.sum64:" + name) == 1);
      CHECK_NOTHROW(checkpoint::safetensors::verify_checksum(info, name));
      std::vector<double> got(tensor.second.size());
      checkpoint::safetensors::read_box(info, name, checkpoint::Region{std::vector<Extent>(tensor.first.size(), 0), tensor.first},
                                        got.data());
      CHECK(got == tensor.second);
    }
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      Mesh2 mesh(world, {1, 4});
      TpRun model_run(mesh);
      auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
      checkpoint::import_safetensors(index, mesh, slots);
      report(compare_slots(slots, want));
    });
    INFO(summary(f));
    CHECK(f.empty());
    threads::run(1, [&](CommPtr world) {
      Mesh2 mesh(world, {1, 1});
      OneRun model_run(mesh);
      auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
      checkpoint::import_safetensors(index, mesh, slots);
      const auto msg = compare_slots(slots, want);
      INFO(msg);
      CHECK(msg.empty());
    });
  }
  SECTION("a missing tensor or another shape is an error on every rank") {
    const fs::path small = dir / "small.safetensors";
    const std::vector<double> zeros(29 * 16, 0.0);
    checkpoint::safetensors::write<double>(small, {{want.begin()->first, {3}, zeros.data()}});
    auto f = on_ranks(2, [&](CommPtr world, auto report) {
      Mesh2 mesh(world, {1, 2});
      TpRun model_run(mesh);
      auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
      try {
        checkpoint::import_safetensors(small, mesh, slots);
        report("no error");
      } catch (const Error& e) {
        const std::string what = e.what();
        if (what.find("is [3], the model's is") == std::string::npos) report(what);
      }
      try {
        checkpoint::import_safetensors(small, mesh, slots, {.rename = [](const std::string& n) { return "x." + n; }});
        report("no error for missing tensors");
      } catch (const Error& e) {
        const std::string what = e.what();
        if (what.find("lacks") == std::string::npos || what.find("'x.") == std::string::npos) report(what);
      }
    });
    INFO(summary(f));
    CHECK(f.empty());
  }
  SECTION("every tensor's checksum is in the header; a file zeroed, flipped or cut after writing is refused on every "
          "rank, naming the file and the tensor") {
    const auto written = checkpoint::safetensors::read_header(file);
    for (const auto& [name, tensor] : want) {
      CAPTURE(name);
      CHECK(written.metadata.count("dtensor.sum64:" + name) == 1);
      CHECK_NOTHROW(checkpoint::safetensors::verify_checksum(written, name));
    }
    CHECK_FALSE(fs::exists(dir / "model.safetensors.partial"));
    const std::string victim = want.rbegin()->first;  // zeroed in the middle of its data
    const auto& e = written.tensors.at(victim);
    auto damaged = [&](const std::string& tag, auto&& damage) {
      const fs::path copy = dir / (tag + ".safetensors");
      fs::copy_file(file, copy, fs::copy_options::overwrite_existing);
      damage(copy);
      std::string first;
      auto f = on_ranks(2, [&](CommPtr world, auto report) {
        Mesh2 mesh(world, {1, 2});
        TpRun model_run(mesh);
        auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
        try {
          checkpoint::import_safetensors(copy, mesh, slots);
          report("no error");
        } catch (const Error& err) {
          if (world->rank() == 0) first = err.what();
        }
      });
      INFO(summary(f));
      CHECK(f.empty());
      return first;
    };
    const std::string zeroed = damaged("zeroed", [&](const fs::path& copy) {
      std::fstream io(copy, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(std::streamoff(written.data_start + e.begin + (e.end - e.begin) / 2));
      const std::string zeros(16, '\0');
      io.write(zeros.data(), std::streamsize(zeros.size()));
    });
    CHECK_THAT(zeroed, Catch::Contains("zeroed.safetensors: tensor '" + victim + "': its data's checksum is") &&
                           Catch::Contains("not completely written"));
    const std::string first_name = want.begin()->first;  // one bit of its first element flipped
    const std::string flipped = damaged("flipped", [&](const fs::path& copy) {
      std::fstream io(copy, std::ios::in | std::ios::out | std::ios::binary);
      const auto at = std::streamoff(written.data_start + written.tensors.at(first_name).begin);
      io.seekg(at);
      char c = 0;
      io.read(&c, 1);
      c = char(c ^ 1);
      io.seekp(at);
      io.write(&c, 1);
    });
    CHECK_THAT(flipped, Catch::Contains("tensor '" + first_name + "': its data's checksum"));
    const std::string cut = damaged("cut", [&](const fs::path& copy) { fs::resize_file(copy, fs::file_size(copy) - 8); });
    CHECK_THAT(cut, Catch::Contains("cut.safetensors") && Catch::Contains("data_offsets"));
    // What safetensors::write writes carries checksums too (one rank's whole tensors).
    const fs::path single = dir / "single.safetensors";
    const std::vector<double> v{1, 2, 3};
    checkpoint::safetensors::write<double>(single, {{"v", {3}, v.data()}});
    {
      std::fstream io(single, std::ios::in | std::ios::out | std::ios::binary);
      const auto info = checkpoint::safetensors::read_header(single);
      io.seekp(std::streamoff(info.data_start + 8));
      const double other = 2.5;
      io.write(reinterpret_cast<const char*>(&other), 8);
    }
    CHECK_THROWS_WITH(checkpoint::safetensors::verify_checksum(checkpoint::safetensors::read_header(single), "v"),
                      Catch::Contains("single.safetensors: tensor 'v': its data's checksum"));
  }
  SECTION("a tensor the model has no place for is an error naming it, unless a partial load allows it") {
    // The whole model and one more tensor (as a 3-layer file loaded into 2 layers: h.2.* left over).
    const fs::path more = dir / "more.safetensors";
    std::vector<checkpoint::safetensors::Named<double>> all;
    for (const auto& [name, tensor] : want) all.push_back({name, tensor.first, tensor.second.data()});
    const std::vector<double> extra(6, 1.0);
    all.push_back({"h.2.attn.qkv.weight", {2, 3}, extra.data()});
    checkpoint::safetensors::write(more, all);
    auto f = on_ranks(2, [&](CommPtr world, auto report) {
      Mesh2 mesh(world, {1, 2});
      TpRun model_run(mesh);
      auto slots = checkpoint::parameter_slots(model_run.model.units(), mesh);
      try {
        checkpoint::import_safetensors(more, mesh, slots);
        report("no error for a tensor left unread");
      } catch (const Error& e) {
        const std::string what = e.what();
        if (what.find("holds 1 tensors the model has no place for: 'h.2.attn.qkv.weight'") == std::string::npos) report(what);
      }
      checkpoint::import_safetensors(more, mesh, slots,
                                     {.may_leave_unread = [](const std::string& n) { return n.starts_with("h.2."); }});
      report(compare_slots(slots, want));
    });
    INFO(summary(f));
    CHECK(f.empty());
  }
}

TEST_CASE("redistribute_parameters: a GPT trained on dp 2 x tp 2 moves in memory to tp 4 over other, overlapping "
          "ranks, with no file; its parameters equal the trained ones bit for bit, its loss the trained model's",
          "[checkpoint][cross_mesh]") {
  // A world of 6: training on root ranks {0, 1, 2, 3} (dp 2 x tp 2), serving on {4, 5, 2, 3} (dp 1 x tp 4: vocab 29
  // as 8, 8, 8, 5). Ranks 0 and 1 only send, 4 and 5 only receive, 2 and 3 do both (at other coordinates).
  using MetaTp = models::GPT<double, MetaMesh<"dp", "tp">, parallel::MegatronPlan<true>>;
  const MeshRanks<2> train_ranks{{2, 2}, {0, 1, 2, 3}}, serve_ranks{{1, 4}, {4, 5, 2, 3}};
  auto serve_config = config();
  serve_config.seed = 9;  // the serving model starts from other values
  Full want;
  double want_loss = 0;
  auto f = on_ranks(6, [&](CommPtr world, auto report) {
    const auto train_mesh = mesh_on_ranks<Mesh2>(world, train_ranks.shape, train_ranks.root_ranks);
    const auto serve_mesh = mesh_on_ranks<Mesh2>(world, serve_ranks.shape, serve_ranks.root_ranks);
    std::optional<TpRun> trained;
    if (train_mesh) {
      trained.emplace(*train_mesh);
      train(*trained, *train_mesh, 0, 2);
      Full full;
      nn::for_each_parameter(trained->model, [&](auto& p) {
        if (!p.defined()) return;
        const auto whole = full_tensor(p.value());
        full[p.name()] = {std::vector<Extent>(whole.shape().begin(), whole.shape().end()),
                          std::vector<double>(whole.span().begin(), whole.span().end())};
      });
      auto [ids, tgt] = batch<TpModel>(*train_mesh, 7);
      auto [loss_t, saved] = trained->model.forward(ids, tgt);
      const double loss = full_tensor(loss_t)[0];
      if (train_mesh->rank() == 0) want = full, want_loss = loss;
    }
    world->barrier();  // `want` is written
    // The side a rank is not on is a twin (names, extents and layouts): on 4 and 5 in meta memory, on 0 and 1 the
    // model's own type over the sim backend.
    std::optional<TpModel> served;
    std::optional<MetaTp> twin;
    nn::ModelMoveTotals totals;
    try {
      if (serve_mesh) served.emplace(*serve_mesh, serve_config);
      if (train_mesh && served) {
        totals = nn::redistribute_parameters(trained->model, train_ranks, *served, serve_ranks);
      } else if (train_mesh) {  // a twin of the model's own type, in host memory over the sim backend
        TpModel host_twin(Mesh2(sim::world(0, 4), {1, 4}), serve_config);
        totals = nn::redistribute_parameters(trained->model, train_ranks, host_twin, serve_ranks);
      } else {
        twin.emplace(MetaMesh<"dp", "tp">(sim::world(0, 4), {2, 2}), config());
        totals = nn::redistribute_parameters(*twin, train_ranks, *served, serve_ranks);
      }
    } catch (const std::exception& e) {
      report(e.what());
      return;
    }
    if (totals.parameters != want.size() || totals.bytes != totals.minimum_bytes || totals.bytes == 0)
      report(detail::cat(totals.parameters, " parameters, ", totals.bytes, " B moved, minimum ", totals.minimum_bytes));
    if (!served) return;
    std::string diff;
    nn::for_each_parameter(*served, [&](auto& q) {
      if (!q.defined()) return;
      const auto whole = full_tensor(q.value());
      if (std::vector<double>(whole.span().begin(), whole.span().end()) != want.at(q.name()).second) diff += q.name() + " ";
    });
    if (!diff.empty()) report("parameters differ from the trained ones: " + diff);
    auto [ids, tgt] = batch<TpModel>(*serve_mesh, 7);
    auto [loss_t, saved] = served->forward(ids, tgt);
    const double loss = full_tensor(loss_t)[0];
    if (std::abs(loss - want_loss) > 1e-12 * std::abs(want_loss))
      report(detail::cat("loss on the serving mesh ", loss, ", on the training mesh ", want_loss));
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("redistribute_parameters: with keep_unnamed a smaller model fills the parameters it names and leaves the "
          "others; a rank in neither mesh fails at once, alone",
          "[checkpoint][cross_mesh][errors]") {
  // Rank 0 holds the source (1 block), rank 1 the destination (2 blocks, other values): a pipeline stage into a whole
  // model. Rank 2 holds a model on a mesh of its own and names ranks {0} and {1}: it is in neither mesh, and no rank
  // expects it.
  const MeshRanks<2> src{{1, 1}, {0}}, dst{{1, 1}, {1}};
  auto fewer = config();
  fewer.layers = 1;
  auto other = config();
  other.seed = 9;
  auto f = on_ranks(3, [&](CommPtr world, auto report) {
    const auto sm = mesh_on_ranks<Mesh2>(world, src.shape, src.root_ranks);
    const auto dm = mesh_on_ranks<Mesh2>(world, dst.shape, dst.root_ranks);
    const auto own = mesh_on_ranks<Mesh2>(world, {1, 1}, {2});
    const Mesh2 twin_mesh(sim::world(0, 1), {1, 1});
    const auto keep = nn::DstParameters::keep_unnamed;
    try {
      if (own) {
        TpModel model(*own, fewer), twin(twin_mesh, other);
        try {
          (void)nn::redistribute_parameters(model, src, twin, dst, 0, keep);
          report("rank 2: no error");
        } catch (const Error& e) {
          if (std::string(e.what()).find("root rank 2 is in neither mesh") == std::string::npos) report(e.what());
        }
        return;
      }
      if (sm) {
        TpModel model(*sm, fewer), twin(twin_mesh, other);
        (void)nn::redistribute_parameters(model, src, twin, dst, 0, keep);
        return;
      }
      TpModel model(*dm, other), source(twin_mesh, fewer);  // the twin is the oracle too: one rank, the same seed
      std::map<std::string, std::vector<double>> before, from;
      auto values = [](auto& p) { return std::vector<double>(p.value().to_local().span().begin(), p.value().to_local().span().end()); };
      nn::for_each_parameter(model, [&](auto& p) {
        if (p.defined()) before[p.name()] = values(p);
      });
      nn::for_each_parameter(source, [&](auto& p) {
        if (p.defined()) from[p.name()] = values(p);
      });
      const auto totals = nn::redistribute_parameters(source, src, model, dst, 0, keep);
      if (totals.parameters != from.size() || from.size() >= before.size())
        report(detail::cat(totals.parameters, " parameters moved of ", from.size(), " (destination ", before.size(), ")"));
      std::size_t kept = 0;
      nn::for_each_parameter(model, [&](auto& p) {
        if (!p.defined()) return;
        const auto found = from.find(p.name());
        const auto& want = found != from.end() ? found->second : before.at(p.name());
        kept += found == from.end() ? 1 : 0;
        if (values(p) != want) report(p.name() + (found != from.end() ? ": not the source's" : ": changed"));
      });
      if (kept == 0) report("no parameter of the destination was left out");
    } catch (const std::exception& e) {
      report(e.what());
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("redistribute_parameters: models that do not pair up are an error on every rank before any data moves",
          "[checkpoint][cross_mesh][errors]") {
  // Rank 0 holds the source (2 blocks), rank 1 the destination (1 block); each a twin of the other side.
  const MeshRanks<2> src{{1, 1}, {0}}, dst{{1, 1}, {1}};
  auto fewer = config();
  fewer.layers = 1;
  auto f = on_ranks(2, [&](CommPtr world, auto report) {
    const auto sm = mesh_on_ranks<Mesh2>(world, src.shape, src.root_ranks);
    const auto dm = mesh_on_ranks<Mesh2>(world, dst.shape, dst.root_ranks);
    const Mesh2 twin_mesh(sim::world(0, 1), {1, 1});
    try {
      if (sm) {
        TpModel model(*sm, config()), twin(twin_mesh, fewer);
        (void)nn::redistribute_parameters(model, src, twin, dst);
      } else {
        TpModel twin(twin_mesh, config()), model(*dm, fewer);
        (void)nn::redistribute_parameters(twin, src, model, dst);
      }
      report("no error");
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.find("disagree") == std::string::npos || m.find("no parameter of that name in the destination model") == std::string::npos)
        report(m);
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_checkpoint
