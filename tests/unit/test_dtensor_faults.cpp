// Bad input and faults at the DTensor level: each ends in a dtensor::Error with a message
// naming the op, the shapes and the ranks — on every rank, never a hang. The scenarios that
// make sense on every backend live in support/fault_cases.hpp (tests/mpi runs them too).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "dtensor/dtensor.hpp"
#include "support/fault_cases.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_dtensor_faults {

using namespace dtensor;
using namespace dtensor::testing;
using namespace std::chrono_literals;

namespace {
/// The message of each rank's exception ("" where the rank returned normally).
template <class F>
std::vector<std::string> errors_of(int n, F&& fn) {
  std::vector<std::string> out;
  for (auto& e : threads::run_collect(n, std::forward<F>(fn))) {
    std::string msg;
    if (e) try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        msg = x.what();
      }
    out.push_back(msg);
  }
  return out;
}
}  // namespace

TEST_CASE("a mesh whose size is not the communicator's is an error", "[faults]") {
  for (const auto& e : errors_of(6, [](CommPtr world) { build_mismatched_mesh(world); })) {
    INFO(e);
    CHECK(mismatched_mesh_problem(e, 6).empty());
  }
}

TEST_CASE("from_local with a piece of the wrong extents", "[faults]") {
  // Checked locally, the rank at fault throws, naming the shapes; with check_all_ranks every
  // rank throws, and the message lists the ranks at fault.
  for (bool all : {false, true}) {
    const auto errs = errors_of(4, [&](CommPtr world) { from_local_bad_piece(world, all); });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << (all ? ", check_all_ranks: " : ": ") << errs[std::size_t(r)]);
      CHECK(from_local_problem(errs[std::size_t(r)], r, 4, all).empty());
    }
  }
}

TEST_CASE("ranks issuing different collectives are caught by the check switch", "[faults]") {
  for (const auto& e : errors_of(4, [](CommPtr world) { mismatched_collectives(world); })) {
    INFO(e);
    CHECK(mismatched_collectives_problem(e).empty());
  }
}

TEST_CASE("a rank that throws mid-redistribution releases the others", "[faults]") {
  auto errs = errors_of(4, [](CommPtr world) {
    DeviceMesh<"tp"> mesh(world, {4});
    auto x = distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(Shape<2>{8, 4}));
    if (world->rank() == 3) throw std::runtime_error("out of memory on purpose");
    (void)redistribute<Layout<Replicate>>(x);
  });
  CHECK_THAT(errs[3], Catch::Contains("out of memory on purpose"));
  for (int r = 0; r < 3; ++r) CHECK_THAT(errs[std::size_t(r)], Catch::Contains("rank 3"));
}

TEST_CASE("a rank that skips a redistribution is named", "[faults]") {
  auto errs = errors_of(4, [](CommPtr world) {
    world->set_timeout(300ms);
    DeviceMesh<"tp"> mesh(world, {4});
    mesh.group(0).set_timeout(300ms);
    auto x = distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(Shape<2>{8, 4}));
    if (world->rank() == 2) return;  // skips the all-gather
    (void)redistribute<Layout<Replicate>>(x);
  });
  // The redistribution's fingerprint exchange (the check switch, on in tests) or, without it,
  // its all_gather names the missing rank.
  for (int r : {0, 1, 3})
    CHECK_THAT(errs[std::size_t(r)], (Catch::Contains("redistribute[tp]") || Catch::Contains("all_gather[tp]")) &&
                                         Catch::Contains("rank 2"));
}

}  // namespace test_dtensor_faults
