// Layouts across ranks: ranks that disagree about a DTensor (its layout, its global extents)
// are caught by the redistribution's fingerprint (distributed/agreement.hpp) before any data
// moves, on every rank — not turned into a full_tensor of mixed-up elements.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "dtensor/dtensor.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_layouts {

using namespace dtensor;
using namespace dtensor::hardening;
using Catch::Contains;

namespace {
/// Turns the check on for the mesh's communicators (the tests have it on by default; this
/// keeps the cases meaningful under DTENSOR_CHECK_COLLECTIVES=0 too).
template <class Mesh>
void check_on(const Mesh& mesh) {
  for (std::size_t lo = 0; lo < Mesh::ndim; ++lo)
    for (std::size_t hi = lo; hi < Mesh::ndim; ++hi) mesh.group(lo, hi).set_check_collectives(true);
}
}  // namespace

TEST_CASE("ranks holding different layouts of the same tensor: full_tensor throws everywhere", "[hardening][layouts]") {
  const Stopwatch clock;
  auto out = outcomes(2, [](CommPtr w) {
    w->set_timeout(long_timeout);
    DeviceMesh<"tp"> mesh(w, {2});
    check_on(mesh);
    const auto full = arange<float>(Shape<2>{4, 4});
    if (w->rank() == 0) (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, full));
    else (void)full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
  });
  CHECK(clock.elapsed() < prompt);
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("redistribute[tp]") && Contains("ranks disagree") &&
                              Contains("rank 0: float32 [4, 4] on mesh [2]: (S(0)) -> (R)") &&
                              Contains("rank 1: float32 [4, 4] on mesh [2]: (S(1)) -> (R)"));
  }
}

TEST_CASE("ranks passing different global extents with the same byte count are caught", "[hardening][layouts]") {
  auto out = outcomes(2, [](CommPtr w) {
    DeviceMesh<"tp"> mesh(w, {2});
    check_on(mesh);
    // 4 x 4 and 2 x 8: each rank's piece is 8 elements, so the all_gather sizes agree.
    const Shape<2> global = w->rank() == 0 ? Shape<2>{4, 4} : Shape<2>{2, 8};
    auto x = distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(global));
    (void)full_tensor(x);
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("rank 0: float32 [4, 4]") && Contains("rank 1: float32 [2, 8]"));
  }
}

TEST_CASE("ranks redistributing to different targets on a 2-D mesh are named by world rank", "[hardening][layouts]") {
  auto out = outcomes(4, [](CommPtr w) {
    DeviceMesh<"dp", "tp"> mesh(w, {2, 2});
    check_on(mesh);
    auto x = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, arange<double>(Shape<2>{5, 3}));
    if (w->rank() == 3) (void)redistribute<Layout<Replicate, Shard<0>>>(x);
    else (void)redistribute<Layout<Replicate, Shard<1>>>(x);
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("redistribute[dp*tp]") && Contains("rank 3: float64 [5, 3] on mesh [2, 2]: (S(0), S(1)) -> (R, S(0))") &&
                              Contains("rank 0: float64 [5, 3] on mesh [2, 2]: (S(0), S(1)) -> (R, S(1))"));
  }
}

TEST_CASE("ranks that agree redistribute correctly with the check on (uneven, smaller than the mesh)",
          "[hardening][layouts]") {
  auto out = outcomes(4, [](CommPtr w) {
    DeviceMesh<"dp", "tp"> mesh(w, {2, 2});
    check_on(mesh);
    for (const Shape<2> global : {Shape<2>{5, 3}, Shape<2>{1, 1}, Shape<2>{0, 3}}) {
      const auto full = arange<float>(global);
      auto x = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, full);
      const auto back = full_tensor(redistribute<Layout<Shard<1>, Replicate>>(x));
      if (!(back.shape() == full.shape()) || !std::equal(back.span().begin(), back.span().end(), full.span().begin()))
        throw std::runtime_error("round trip of " + to_string(global) + " differs");
    }
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK_FALSE(r.threw);
  }
}

// The always-on check (Communicator::set_verify_every; on in every build, here with the full
// check off as in a Release build): the same disagreements become an Error on every rank
// within 16 calls, naming the first call that differed — they computed on silently before.
namespace {
template <class Mesh>
void full_check_off(const Mesh& mesh, bool agree_before_data = false) {
  for (std::size_t lo = 0; lo < Mesh::ndim; ++lo)
    for (std::size_t hi = lo; hi < Mesh::ndim; ++hi) {
      mesh.group(lo, hi).set_check_collectives(false);
      mesh.group(lo, hi).set_agree_before_data(agree_before_data);  // off here: the window is what is tested
    }
}
}  // namespace

TEST_CASE("with the full check off, the always-on check catches layouts and extents within 16 calls",
          "[hardening][layouts][always-on]") {
  const Stopwatch clock;
  auto out = outcomes(2, [](CommPtr w) {
    w->set_timeout(long_timeout);
    DeviceMesh<"tp"> mesh(w, {2});
    full_check_off(mesh);
    // The default, in every build type (a throw, not a Catch assertion: Catch is not thread-safe).
    if (mesh.comm().verify_every() != 16) throw std::logic_error("verify_every is not 16 by default");
    const auto full = arange<float>(Shape<2>{4, 4});
    for (int i = 0; i < 16; ++i) {  // one call of rank 1 differs; it is found within 16
      if (w->rank() == 1 && i == 5) (void)full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
      else (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, full));
    }
  });
  CHECK(clock.elapsed() < prompt);
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("[tp]") && Contains("always-on check") && Contains("call #11 of group 'tp'") &&
                              Contains("rank 0: float32 [4, 4] on mesh [2]: (S(0)) -> (R)") &&
                              Contains("rank 1: float32 [4, 4] on mesh [2]: (S(1)) -> (R)"));
  }
  // Same byte count, different extents. The threads backend carries the check in every
  // collective's rendezvous (Communicator::carries_verify): found at the redistribution's own
  // all-gather, before its data moves — the output is never written.
  out = outcomes(2, [](CommPtr w) {
    w->set_timeout(long_timeout);
    DeviceMesh<"tp"> mesh(w, {2});
    full_check_off(mesh);
    const Shape<2> global = w->rank() == 0 ? Shape<2>{4, 4} : Shape<2>{2, 8};
    (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(global)));
    mesh.comm().barrier();
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("all_gather[tp]") && Contains("always-on check") && Contains("call #1 of group 'tp'") &&
                              Contains("rank 0: float32 [4, 4]") && Contains("rank 1: float32 [2, 8]"));
  }
  // Agreements that no collective follows: compared at the next barrier's rendezvous, or by an
  // all-gather of their own once 16 are pending (the first difference stays in the window).
  out = outcomes(2, [](CommPtr w) {
    w->set_timeout(long_timeout);
    DeviceMesh<"tp"> mesh(w, {2});
    full_check_off(mesh);
    mesh.comm().check_agreement("save", w->rank() == 0 ? "dir-a" : "dir-b");
    mesh.comm().barrier();
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("barrier[tp]") && Contains("call #1 of group 'tp'") && Contains("dir-a") &&
                              Contains("dir-b"));
  }
  out = outcomes(2, [](CommPtr w) {
    w->set_timeout(long_timeout);
    DeviceMesh<"tp"> mesh(w, {2});
    full_check_off(mesh);
    for (int i = 0; i < 20; ++i) mesh.comm().check_agreement("save", w->rank() == 1 && i == 3 ? "other" : "same");
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    CHECK_THAT(r.message, Contains("save[tp]") && Contains("always-on check") && Contains("call #4 of group 'tp'") &&
                              Contains("other"));
  }
  // Ranks in step: no error, whatever the number of calls; 0 turns it off; out of range is an Error.
  for (const auto& r : outcomes(2, [](CommPtr w) {
         DeviceMesh<"tp"> mesh(w, {2});
         full_check_off(mesh);
         const auto full = arange<float>(Shape<2>{3, 5});
         for (int i = 0; i < 40; ++i)
           if (i % 2) (void)full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
           else (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, full));
         mesh.comm().barrier();
         mesh.comm().set_verify_every(0);
         mesh.comm().set_verify_every(16);
         mesh.comm().set_verify_every(17);
       })) {
    INFO(r.message);
    CHECK_THAT(r.message, Contains("set_verify_every[tp]") && Contains("17 is not in 0 .. 16"));
  }
}

// Agreement before data (Communicator::agrees_before_data; on by default in every build type):
// with only the Release defaults (the full check off, as NDEBUG leaves it, and the always-on
// check off too, so that nothing else can catch them), the first-round cases of ranks that
// disagree end in an Error on every rank at the first collective, before any data moves: the
// output buffers hold what they held. This program is compiled with NDEBUG (tests/CMakeLists.txt).
namespace {
template <class Mesh>
void release_defaults_only(const Mesh& mesh) {
  for (std::size_t lo = 0; lo < Mesh::ndim; ++lo)
    for (std::size_t hi = lo; hi < Mesh::ndim; ++hi) {
      Communicator& g = mesh.group(lo, hi);
      if (!g.agrees_before_data()) throw std::logic_error("agreement before data is not on by default");
      g.set_check_collectives(false);
      g.set_verify_every(0);
    }
}
void release_defaults_only(Communicator& w) {
  if (!w.agrees_before_data()) throw std::logic_error("agreement before data is not on by default");
  w.set_check_collectives(false);
  w.set_verify_every(0);
}
void expect_errors(const std::vector<Outcome>& out, const std::vector<std::string>& parts) {
  for (const auto& r : out) {
    INFO(r.message);
    CHECK(r.is_error);
    for (const auto& p : parts) CHECK_THAT(r.message, Contains(p));
  }
}
}  // namespace

TEST_CASE("Release defaults: ranks that disagree fail at the first collective, before data moves",
          "[hardening][layouts][agreement-before-data]") {
#ifndef NDEBUG
  WARN("test_hardening is meant to be built with NDEBUG (a Release build of the library's checks)");
#endif
  const Stopwatch clock;
  // 1. Different layouts of the same tensor: one full_tensor, caught at its all_gather.
  expect_errors(outcomes(2, [](CommPtr w) {
                  w->set_timeout(long_timeout);
                  DeviceMesh<"tp"> mesh(w, {2});
                  release_defaults_only(mesh);
                  const auto full = arange<float>(Shape<2>{4, 4});
                  if (w->rank() == 0) (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, full));
                  else (void)full_tensor(distribute_replicated<Layout<Shard<1>>>(mesh, full));
                }),
                {"all_gather[tp]", "ranks passed different arguments to collective #",
                 "rank 0: all_gather(8 x float32) in redistribute float32 [4, 4] on mesh [2]: (S(0)) -> (R)",
                 "rank 1: all_gather(8 x float32) in redistribute float32 [4, 4] on mesh [2]: (S(1)) -> (R)"});
  // 2. Different global extents, the same byte count (4 x 4 and 2 x 8 sharded over 2: 8 each).
  expect_errors(outcomes(2, [](CommPtr w) {
                  DeviceMesh<"tp"> mesh(w, {2});
                  release_defaults_only(mesh);
                  const Shape<2> global = w->rank() == 0 ? Shape<2>{4, 4} : Shape<2>{2, 8};
                  (void)full_tensor(distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(global)));
                }),
                {"in redistribute float32 [4, 4]", "in redistribute float32 [2, 8]"});
  // 3. Different targets on a 2-D mesh (equal byte counts on the tp all-to-all).
  expect_errors(outcomes(4, [](CommPtr w) {
                  DeviceMesh<"dp", "tp"> mesh(w, {2, 2});
                  release_defaults_only(mesh);
                  auto x = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, arange<double>(Shape<2>{4, 4}));
                  if (w->rank() == 3) (void)full_tensor(redistribute<Layout<Replicate, Shard<0>>>(x));
                  else (void)full_tensor(redistribute<Layout<Replicate, Shard<1>>>(x));
                }),
                {"(S(0), S(1)) -> (R, S(0))", "(S(0), S(1)) -> (R, S(1))"});
  // 4-6. Different collectives, element types, reduce operations: nothing reaches the outputs.
  auto untouched = [](CommPtr w, auto&& call) {
    release_defaults_only(*w);
    std::vector<float> buf(8, 7.0f);
    try {
      call(*w, buf);
    } catch (...) {
      for (float v : buf)
        if (v != 7.0f) throw std::logic_error("the output changed before the error: data moved");
      throw;
    }
  };
  expect_errors(outcomes(2, [&](CommPtr w) {
                  untouched(w, [](Communicator& c, std::vector<float>& b) {
                    c.all_reduce(std::span<float>(b), c.rank() == 0 ? ReduceOp::sum : ReduceOp::max);
                  });
                }),
                {"all_reduce[world]", "rank 0: all_reduce(8 x float32, sum)", "rank 1: all_reduce(8 x float32, max)"});
  expect_errors(outcomes(2, [&](CommPtr w) {
                  untouched(w, [](Communicator& c, std::vector<float>& b) {
                    if (c.rank() == 0) {
                      c.all_reduce(std::span<float>(b), ReduceOp::sum);
                    } else {
                      std::vector<double> d(4, 7.0);  // the same 32 bytes
                      c.all_reduce(std::span<double>(d), ReduceOp::sum);
                    }
                  });
                }),
                {"rank 0: all_reduce(8 x float32, sum)", "rank 1: all_reduce(4 x float64, sum)"});
  expect_errors(outcomes(2, [&](CommPtr w) {
                  untouched(w, [](Communicator& c, std::vector<float>& b) {
                    if (c.rank() == 0) {
                      c.all_reduce(std::span<float>(b), ReduceOp::sum);
                    } else {
                      std::vector<float> r(16);
                      c.all_gather(std::span<const float>(b), std::span<float>(r));
                    }
                  });
                }),
                {"rank 0: all_reduce(8 x float32, sum)", "rank 1: all_gather(8 x float32)"});
  CHECK(clock.elapsed() < prompt);
  // Ranks that agree: exact results, uneven extents, with only agreement before data on.
  for (const auto& r : outcomes(4, [](CommPtr w) {
         DeviceMesh<"dp", "tp"> mesh(w, {2, 2});
         release_defaults_only(mesh);
         for (const Shape<2> global : {Shape<2>{5, 3}, Shape<2>{1, 1}}) {
           const auto full = arange<float>(global);
           auto x = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, full);
           const auto back = full_tensor(redistribute<Layout<Shard<1>, Replicate>>(x));
           if (!std::equal(back.span().begin(), back.span().end(), full.span().begin()))
             throw std::runtime_error("round trip of " + to_string(global) + " differs");
         }
       })) {
    INFO(r.message);
    CHECK_FALSE(r.threw);
  }
}

}  // namespace hardening_layouts
