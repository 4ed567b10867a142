// Bad input and faults at the DTensor level: each ends in a dtensor::Error with a message
// naming the op, the shapes and the ranks — on every rank, never a hang.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "dtensor/dtensor.hpp"
#include "support/on_ranks.hpp"

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
  auto errs = errors_of(6, [](CommPtr world) { DeviceMesh<"dp", "tp"> mesh(world, {2, 4}); });
  for (const auto& e : errs) {
    CHECK_THAT(e, Catch::Contains("DeviceMesh") && Catch::Contains("[2, 4] has 8 ranks") &&
                      Catch::Contains("communicator has 6"));
  }
}

TEST_CASE("from_local with a piece of the wrong extents", "[faults]") {
  // Checked locally: the rank at fault throws, naming its coordinate and the shapes.
  auto errs = errors_of(4, [](CommPtr world) {
    DeviceMesh<"tp"> mesh(world, {4});
    const Extent rows = world->rank() == 2 ? 5 : 4;
    try {
      from_local<Layout<Shard<0>>>(mesh, zeros<float>(Shape<2>{rows, 3}), Shape<2>{13, 3});
    } catch (const Error& e) {
      if (world->rank() != 2) throw;
      throw;
    }
  });
  CHECK_THAT(errs[2], Catch::Contains("local piece [5, 3]") && Catch::Contains("[4, 3]") && Catch::Contains("[13, 3]"));
  // With check_all_ranks every rank throws, and the message lists the ranks at fault.
  auto all = errors_of(4, [](CommPtr world) {
    DeviceMesh<"tp"> mesh(world, {4});
    const Extent rows = world->rank() == 2 ? 5 : (world->rank() == 3 ? 1 : 4);
    from_local<Layout<Shard<0>>>(mesh, zeros<float>(Shape<2>{rows, 3}), Shape<2>{13, 3}, true);
  });
  for (const auto& e : all) CHECK_THAT(e, Catch::Contains("from_local") && Catch::Contains("rank 2: global [13, 3], piece [5, 3]"));
}

TEST_CASE("ranks issuing different collectives are caught by the check switch", "[faults]") {
  auto errs = errors_of(4, [](CommPtr world) {
    DeviceMesh<"tp"> mesh(world, {4});
    mesh.comm().set_check_collectives(true);
    mesh.group(0).set_check_collectives(true);
    auto x = distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(Shape<2>{8, 4}));
    if (world->rank() == 1) (void)redistribute<Layout<Shard<1>>>(x);  // all_to_all
    else (void)redistribute<Layout<Replicate>>(x);                    // all_gather
  });
  for (const auto& e : errs)
    CHECK_THAT(e, Catch::Contains("ranks issued different collectives") && Catch::Contains("rank 1: all_to_all") &&
                      Catch::Contains("rank 0: all_gather"));
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

TEST_CASE("a rank that never arrives times out with its name", "[faults]") {
  auto errs = errors_of(4, [](CommPtr world) {
    world->set_timeout(300ms);
    DeviceMesh<"tp"> mesh(world, {4});
    mesh.group(0).set_timeout(300ms);
    auto x = distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(Shape<2>{8, 4}));
    if (world->rank() == 2) return;  // skips the all-gather
    (void)redistribute<Layout<Replicate>>(x);
  });
  for (int r : {0, 1, 3}) CHECK_THAT(errs[std::size_t(r)], Catch::Contains("all_gather") && Catch::Contains("2"));
}
