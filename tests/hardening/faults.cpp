// Faults on the threads backend: a rank that leaves its function (returns or throws) while
// others wait for it releases them at once, with an Error naming it and the operation they wait
// in; an operation still pending on a rank that has left is not mistaken for a departure; a
// rank that is alive but stuck still fails at the timeout; a run that cannot start is an Error.
// An offload scratch file leaves nothing on disk, even when its process is killed.
#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "dtensor/comm/threads.hpp"
#include "dtensor/core/scratch_file.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_faults {

using namespace dtensor;
using namespace dtensor::hardening;
using namespace std::chrono_literals;
using Catch::Contains;

TEST_CASE("a rank that returns early releases the ranks waiting in a collective", "[hardening][faults]") {
  const Stopwatch clock;
  auto out = outcomes(4, [](CommPtr w) {
    w->set_timeout(long_timeout);
    if (w->rank() == 2) return;  // never calls the all_reduce
    std::vector<float> x(8, 1.0f);
    w->all_reduce(std::span<float>(x), ReduceOp::sum);
  });
  CHECK(clock.elapsed() < prompt);
  CHECK_FALSE(out[2].threw);
  for (int r : {0, 1, 3}) {
    INFO(out[std::size_t(r)].message);
    CHECK(out[std::size_t(r)].is_error);
    CHECK_THAT(out[std::size_t(r)].message, Contains("all_reduce[world]") && Contains("on rank " + std::to_string(r)));
    CHECK_THAT(out[std::size_t(r)].message, Contains("rank 2 returned from the function given to threads::run"));
  }
  // run() reports it too, with the same names.
  CHECK_THROWS_WITH(threads::run(3,
                                 [](CommPtr w) {
                                   w->set_timeout(long_timeout);
                                   if (w->rank() != 0) w->barrier();
                                 }),
                    Contains("barrier[world]") && Contains("rank 0 returned"));
}

TEST_CASE("a rank that returns after some collectives releases the others in the next one", "[hardening][faults]") {
  const Stopwatch clock;
  auto out = outcomes(3, [](CommPtr w) {
    w->set_timeout(long_timeout);
    std::vector<double> x(4, 1.0);
    w->all_reduce(std::span<double>(x), ReduceOp::sum);
    if (w->rank() == 1) return;  // skips the second collective
    std::vector<double> all(12);
    w->all_gather(std::span<const double>(x), std::span<double>(all));
  });
  CHECK(clock.elapsed() < prompt);
  for (int r : {0, 2}) {
    INFO(out[std::size_t(r)].message);
    CHECK(out[std::size_t(r)].is_error);
    CHECK_THAT(out[std::size_t(r)].message, Contains("all_gather[world]") && Contains("rank 1 returned"));
  }
}

TEST_CASE("in a sub-group, the departed rank is named by group rank, world rank and group", "[hardening][faults]") {
  const Stopwatch clock;
  auto out = outcomes(6, [](CommPtr w) {
    w->set_timeout(long_timeout);
    CommPtr sub = w->split(w->rank() % 2, w->rank());  // {0,2,4}, {1,3,5}
    sub->set_label("dp");
    if (w->rank() == 3) return;  // group rank 1 of {1,3,5}
    if (w->rank() % 2 == 1) sub->barrier();
  });
  CHECK(clock.elapsed() < prompt);
  for (int r : {1, 5}) {
    INFO(out[std::size_t(r)].message);
    CHECK(out[std::size_t(r)].is_error);
    CHECK_THAT(out[std::size_t(r)].message,
               Contains("barrier[dp]") && Contains("rank 1 (world rank 3) returned") && Contains("group 'dp'"));
  }
  for (int r : {0, 2, 3, 4}) CHECK_FALSE(out[std::size_t(r)].threw);
}

TEST_CASE("an unmatched recv or send fails as soon as its peer has returned", "[hardening][faults]") {
  SECTION("recv from a rank that returns without sending") {
    const Stopwatch clock;
    auto out = outcomes(2, [](CommPtr w) {
      w->set_timeout(long_timeout);
      std::vector<float> x(4);
      if (w->rank() == 0) w->recv(std::span<float>(x), 1, 5);
    });
    CHECK(clock.elapsed() < prompt);
    INFO(out[0].message);
    CHECK(out[0].is_error);
    CHECK_THAT(out[0].message, Contains("recv[world]") && Contains("rank 1 returned") &&
                                   Contains("without sending this message (4 x float32, tag 5"));
    CHECK_FALSE(out[1].threw);
  }
  SECTION("send to a rank that returns without receiving") {
    const Stopwatch clock;
    auto out = outcomes(2, [](CommPtr w) {
      w->set_timeout(long_timeout);
      std::vector<std::int32_t> x(3);
      if (w->rank() == 1) w->send(std::span<const std::int32_t>(x), 0, 7);
    });
    CHECK(clock.elapsed() < prompt);
    INFO(out[1].message);
    CHECK(out[1].is_error);
    CHECK_THAT(out[1].message, Contains("send[world]") && Contains("rank 0 returned") &&
                                   Contains("without receiving this message (3 x int32, tag 7"));
  }
}

TEST_CASE("a rank that throws releases the others with its message", "[hardening][faults]") {
  const Stopwatch clock;
  auto out = outcomes(3, [](CommPtr w) {
    w->set_timeout(long_timeout);
    if (w->rank() == 0) throw std::runtime_error("out of memory in rank 0");
    std::vector<float> x(3 * 2), y(2);
    w->reduce_scatter(std::span<const float>(x), std::span<float>(y), ReduceOp::max);
  });
  CHECK(clock.elapsed() < prompt);
  for (int r : {1, 2}) {
    INFO(out[std::size_t(r)].message);
    CHECK(out[std::size_t(r)].is_error);
    CHECK_THAT(out[std::size_t(r)].message, Contains("reduce_scatter[world]") && Contains("rank 0") &&
                                                Contains("out of memory in rank 0"));
  }
}

TEST_CASE("an asynchronous operation still pending on a rank that has returned completes", "[hardening][faults]") {
  // Rank 0 starts an all_reduce and returns without waiting; its buffers outlive the run. The
  // pending operation still arrives, so rank 1 (which comes late) must get the right sum.
  auto sent = std::make_shared<std::vector<float>>(5, 2.0f);
  auto got = std::make_shared<std::vector<float>>(5, 0.0f);
  std::vector<float> late(5, 3.0f);
  auto out = outcomes(2, [&](CommPtr w) {
    w->set_timeout(long_timeout);
    if (w->rank() == 0) {
      (void)w->all_reduce_async(std::span<const float>(*sent), std::span<float>(*got), ReduceOp::sum);
      return;
    }
    std::this_thread::sleep_for(50ms);  // rank 0 has long returned
    w->all_reduce(std::span<float>(late), ReduceOp::sum);
  });
  CHECK_FALSE(out[0].threw);
  INFO(out[1].message);
  CHECK_FALSE(out[1].threw);
  CHECK(late == std::vector<float>(5, 5.0f));
  CHECK(*got == std::vector<float>(5, 5.0f));
}

TEST_CASE("a rank that is alive but never arrives still fails at the timeout", "[hardening][faults]") {
  const Stopwatch clock;
  auto out = outcomes(3, [](CommPtr w) {
    w->set_timeout(150ms);
    if (w->rank() == 1) {
      std::this_thread::sleep_for(400ms);  // busy elsewhere, not gone
      return;
    }
    w->barrier();
  });
  CHECK(clock.elapsed() < prompt);
  for (int r : {0, 2}) {
    INFO(out[std::size_t(r)].message);
    CHECK(out[std::size_t(r)].is_error);
    CHECK_THAT(out[std::size_t(r)].message, Contains("barrier[world]") && Contains("rank 1"));
  }
  CHECK_THAT(out[0].message + out[2].message, Contains("timed out after 150 ms"));
}

TEST_CASE("threads::run with more ranks than threads can be started is an Error", "[hardening][faults]") {
  for (int n : {100000, threads::detail::max_ranks + 1}) {
    const auto o = outcome_of_call([&] { threads::run(n, [](CommPtr) {}); });
    INFO(o.message);
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("threads::run") && Contains(std::to_string(n) + " ranks") &&
                              Contains(std::to_string(threads::detail::max_ranks)));
  }
  CHECK_NOTHROW(threads::run(64, [](CommPtr w) { w->barrier(); }));
}

TEST_CASE("an offload scratch file has no name on disk while in use, so a killed process leaves nothing", "[hardening][faults]") {
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor_scratch_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    dtensor::detail::ScratchFile f(dir.string(), "test", 0, "scratch test");
    REQUIRE(f.error().empty());
    REQUIRE(f.reserve(4096, "the test's bytes").empty());
    const std::string data(4096, 'x');
    f.write(data.data(), data.size(), 0);
    std::string back(4096, '\0');
    f.read(back.data(), back.size(), 0);
    CHECK(back == data);
    CHECK(std::filesystem::is_empty(dir));  // the descriptor holds it; no later run can find it
  }
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the offloading process, killed while its file holds data
    dtensor::detail::ScratchFile f(dir.string(), "killed", 0, "scratch test");
    if (f.error().empty() && f.reserve(1 << 20, "bytes").empty()) ::raise(SIGKILL);
    ::_exit(3);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  CHECK(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

}  // namespace hardening_faults
