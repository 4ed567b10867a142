// Distributed checkpoints under MPI (checkpoint/): every process writes its own pieces, rank 0
// the manifest; a GPT saved on dp 2 x tp n/2 loads on tp 2 x dp n/2 (another layout) with
// every parameter's full tensor equal to the saved one; a save into an unwritable directory is
// an error on every rank, not a hang. The processes share /tmp (one machine).
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "dtensor/models/gpt_config.hpp"
#include "dtensor/checkpoint/training_state.hpp"
#include "dtensor/comm/mpi.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "mpi_check.hpp"

using namespace dtensor;
using namespace dtensor::testing;
namespace fs = std::filesystem;

namespace {

using Mesh = DeviceMesh<"dp", "tp">;
using Model = models::GPT<double, Mesh, parallel::MegatronPlan<false>>;

models::GPTConfig config() {
  return {.vocab = 29, .seq = 8, .dim = 16, .heads = 4, .layers = 1, .mlp_ratio = 2, .seed = 7};
}

/// The same directory on every process (rank 0's pid).
fs::path shared_dir(const char* name) {
  int pid = int(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, verdict_comm());
  return fs::temp_directory_path() / ("dtensor-ckpt-mpi-" + std::to_string(pid)) / name;
}

template <class M>
std::vector<std::vector<double>> full_parameters(M& model) {
  std::vector<std::vector<double>> out;
  nn::for_each_parameter(model, [&](auto& p) {
    if (!p.defined()) return;
    const auto t = full_tensor(p.value());
    out.emplace_back(t.span().begin(), t.span().end());
  });
  return out;
}

}  // namespace

TEST_CASE("MPI: saved on dp 2 x tp n/2, loaded on dp n/2 x tp 2: the same full parameters", "[mpi][checkpoint]") {
  auto world = mpi::world();
  const int n = world->size();
  const auto dir = shared_dir("reshard");
  std::vector<std::vector<double>> saved_full, loaded_full;
  const auto msg = error_of([&] {
    Mesh mesh(world, {2, n / 2});
    Model model(mesh, config());
    nn::ParamList<double, 2> ps;
    model.collect(ps);
    optim::AdamW<double, 2> opt(ps, {.lr = 1e-2});
    for (auto& p : ps) std::fill(p.value.begin(), p.value.end(), 0.25 * double(p.value.size() % 7));  // not the init
    checkpoint::save_training_state(dir, mesh, model, opt, {.step = 4, .config = models::config_of(config())});
    saved_full = full_parameters(model);
    Mesh other(world, {n / 2, 2});
    Model loaded(other, config());
    nn::ParamList<double, 2> qs;
    loaded.collect(qs);
    optim::AdamW<double, 2> opt2(qs, {.lr = 1e-2});
    const auto meta = checkpoint::load_training_state(dir, other, loaded, opt2, models::config_of(config()));
    if (meta.step != 4) throw Error("test", "step " + std::to_string(meta.step));
    loaded_full = full_parameters(loaded);
  });
  INFO(msg);
  DTENSOR_MPI_REQUIRE(msg.empty() && !saved_full.empty() && saved_full == loaded_full);
  if (world->rank() == 0) fs::remove_all(dir.parent_path());
}

TEST_CASE("MPI: a save into an unwritable directory fails on every rank", "[mpi][checkpoint][faults]") {
  auto world = mpi::world();
  const auto file = shared_dir("a-file");
  if (world->rank() == 0) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << "not a directory";
  }
  MPI_Barrier(verdict_comm());
  const auto msg = error_of([&] {
    Mesh mesh(world, {world->size(), 1});
    Model model(mesh, config());
    nn::ParamList<double, 2> ps;
    model.collect(ps);
    optim::AdamW<double, 2> opt(ps, {.lr = 1e-2});
    checkpoint::save_training_state(file / "ckpt", mesh, model, opt, {});
  });
  INFO(msg);
  DTENSOR_MPI_REQUIRE(contains(msg, {"checkpoint::save", "rank 0: ", "cannot create"}));
  MPI_Barrier(verdict_comm());
  if (world->rank() == 0) fs::remove_all(file.parent_path());
}
