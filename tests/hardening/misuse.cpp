// API misuse that used to compute on, now an Error naming the parameter and the fix: an
// optimizer over parameters collected from the model before (or after) fully_shard took the
// model over (stale views: the step updated values the next all-gather overwrote, or freed
// memory), and an optimizer step before fully_shard's finish_gradient_sync (the step used the
// previous step's gradient shard while this step's reduction was still in flight).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <utility>

#include "dtensor/comm/threads.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_misuse {

using namespace dtensor;
using namespace dtensor::hardening;
using Catch::Contains;

namespace {
using Mesh = DeviceMesh<"dp", "fsdp", "tp">;
using Lin = nn::Linear<double, Mesh, nn::Replicated<>>;
using Net = nn::Sequential<Lin, nn::LayerNorm<double, Mesh>, Lin>;
using CE = nn::CrossEntropyLoss<double, Mesh>;
constexpr Extent kBatch = 4, kSeq = 3, kDim = 6, kHidden = 10, kClasses = 5;

Net make_net(const Mesh& mesh) {
  return Net(Lin("fc1", mesh, kDim, kHidden, 1), nn::LayerNorm<double, Mesh>("ln", mesh, kHidden),
             Lin("fc2", mesh, kHidden, kClasses, 2));
}

/// One forward and backward of the net (FSDP's hooks issue the gradient reductions).
void forward_backward(Net& net, const Mesh& mesh) {
  Tensor<double, 3> x({kBatch, kSeq, kDim});
  Tensor<std::int32_t, 2> t({kBatch, kSeq});
  for (Extent i = 0; i < x.numel(); ++i) x.data()[i] = std::sin(0.37 * double(i));
  for (Extent i = 0; i < t.numel(); ++i) t.data()[i] = std::int32_t((7 * i) % kClasses);
  CE ce;
  auto [logits, saved] = net.forward(distribute<typename Net::In::layout>(mesh, x));
  auto [loss, loss_saved] = ce.forward(logits, distribute<typename CE::Targets::layout>(mesh, t));
  net.backward(std::move(saved), ce.backward(std::move(loss_saved)));
}
}  // namespace

TEST_CASE("an optimizer over parameters collected from the model around fully_shard is an Error",
          "[hardening][misuse]") {
  for (int stage : {1, 2, 3}) {
    INFO("ZeRO-" << stage);
    auto out = outcomes(2, [&](CommPtr world) {
      world->set_timeout(long_timeout);
      Mesh mesh(world, {1, 2, 1});
      Net net = make_net(mesh);
      nn::ParamList<double, 3> before;
      nn::collect(net, before);
      optim::AdamW<double, 3> stale(before, {.lr = 1e-3});  // built before fully_shard: fine until it steps
      auto fsdp = parallel::fully_shard(net, mesh, {.stage = stage});
      forward_backward(net, mesh);
      fsdp.finish_gradient_sync();
      stale.step();
    });
    for (const auto& o : out) {
      INFO(o.message);
      CHECK(o.is_error);
      CHECK_THAT(o.message, Contains("AdamW::step") && Contains("parameter fc1.weight") &&
                                Contains("fully_shard has sharded") && Contains("fully_shard(...).params()"));
    }
    // Collected after fully_shard, from the model: refused when the optimizer is built.
    out = outcomes(2, [&](CommPtr world) {
      world->set_timeout(long_timeout);
      Mesh mesh(world, {1, 2, 1});
      Net net = make_net(mesh);
      auto fsdp = parallel::fully_shard(net, mesh, {.stage = stage});
      nn::ParamList<double, 3> after;
      nn::collect(net, after);  // ZeRO-2/3 have released the gradients / values: collect itself throws
      optim::SGD<double, 3> opt(after, {.lr = 0.1});
    });
    for (const auto& o : out) {
      INFO(o.message);
      CHECK(o.is_error);
      if (stage >= 2) CHECK_THAT(o.message, Contains("fc1") && Contains("released (sharded by FSDP)"));
      else CHECK_THAT(o.message, Contains("SGD") && Contains("parameter fc1.weight") && Contains("fully_shard has sharded"));
    }
  }
}

TEST_CASE("an optimizer step before fully_shard's finish_gradient_sync is an Error", "[hardening][misuse]") {
  for (int stage : {1, 2, 3}) {
    INFO("ZeRO-" << stage);
    auto out = outcomes(2, [&](CommPtr world) {
      world->set_timeout(long_timeout);
      Mesh mesh(world, {1, 2, 1});
      Net net = make_net(mesh);
      auto fsdp = parallel::fully_shard(net, mesh, {.stage = stage});
      optim::AdamW<double, 3> opt(fsdp.params(), {.lr = 1e-3});
      forward_backward(net, mesh);
      fsdp.finish_gradient_sync();
      opt.step();  // in order: fine
      fsdp.sync_parameters();
      opt.zero_grad();
      forward_backward(net, mesh);
      try {
        opt.step();  // before finish_gradient_sync: the reductions are still in flight
      } catch (...) {
        fsdp.finish_gradient_sync();  // leave no collective pending on the peer
        throw;
      }
    });
    for (const auto& o : out) {
      INFO(o.message);
      CHECK(o.is_error);
      CHECK_THAT(o.message, Contains("AdamW::step") && Contains("still Partial") && Contains("finish_gradient_sync"));
    }
  }
}

}  // namespace hardening_misuse
