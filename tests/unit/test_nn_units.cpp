// Generic units and hooks (nn/units.hpp, nn/sequential.hpp): a model that only declares its
// children gets units, set_hooks and hook firing from the library, so DDP with overlap and
// FSDP (ZeRO-3) train it exactly like its one-rank run (double, within 1e-12); the units are
// one per module, named after them; a module without parameters forms no unit; the hooks fire in
// forward and backward order.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_nn_units {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

using DpMesh = DeviceMesh<"dp", "tp">;             // one rank and DDP
using Mesh = DeviceMesh<"dp", "fsdp", "tp">;       // FSDP and HSDP
using NoDpMesh = DeviceMesh<"fsdp", "tp">;         // DDP over a dimension that is not "dp" (named, no Role::data)
template <class M>
using Lin = nn::Linear<double, M, nn::Replicated<>>;
template <class M>
using Norm = nn::LayerNorm<double, M>;
template <class M>
using Net = nn::Sequential<Lin<M>, Norm<M>, Lin<M>>;  // a user's model: its modules and nothing else
template <class M>
using CE = nn::CrossEntropyLoss<double, M>;

constexpr Extent kBatch = 4, kSeq = 3, kDim = 6, kHidden = 10, kClasses = 5;

template <class M>
Net<M> make_net(const M& mesh) {
  return Net<M>(Lin<M>("fc1", mesh, kDim, kHidden, 1), Norm<M>("ln", mesh, kHidden),
                Lin<M>("fc2", mesh, kHidden, kClasses, 2));
}

/// The step's batch, the same on every mesh: x [B, T, C] and targets [B, T].
template <class M>
std::pair<typename Net<M>::In, typename CE<M>::Targets> batch(const M& mesh, int step) {
  Tensor<double, 3> x({kBatch, kSeq, kDim});
  Tensor<std::int32_t, 2> t({kBatch, kSeq});
  for (Extent i = 0; i < x.numel(); ++i) x.data()[i] = std::sin(0.37 * double(i) + step);
  for (Extent i = 0; i < t.numel(); ++i) t.data()[i] = std::int32_t((7 * i + step) % kClasses);
  return {distribute<typename Net<M>::In::layout>(mesh, x), distribute<typename CE<M>::Targets::layout>(mesh, t)};
}

enum class Wrap { none, ddp, fsdp };

/// Losses of 3 SGD steps on a mesh of shape `shape`.
template <class M, fixed_string Dim = "", std::size_t R>
std::vector<double> train(CommPtr world, std::array<int, R> shape, Wrap wrap) {
  M mesh(world, shape);
  auto net = make_net(mesh);
  CE<M> ce;
  std::vector<double> losses;
  auto run = [&](auto& params, auto&& before_step, auto&& after_step) {
    optim::SGD<double, R> opt(params, {.lr = 0.5});
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      auto [x, targets] = batch(mesh, s);
      auto [logits, saved] = net.forward(x);
      auto [loss, loss_saved] = ce.forward(logits, targets);
      net.backward(std::move(saved), ce.backward(std::move(loss_saved)));
      before_step();
      opt.step();
      after_step();
      losses.push_back(full_tensor(loss)[0]);
    }
  };
  if constexpr (std::is_same_v<M, Mesh>) {
    auto fsdp = parallel::fully_shard(net, mesh, {.stage = 3});
    run(fsdp.params(), [&] { fsdp.finish_gradient_sync(); }, [&] { fsdp.sync_parameters(); });
  } else {
    nn::ParamList<double, R> params;
    nn::collect(net, params);
    parallel::DataParallel<M, Dim> ddp(mesh);
    if (wrap == Wrap::ddp) ddp.attach(net);
    run(params, [&] { wrap == Wrap::ddp ? ddp.finish_gradient_sync() : ddp.all_reduce_gradients(params); }, [] {});
  }
  return losses;
}

}  // namespace

TEST_CASE("nn::Sequential: units from its modules, hooks in forward and backward order", "[nn][units]") {
  threads::run(1, [](CommPtr w) {
    DpMesh mesh(w, {1, 1});
    auto net = make_net(mesh);
    static_assert(nn::HasUnits<Net<DpMesh>>);
    REQUIRE(net.units().size() == 3);
    CHECK(net.units()[0].group->name() == "fc1");
    CHECK(net.units()[1].group->name() == "ln");
    CHECK(net.units()[2].group->name() == "fc2");
    CHECK(net.units()[0].params.size() == 2);  // weight, bias
    std::vector<std::string> order;
    auto note = [&](const char* what) { return [&order, what](std::size_t u) { order.push_back(what + std::to_string(u)); }; };
    net.set_hooks({note("f"), note("F"), note("b"), note("g")});
    auto [x, targets] = batch(mesh, 0);
    auto [y, saved] = net.forward(x);
    net.backward(std::move(saved), y);
    CHECK(order == std::vector<std::string>{"f0", "F0", "f1", "F1", "f2", "F2", "b2", "g2", "b1", "g1", "b0", "g0"});
    order.clear();
    auto [y2, saved2] = net.forward(x);
    auto [dx, wctx] = net.backward_input(std::move(saved2), y2);  // split: pre_backward here, grads_ready below
    net.backward_weight(std::move(wctx));
    CHECK(order == std::vector<std::string>{"f0", "F0", "f1", "F1", "f2", "F2", "b2", "b1", "b0", "g2", "g1", "g0"});
  });
}

// nn::Repeated inside a Sequential: each element is a unit of its own, named after it, with its
// own hooks in order (a model's run-time number of blocks), and the chain computes what the modules
// chained by hand compute.
TEST_CASE("nn::Repeated: one unit per element, hooks per element, the same output", "[nn][units]") {
  threads::run(1, [](CommPtr w) {
    DpMesh mesh(w, {1, 1});
    using Sq = Lin<DpMesh>;
    std::vector<Sq> blocks;
    for (int k = 0; k < 3; ++k) blocks.emplace_back("h." + std::to_string(k), mesh, kDim, kDim, 20 + k);
    nn::Sequential<Norm<DpMesh>, nn::Repeated<Sq>, Sq> net(Norm<DpMesh>("ln", mesh, kDim), nn::Repeated<Sq>(std::move(blocks)),
                                                            Sq("out", mesh, kDim, kDim, 30));
    REQUIRE(net.units().size() == 5);
    CHECK(net.units()[1].group->name() == "h.0");
    CHECK(net.units()[3].group->name() == "h.2");
    std::vector<std::string> order;
    auto note = [&](const char* what) { return [&order, what](std::size_t u) { order.push_back(what + std::to_string(u)); }; };
    net.set_hooks({note("f"), nullptr, note("b"), note("g")});
    auto [x, targets] = batch(mesh, 0);
    auto [y, saved] = net.forward(x);
    net.backward(std::move(saved), y);
    CHECK(order == std::vector<std::string>{"f0", "f1", "f2", "f3", "f4", "b4", "g4", "b3", "g3", "b2", "g2", "b1", "g1", "b0", "g0"});
    // The same output as the modules run one after another.
    auto h = net.get<0>().forward(x).y;
    for (auto& b : net.get<1>()) h = b.forward(h).y;
    const auto want = full_tensor(net.get<2>().forward(h).y), got = full_tensor(y);
    for (Extent i = 0; i < got.numel(); ++i) CHECK(got.data()[i] == want.data()[i]);
  });
}

TEST_CASE("a model that only declares its children trains under DDP and FSDP like on one rank", "[nn][units]") {
  std::vector<double> ref;
  threads::run(1, [&](CommPtr w) { ref = train<DpMesh>(w, std::array{1, 1}, Wrap::none); });
  REQUIRE(ref.size() == 3);
  CHECK(ref.back() < ref.front());
  for (auto [shape, wrap, what] : {std::tuple{std::array{2, 1, 1}, Wrap::ddp, "DDP (overlapped)"},
                                   std::tuple{std::array{1, 2, 1}, Wrap::fsdp, "ZeRO-3"},
                                   std::tuple{std::array{2, 2, 1}, Wrap::fsdp, "HSDP 2x2"}}) {
    auto failures = on_ranks(shape[0] * shape[1], [&](CommPtr w, auto report) {
      const auto losses = wrap == Wrap::ddp ? train<DpMesh>(w, std::array{shape[0], shape[2]}, wrap)
                                            : train<Mesh>(w, shape, wrap);
      for (std::size_t s = 0; s < ref.size(); ++s)
        if (std::abs(losses[s] - ref[s]) > 1e-12 * std::max(1.0, std::abs(ref[s])))
          report(std::string(what) + ": step " + std::to_string(s) + " loss " + std::to_string(losses[s]) + " vs " +
                 std::to_string(ref[s]));
    });
    INFO(what);
    CHECK(failures.empty());
  }
  auto failures = on_ranks(2, [&](CommPtr w, auto report) {  // DataParallel<Mesh, "fsdp">: no "dp" dimension needed
    const auto losses = train<NoDpMesh, "fsdp">(w, std::array{2, 1}, Wrap::ddp);
    for (std::size_t s = 0; s < ref.size(); ++s)
      if (std::abs(losses[s] - ref[s]) > 1e-12 * std::max(1.0, std::abs(ref[s])))
        report("DDP over \"fsdp\": step " + std::to_string(s) + " loss " + std::to_string(losses[s]));
  });
  INFO((failures.empty() ? "" : failures.front()));
  CHECK(failures.empty());
}

}  // namespace test_nn_units
