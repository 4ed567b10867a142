// nn::ClassificationCrossEntropy (nn/classification_loss.hpp): the mean cross-entropy of [B, C]
// logits against [B] labels equals the formula's, and its gradient softmax - onehot over B; on a
// data dimension of 2 (the batch split unevenly, 3 samples) the loss and the gathered gradient
// equal the one-rank ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/classification_loss.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_nn_classification {

using namespace dtensor;
using namespace dtensor::testing;

namespace {
using Mesh = DeviceMesh<"dp", "tp">;
using CE = nn::ClassificationCrossEntropy<double, Mesh>;
constexpr Extent kB = 3, kC = 5;

Tensor<double, 2> logits_full() {
  Tensor<double, 2> x({kB, kC});
  for (Extent i = 0; i < x.numel(); ++i) x.data()[i] = std::cos(0.7 * double(i)) * 2;
  return x;
}
Tensor<std::int32_t, 1> labels_full() {
  Tensor<std::int32_t, 1> y({kB});
  for (Extent b = 0; b < kB; ++b) y[b] = std::int32_t((2 * b + 1) % kC);
  return y;
}

/// The loss and the full gradient of dloss * loss on a (dp, tp) mesh.
std::pair<double, Tensor<double, 2>> run(CommPtr world, std::array<int, 2> shape, double dloss) {
  Mesh mesh(world, shape);
  CE ce;
  auto [loss, saved] = ce.forward(distribute<CE::LogitsL>(mesh, logits_full()), distribute<CE::LabelsL>(mesh, labels_full()));
  auto d = ce.backward(std::move(saved), dloss);
  return {full_tensor(loss)[0], full_tensor(d)};
}
}  // namespace

TEST_CASE("classification cross-entropy over [B, C]: the formula, and the same on a split batch", "[nn][loss]") {
  const auto x = logits_full();
  const auto y = labels_full();
  double want = 0;
  Tensor<double, 2> want_grad({kB, kC});
  for (Extent b = 0; b < kB; ++b) {
    double m = x(b, 0), sum = 0;
    for (Extent c = 0; c < kC; ++c) m = std::max(m, x(b, c));
    for (Extent c = 0; c < kC; ++c) sum += std::exp(x(b, c) - m);
    want += (m + std::log(sum) - x(b, y[b])) / double(kB);
    for (Extent c = 0; c < kC; ++c)
      want_grad(b, c) = 0.5 * (std::exp(x(b, c) - m) / sum - (c == Extent(y[b]) ? 1.0 : 0.0)) / double(kB);
  }
  std::pair<double, Tensor<double, 2>> one;
  threads::run(1, [&](CommPtr w) { one = run(w, {1, 1}, 0.5); });
  CHECK(std::abs(one.first - want) < 1e-12);
  for (Extent i = 0; i < want_grad.numel(); ++i) CHECK(std::abs(one.second.data()[i] - want_grad.data()[i]) < 1e-12);
  auto failures = on_ranks(4, [&](CommPtr w, auto report) {  // dp = 2 (samples 2, 1), tp = 2
    auto [loss, grad] = run(w, {2, 2}, 0.5);
    if (std::abs(loss - want) > 1e-12) report("loss " + std::to_string(loss) + " vs " + std::to_string(want));
    for (Extent i = 0; i < want_grad.numel(); ++i)
      if (std::abs(grad.data()[i] - want_grad.data()[i]) > 1e-12) report("gradient differs at " + std::to_string(i));
  });
  INFO((failures.empty() ? "" : failures.front()));
  CHECK(failures.empty());
}

}  // namespace test_nn_classification
