// A user's FSDP x TP program, as docs/fsdp.md's loop is written: the GPT under MegatronPlan<true>
// (tensor + sequence parallel) on a (dp, fsdp, tp) mesh, ZeRO-3 with prefetch, AdamW, the
// sequence-parallel gradient sync, clipping, two steps on 4 threads. Not built by CMake: it is the
// program whose -O2 compile time and peak memory bench/compile/measure.sh compares across
// versions of the headers (docs/benchmarks.md, "A user's FSDP x TP program: compile time and
// memory"), so it uses only what the headers of 03ace32 (Nov 26) and later both provide.
#include <cstdint>
#include <cstdio>
#include <utility>

#include "dtensor/training.hpp"

// The GPT moved from dtensor::nn (03ace32) to dtensor::models (later): name it through both
// namespaces so the same program compiles against either version.
namespace dtensor::models {}
namespace user_models {
using namespace dtensor::nn;
using namespace dtensor::models;
}  // namespace user_models

using namespace dtensor;
using Mesh = DeviceMesh<"dp", "fsdp", "tp">;
using Model = user_models::GPT<float, Mesh, parallel::MegatronPlan<true>>;

int main() {
  const user_models::GPTConfig cfg{.vocab = 96, .seq = 16, .dim = 32, .heads = 4, .layers = 2};
  constexpr Extent batch = 4;
  threads::run(4, [&](CommPtr world) {
    Mesh mesh(world, {1, 2, 2});
    Model model(mesh, cfg);
    auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3, .prefetch = 2});
    optim::AdamW<float, 3> opt(fsdp.params(), {.lr = 3e-4});
    for (int step = 0; step < 2; ++step) {
      // Tokens of the rule x' = (5 x + 3) mod V, whole on every rank.
      Tensor<std::int32_t, 2> ids(Shape<2>{batch, cfg.seq}), targets(Shape<2>{batch, cfg.seq});
      for (Extent b = 0; b < batch; ++b) {
        std::int32_t x = std::int32_t((7 * b + step) % cfg.vocab);
        for (Extent t = 0; t < cfg.seq; ++t) {
          ids(b, t) = x;
          x = std::int32_t((5 * Extent(x) + 3) % cfg.vocab);
          targets(b, t) = x;
        }
      }
      using L = typename Model::Ids::layout;
      opt.zero_grad();
      auto [loss, saved] = model.forward(distribute_replicated<L>(mesh, ids), distribute_replicated<L>(mesh, targets));
      model.backward(std::move(saved));
      fsdp.finish_gradient_sync();
      parallel::sequence_parallel_grads(fsdp.params(), mesh);
      optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
      opt.step();
      fsdp.sync_parameters();
      const double l = full_tensor(loss)[0];
      if (world->rank() == 0) std::printf("step %d loss %.6f\n", step, l);
    }
  });
}
