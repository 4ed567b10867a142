// Model-level entry points given bad arguments (issue 25, the library probe beyond the outside
// catalogue): each is a dtensor::Error naming the op and the sizes, in every build type.
#include <catch2/catch.hpp>

#include "dtensor/models/vit_data.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_models {

using namespace dtensor;
using namespace dtensor::hardening;
using Catch::Contains;

TEST_CASE("synthetic_images with no classes is an Error, not a division by zero", "[hardening][models]") {
  models::ViTConfig c{.patches = 4, .patch_dim = 6, .classes = 0, .dim = 8, .heads = 2, .layers = 1};
  // Each label was drawn modulo the classes: SIGFPE, the whole process gone.
  const Outcome o = outcome_of_call([&] { (void)models::synthetic_images<float>(c, 2, 1); });
  CHECK(o.is_error);
  CHECK_THAT(o.message, Contains("models::synthetic_images") && Contains("0 classes"));
  c.classes = 3;
  const Outcome negative = outcome_of_call([&] { (void)models::synthetic_images<float>(c, -1, 1); });
  CHECK(negative.is_error);
  CHECK_THAT(negative.message, Contains("models::synthetic_images") && Contains("batch -1"));
  // Valid input still works: 2 images, labels in range.
  const auto [x, y] = models::synthetic_images<float>(c, 2, 1);
  CHECK(x.extent(0) == 2);
  CHECK((y[0] >= 0 && y[0] < 3 && y[1] >= 0 && y[1] < 3));
}

}  // namespace hardening_models
