// Hardening on the MPI backend: with the collective check on (as in every test program), ranks
// that disagree — about a collective's element type, count or reduction, about which collective
// to call, about a DTensor's layout or global extents — all throw a dtensor::Error listing every
// rank's call, before any data moves. Without the check MPI itself would corrupt data silently
// (docs/errors.md). Every case leaves the ranks in step, so the next case starts clean.
#include <span>
#include <string>
#include <vector>

#include "dtensor/comm/mpi.hpp"
#include "dtensor/distributed/settings_agreement.hpp"
#include "dtensor/dtensor.hpp"
#include "mpi_check.hpp"

using namespace dtensor;
using testing::contains;
using testing::error_of;

namespace {
/// A sub-communicator of every rank with the check on, so the cases do not depend on defaults.
CommPtr checked_world() {
  CommPtr g = mpi::world()->split(0, mpi::world()->rank());
  g->set_label("checked");
  g->set_check_collectives(true);
  return g;
}
}  // namespace

TEST_CASE("8 doubles on one rank against 16 floats on the others", "[mpi][hardening]") {
  CommPtr g = checked_world();
  const auto msg = error_of([&] {
    if (g->rank() == 0) {
      std::vector<double> x(8, 1.0);
      g->all_reduce(std::span<double>(x), ReduceOp::sum);
    } else {
      std::vector<float> x(16, 1.0f);
      g->all_reduce(std::span<float>(x), ReduceOp::sum);
    }
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"all_reduce[checked]", "ranks issued different collectives",
                                     "rank 0: all_reduce(8 x float64, sum)", "rank 1: all_reduce(16 x float32, sum)"}));
}

TEST_CASE("max on one rank against sum on the others", "[mpi][hardening]") {
  CommPtr g = checked_world();
  const auto msg = error_of([&] {
    std::vector<float> x(4, 1.0f);
    g->all_reduce(std::span<float>(x), g->rank() == 1 ? ReduceOp::max : ReduceOp::sum);
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"rank 0: all_reduce(4 x float32, sum)", "rank 1: all_reduce(4 x float32, max)"}));
}

TEST_CASE("an all_gather against all_reduces", "[mpi][hardening]") {
  CommPtr g = checked_world();
  const auto msg = error_of([&] {
    std::vector<float> x(4, 1.0f), all(4 * std::size_t(g->size()));
    if (g->rank() == 2) g->all_gather(std::span<const float>(x), std::span<float>(all));
    else g->all_reduce(std::span<float>(x), ReduceOp::sum);
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"rank 2: all_gather(4 x float32)", "rank 0: all_reduce(4 x float32, sum)"}));
}

TEST_CASE("ranks holding different layouts or extents of a DTensor", "[mpi][hardening]") {
  DeviceMesh<"tp"> mesh(mpi::world(), {mpi::world()->size()});
  mesh.comm().set_check_collectives(true);
  mesh.group(0).set_check_collectives(true);
  const int n = mesh.size(0);
  const auto full = arange<float>(Shape<2>{Extent(2 * n), Extent(2 * n)});
  auto msg = error_of([&] {
    if (mesh.comm().rank() == 0) (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, full));
    else (void)full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
  });
  const std::string extents = to_string(full.shape());
  DTENSOR_MPI_REQUIRE(contains(msg, {"redistribute[tp]", "ranks disagree", "rank 0: float32 " + extents,
                                     "(S(0)) -> (R)", "rank 1: float32 " + extents, "(S(1)) -> (R)"}));
  // Same byte count, different extents.
  msg = error_of([&] {
    const Shape<2> global = mesh.comm().rank() == 1 ? Shape<2>{Extent(n), 4} : Shape<2>{Extent(2 * n), 2};
    (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(global)));
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"ranks disagree", "rank 1: float32 [" + std::to_string(n) + ", 4]"}));
}

TEST_CASE("errors on a sub-group name the group and the world rank", "[mpi][hardening]") {
  CommPtr w = mpi::world();
  CommPtr sub = w->split(w->rank() % 2, w->rank());
  sub->set_label("dp");
  const auto msg = error_of([&] {
    std::vector<float> s(2), r(3);
    sub->all_gather(std::span<const float>(s), std::span<float>(r));
  });
  const bool named = w->rank() == sub->rank() ? contains(msg, "all_gather[dp] on rank 0:")
                                               : contains(msg, "(world rank " + std::to_string(w->rank()) + ")");
  DTENSOR_MPI_REQUIRE(named && contains(msg, "recv has 3 elements"));
}

TEST_CASE("ranks given another --seed fail at setup with the collective check off", "[mpi][hardening]") {
  // The agreement of settings is its own all-gather: it works whatever the check's switch, in
  // every build (a Release build has the check off).
  CommPtr g = mpi::world()->split(0, mpi::world()->rank());
  g->set_label("unchecked");
  g->set_check_collectives(false);
  const int odd = g->size() - 1;
  const auto msg = error_of([&] {
    require_same_settings(*g, "train_gpt",
                          {{"--lr", "0.003"}, {"--seed", g->rank() == odd ? "7" : "1234"}, {"--steps", "10"}});
  });
  std::string ranks;
  for (int r = 0; r < odd; ++r) ranks += (r ? ", " : "") + std::to_string(r);
  DTENSOR_MPI_REQUIRE(contains(msg, {"train_gpt", "before any step", "--seed: ranks " + ranks + " '1234'; rank " +
                                                                         std::to_string(odd) + " '7';"}));
  DTENSOR_MPI_REQUIRE(!contains(msg, "--lr") && !contains(msg, "--steps"));
  // The same settings pass.
  require_same_settings(*g, "train_gpt", {{"--lr", "0.003"}, {"--seed", "1234"}});
}

TEST_CASE("with the full check off, the always-on check catches ops and layouts within 16 calls", "[mpi][hardening]") {
  // As in a Release build: MPI reduces with each rank's own op, or moves unrelated elements of
  // equal byte counts, silently; the running hash compared every 16 calls turns that into an
  // Error on every rank naming the first call that differed.
  CommPtr g = mpi::world()->split(0, mpi::world()->rank());
  g->set_label("release");
  g->set_check_collectives(false);
  g->set_agree_before_data(false);  // it would stop the first differing call: the window is what is tested here
  REQUIRE(g->verify_every() == 16);
  auto msg = error_of([&] {
    std::vector<float> x(4, 1.0f);
    for (int i = 0; i < 16; ++i) g->all_reduce(std::span<float>(x), g->rank() == 1 && i == 3 ? ReduceOp::max : ReduceOp::sum);
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"all_reduce[release]", "always-on check", "call #4 of group 'release'",
                                     "rank 0: all_reduce(4 x float32, sum)", "rank 1: all_reduce(4 x float32, max)"}));

  DeviceMesh<"tp"> mesh(g, {g->size()});
  mesh.comm().set_check_collectives(false);
  mesh.comm().set_agree_before_data(false);
  const int n = mesh.size(0);
  const auto full = arange<float>(Shape<2>{Extent(2 * n), Extent(2 * n)});
  msg = error_of([&] {
    if (mesh.comm().rank() == 0) (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, full));
    else (void)full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
    mesh.comm().barrier();
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"always-on check", "(S(0)) -> (R)", "(S(1)) -> (R)"}));
}

TEST_CASE("Release defaults: agreement before data stops ops, dtypes, collectives and layouts that differ", "[mpi][hardening]") {
  // Only what a Release build has on by default (the full check off), and the always-on check off
  // too: one fused all-reduce before each collective compares what each rank asked, before MPI
  // moves a byte, and every rank throws naming the call and what each rank asked.
  CommPtr g = mpi::world()->split(0, mpi::world()->rank());
  g->set_label("release");
  g->set_check_collectives(false);
  g->set_verify_every(0);
  REQUIRE(g->agrees_before_data());
  std::vector<float> x(4, 1.0f);
  auto msg = error_of([&] { g->all_reduce(std::span<float>(x), g->rank() == 1 ? ReduceOp::max : ReduceOp::sum); });
  DTENSOR_MPI_REQUIRE(contains(msg, {"all_reduce[release]", "agreement before data", "nothing has been exchanged",
                                     "rank 0: all_reduce(4 x float32, sum)", "rank 1: all_reduce(4 x float32, max)"}));
  DTENSOR_MPI_REQUIRE(x == std::vector<float>(4, 1.0f));  // untouched
  msg = error_of([&] {
    if (g->rank() == 1) {
      std::vector<double> d(2, 1.0);  // the same 16 bytes
      g->all_reduce(std::span<double>(d), ReduceOp::sum);
    } else {
      g->all_reduce(std::span<float>(x), ReduceOp::sum);
    }
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"rank 0: all_reduce(4 x float32, sum)", "rank 1: all_reduce(2 x float64, sum)"}));
  msg = error_of([&] {
    std::vector<float> r(4 * std::size_t(g->size()));
    if (g->rank() == 1) g->all_gather(std::span<const float>(x), std::span<float>(r));
    else g->all_reduce(std::span<float>(x), ReduceOp::sum);
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"rank 0: all_reduce(4 x float32, sum)", "rank 1: all_gather(4 x float32)"}));

  DeviceMesh<"tp"> mesh(g, {g->size()});
  mesh.comm().set_check_collectives(false);
  mesh.comm().set_verify_every(0);
  const int n = mesh.size(0);
  const auto full = arange<float>(Shape<2>{Extent(2 * n), Extent(2 * n)});
  msg = error_of([&] {
    if (mesh.comm().rank() == 0) (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, full));
    else (void)full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"agreement before data", "in float32", "(S(0)) -> (R)", "(S(1)) -> (R)"}));
  // Ranks that agree: the exact tensor back.
  const auto back = full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
  DTENSOR_MPI_REQUIRE(std::equal(back.span().begin(), back.span().end(), full.span().begin()));
  // One rank comparing at another period (its own DTENSOR_VERIFY_EVERY=1): its always-on
  // all-gather met the others' next all-reduce (MPI_ERR_TRUNCATE); now every rank names it.
  CommPtr h = mpi::world()->split(0, mpi::world()->rank());
  h->set_label("period");
  h->set_check_collectives(false);
  h->set_verify_every(h->rank() == 0 ? 1 : 16);
  msg = error_of([&] {
    for (int i = 0; i < 3; ++i) h->all_reduce(std::span<float>(x), ReduceOp::sum);
  });
  DTENSOR_MPI_REQUIRE(contains(msg, {"all_reduce[period]", "agreement before data",
                                     "rank 0: all_reduce(4 x float32, sum), then the always-on check's comparison",
                                     "rank 1: all_reduce(4 x float32, sum)\n"}));
}
