// dtensor/models/vit_data.hpp — a deterministic synthetic image task for models::ViT (models/vit.hpp):
// the example trainer's data and the parity tests'.
//
//   auto [patches, labels] = models::synthetic_images<float>(cfg, /*batch=*/32, /*seed=*/step);
//   // patches [32, cfg.patches, cfg.patch_dim], labels [32] in [0, cfg.classes): whole, on the host
//
// Each image's label y is drawn uniformly; its patches are a class pattern plus noise: value i of
// patch p is 0.5 sin((y + 1)(0.7 (p + 1) + 0.3 i)) + 0.3 N(0, 1). The pattern differs per class and
// the noise hides it only partly, so a classifier's loss falls from log(classes) and the task
// cannot be solved by one patch alone. The same seed gives the same batch on every rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>

#include "dtensor/core/factories.hpp"
#include "dtensor/models/vit.hpp"

namespace dtensor::models {

template <kernels::host::FloatElement T>
std::pair<Tensor<T, 3>, Tensor<std::int32_t, 1>> synthetic_images(const ViTConfig& c, Extent batch, std::uint64_t seed) {
  // Each label is drawn modulo the classes: 0 classes was a division by zero (SIGFPE) in every build.
  dtensor::detail::check(c.classes > 0 && c.patches >= 0 && c.patch_dim >= 0 && batch >= 0, "models::synthetic_images",
                         "batch ", batch, " of ", c.patches, " patches of ", c.patch_dim, " values, ", c.classes,
                         " classes: the classes must be > 0 and no size negative");
  Tensor<T, 3> x(Shape<3>{batch, c.patches, c.patch_dim});
  Tensor<std::int32_t, 1> y(Shape<1>{batch});
  std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + 17);
  std::normal_distribution<double> noise(0.0, 0.3);
  for (Extent b = 0; b < batch; ++b) {
    const auto label = std::int32_t(g() % std::uint64_t(c.classes));
    y[b] = label;
    for (Extent p = 0; p < c.patches; ++p)
      for (Extent i = 0; i < c.patch_dim; ++i)
        x(b, p, i) = T(0.5 * std::sin(double(label + 1) * (0.7 * double(p + 1) + 0.3 * double(i))) + noise(g));
  }
  return {std::move(x), std::move(y)};
}

}  // namespace dtensor::models

// The names these models had before models/ became their namespace (nn::GPT and so on): kept,
// so that code written against them compiles as before.
namespace dtensor::nn {
using models::synthetic_images;
}  // namespace dtensor::nn
