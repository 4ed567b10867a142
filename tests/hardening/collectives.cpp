// Collectives across ranks: with the check on, ranks that call different collectives, counts,
// element types, reductions or roots all throw, each naming its own call and listing every
// rank's (by group rank and world rank), before any data moves.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_collectives {

using namespace dtensor;
using namespace dtensor::hardening;
using Catch::Contains;

TEST_CASE("a rank that reduces with another op is caught (max against sum)", "[hardening][collectives]") {
  auto out = outcomes(3, [](CommPtr w) {
    w->set_check_collectives(true);
    std::vector<float> x(8, 1.0f);
    w->all_reduce(std::span<float>(x), w->rank() == 2 ? ReduceOp::max : ReduceOp::sum);
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("all_reduce[world]") && Contains("ranks issued different collectives") &&
                              Contains("rank 0: all_reduce(8 x float32, sum)") &&
                              Contains("rank 2: all_reduce(8 x float32, max)"));
  }
}

TEST_CASE("the same bytes in another element type are caught (8 doubles against 16 floats)", "[hardening][collectives]") {
  auto out = outcomes(4, [](CommPtr w) {
    w->set_check_collectives(true);
    if (w->rank() == 0) {
      std::vector<double> x(8, 1.0);
      w->all_reduce(std::span<double>(x), ReduceOp::sum);
    } else {
      std::vector<float> x(16, 1.0f);
      w->all_reduce(std::span<float>(x), ReduceOp::sum);
    }
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("rank 0: all_reduce(8 x float64, sum)") && Contains("rank 1: all_reduce(16 x float32, sum)"));
  }
}

TEST_CASE("an all_gather against all_reduces, and different roots, are caught", "[hardening][collectives]") {
  auto out = outcomes(4, [](CommPtr w) {
    w->set_check_collectives(true);
    std::vector<float> x(4, 1.0f), all(16);
    if (w->rank() == 1) w->all_gather(std::span<const float>(x), std::span<float>(all));
    else w->all_reduce(std::span<float>(x), ReduceOp::sum);
  });
  for (const auto& r : out) {
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("rank 1: all_gather(4 x float32)") && Contains("rank 3: all_reduce(4 x float32, sum)"));
  }
  CHECK_THAT(out[1].message, Contains("all_gather[world] on rank 1"));
  CHECK_THAT(out[0].message, Contains("all_reduce[world] on rank 0"));

  out = outcomes(3, [](CommPtr w) {
    w->set_check_collectives(true);
    std::vector<std::int64_t> x(2);
    w->broadcast(std::span<std::int64_t>(x), w->rank() == 0 ? 1 : 0);
  });
  for (const auto& r : out) CHECK_THAT(r.message, Contains("rank 0: broadcast(2 x int64, root 1)") && Contains("root 0"));
}

TEST_CASE("on a sub-group, errors name the group, the group rank and the world rank", "[hardening][collectives]") {
  auto out = outcomes(4, [](CommPtr w) {
    auto sub = w->split(w->rank() % 2, w->rank());  // {0, 2}, {1, 3}
    sub->set_label("dp");
    sub->set_check_collectives(true);
    std::vector<float> x(w->rank() == 3 ? 3 : 2);
    sub->all_reduce(std::span<float>(x), ReduceOp::sum);
  });
  // (Ranks 0 and 2 may finish first or be aborted by the failure of the other group.)
  for (int r : {1, 3}) {
    INFO(out[std::size_t(r)].message);
    CHECK(out[std::size_t(r)].is_error);
    CHECK_THAT(out[std::size_t(r)].message,
               Contains("all_reduce[dp] on rank " + std::to_string(r / 2) + " (world rank " + std::to_string(r) + ")") &&
                   Contains("rank 0 (world rank 1): all_reduce(2 x float32, sum)") &&
                   Contains("rank 1 (world rank 3): all_reduce(3 x float32, sum)"));
  }
  // Bad input on a sub-group too.
  out = outcomes(4, [](CommPtr w) {
    auto sub = w->split(w->rank() / 2, w->rank());  // {0, 1}, {2, 3}
    sub->set_label("tp");
    std::vector<float> s(2), r(3);
    if (w->rank() == 3) sub->all_gather(std::span<const float>(s), std::span<float>(r));
  });
  CHECK_THAT(out[3].message, Contains("all_gather[tp] on rank 1 (world rank 3)") && Contains("recv has 3 elements"));
}

}  // namespace hardening_collectives
