// Pipeline schedules as data: the action notation, stage layouts, the generators, the send/recv
// pass, the validator's rules, the simulated bubble against the published formulas, the
// activation peaks, tables and CSV.
#include <catch2/catch.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/csv.hpp"
#include "dtensor/parallel/pipeline/table.hpp"
#include "dtensor/parallel/pipeline/simulate.hpp"
#include "dtensor/parallel/pipeline/validate.hpp"

using namespace dtensor;
using namespace dtensor::parallel::pipeline;
using Catch::Contains;

namespace {

const std::vector<int> rank_counts{2, 4, 8};
const std::vector<int> microbatch_counts{4, 8, 16};
const std::vector<ScheduleKind> all_kinds{ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                          ScheduleKind::zero_bubble_h1, ScheduleKind::zero_bubble_v,
                                          ScheduleKind::dual_pipe_v};

const char* name_of(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zero_bubble_h1: return "zb";
    case ScheduleKind::zero_bubble_v: return "zbv";
    case ScheduleKind::dual_pipe_v: return "dualpipev";
  }
  return "?";
}

/// Interleaved 1F1B needs m to be a multiple of p, DualPipeV m >= 2p (as PyTorch's); every other
/// generator takes any m.
bool generator_accepts(ScheduleKind kind, int ranks, int microbatches) {
  if (kind == ScheduleKind::dual_pipe_v) return microbatches >= 2 * ranks;
  return kind != ScheduleKind::interleaved || microbatches % ranks == 0;
}
const char* refusal_of(ScheduleKind kind) {
  return kind == ScheduleKind::dual_pipe_v ? "at least as many micro-batches as stages" : "multiple of p";
}

Schedule from_rows(const StageLayout& layout, int microbatches, const std::string& csv) {
  return read_csv(csv, layout, microbatches);
}

/// Counts the actions of one kind in a schedule.
std::size_t count_kind(const Schedule& schedule, ActionKind kind) {
  std::size_t total = 0;
  for (const auto& list : schedule.actions)
    total += std::size_t(std::count_if(list.begin(), list.end(), [&](const Action& a) { return a.kind == kind; }));
  return total;
}

}  // namespace

TEST_CASE("actions read and write in PyTorch's notation", "[pipeline]") {
  for (const char* text : {"0F0", "1B0", "2W1", "1I0", "0SEND_F0", "1RECV_F0", "3SEND_B12", "12RECV_B34"})
    CHECK(to_string(parse_action(text)) == text);
  const Action a = parse_action("3SEND_B12");
  CHECK(a.stage == 3);
  CHECK(a.kind == ActionKind::send_backward);
  CHECK(a.microbatch == 12);
  CHECK(counterpart(parse_action("0SEND_F3")) == parse_action("1RECV_F3"));
  CHECK(counterpart(parse_action("1RECV_F3")) == parse_action("0SEND_F3"));
  CHECK(counterpart(parse_action("2SEND_B1")) == parse_action("1RECV_B1"));
  CHECK(counterpart(parse_action("1RECV_B1")) == parse_action("2SEND_B1"));
  CHECK_THROWS_WITH(counterpart(parse_action("0F0")), Contains("0F0") && Contains("not a send"));
  for (const char* bad : {"", "F0", "0X0", "0F", "0F0x", "-1F0", "0F-1", "0SEND_F", "0SEND0", " 0F0", "0f0"}) {
    CAPTURE(bad);
    CHECK_FALSE(try_parse_action(bad).has_value());
    CHECK_THROWS_AS(parse_action(bad), Error);
  }
  CHECK_THROWS_WITH(parse_action("0X0"), Contains("'0X0' is not an action"));
}

TEST_CASE("stage layouts: looped and V shape", "[pipeline]") {
  const StageLayout looped = StageLayout::looped(4, 2);
  CHECK(looped.stages() == 8);
  CHECK(looped.rank_of(5) == 1);
  CHECK(looped.stages_of(3) == std::vector<int>{3, 7});
  const StageLayout v = StageLayout::v_shape(4);
  CHECK(v.stages() == 8);
  for (int rank = 0; rank < 4; ++rank) CHECK(v.stages_of(rank) == std::vector<int>{rank, 7 - rank});
  CHECK_THROWS_WITH(StageLayout::looped(0), Contains("at least one rank"));
  CHECK_THROWS_WITH(StageLayout::looped(4, 0), Contains("stages_per_rank = 0"));
  CHECK_THROWS_WITH(looped.rank_of(8), Contains("stage 8"));
  CHECK_THROWS_WITH(v.stages_of(4), Contains("rank 4"));
}

TEST_CASE("every generator validates with blocking and asynchronous sends", "[pipeline]") {
  for (ScheduleKind kind : all_kinds)
    for (int ranks : rank_counts)
      for (int microbatches : microbatch_counts) {
        CAPTURE(name_of(kind), ranks, microbatches);
        if (!generator_accepts(kind, ranks, microbatches)) {
          CHECK_THROWS_WITH(make_schedule(kind, ranks, microbatches), Contains(refusal_of(kind)));
          continue;
        }
        const Schedule schedule = make_schedule(kind, ranks, microbatches);
        for (SendMode sends : {SendMode::blocking, SendMode::asynchronous}) {
          const Inspection result = inspect(schedule, {sends});
          INFO((result.violation ? result.violation->message : std::string("valid")));
          CHECK_FALSE(result.violation.has_value());
        }
        CHECK_NOTHROW(validate(schedule));
        // One message per stage boundary crossed, both ways, per micro-batch.
        const auto boundaries = std::size_t(schedule.layout.stages() - 1) * std::size_t(microbatches);
        std::size_t crossing = 0;
        for (int stage = 0; stage + 1 < schedule.layout.stages(); ++stage)
          crossing += schedule.layout.rank_of(stage) != schedule.layout.rank_of(stage + 1);
        CHECK(count_kind(schedule, ActionKind::send_forward) == crossing * std::size_t(microbatches));
        CHECK(count_kind(schedule, ActionKind::recv_backward) == crossing * std::size_t(microbatches));
        CHECK(count_kind(schedule, ActionKind::forward) == boundaries + std::size_t(microbatches));
      }
}

TEST_CASE("simulated bubble matches the formulas", "[pipeline]") {
  const Costs unit{1, 1, 1};          // F = I = W = 1, so B = 2
  const Costs equal_fb{1, 0.5, 0.5};  // F = B
  for (int ranks : rank_counts)
    for (int microbatches : microbatch_counts) {
      CAPTURE(ranks, microbatches);
      const double p = ranks, m = microbatches;
      const double classic = (p - 1) / (m + p - 1);
      for (const Costs& costs : {unit, equal_fb}) {
        const Timeline g = simulate(gpipe(ranks, microbatches), costs);
        const Timeline o = simulate(one_f_one_b(ranks, microbatches), costs);
        for (int rank = 0; rank < ranks; ++rank) {
          CHECK(g.idle_fraction(rank) == Approx(classic).epsilon(1e-12));
          CHECK(o.idle_fraction(rank) == Approx(classic).epsilon(1e-12));
        }
      }
      if (microbatches % ranks == 0) {
        const double v = 2;
        const Timeline t = simulate(interleaved_1f1b(ranks, microbatches, 2), unit);
        CHECK(t.bubble() == Approx((p - 1) / (v * m + p - 1)).epsilon(1e-12));
      }
      // ZB-H1: with F = I = W every rank idles p - 1 units instead of 1F1B's 3 (p - 1).
      const Timeline h1 = simulate(zero_bubble_h1(ranks, microbatches), unit);
      const Timeline base = simulate(one_f_one_b(ranks, microbatches), unit);
      const double idle_h1 = h1.makespan - h1.busy(0), idle_1f1b = base.makespan - base.busy(0);
      CHECK(h1.bubble() < base.bubble());
      if (microbatches >= ranks) {
        CHECK(idle_h1 / idle_1f1b == Approx(1.0 / 3).epsilon(0.05));
        CHECK(h1.bubble() == Approx((p - 1) / (3 * m + p - 1)).epsilon(1e-12));
      }
      // ZB-V: with F = I = W and m >= 2p only the fill of the V is idle: p - 1 of 6m + p - 1.
      const Timeline zv = simulate(zero_bubble_v(ranks, microbatches), unit);
      CHECK(zv.bubble() <= h1.bubble());
      if (microbatches >= 2 * ranks) {
        CHECK(zv.bubble() < h1.bubble());
        CHECK(zv.bubble() == Approx((p - 1) / (6 * m + p - 1)).epsilon(0.05));
        CHECK(zv.bubble() < 0.07);
      }
    }
}

TEST_CASE("the validator counts in-flight activations: known peaks", "[pipeline]") {
  for (int ranks : rank_counts)
    for (int microbatches : microbatch_counts) {
      CAPTURE(ranks, microbatches);
      const MemoryReport gp = validate(gpipe(ranks, microbatches));
      const MemoryReport of = validate(one_f_one_b(ranks, microbatches));
      const MemoryReport h1 = validate(zero_bubble_h1(ranks, microbatches));
      for (int rank = 0; rank < ranks; ++rank) {
        const auto r = std::size_t(rank);
        CHECK(gp.peak_saved[r] == microbatches);
        CHECK(of.peak_saved[r] == std::min(ranks - rank, microbatches));
        CHECK(h1.peak_saved[r] == std::min(ranks - rank, microbatches));  // 1F1B's activations
        CHECK(h1.peak_weight_pending[r] <= rank + 1);                       // plus the postponed W's
        CHECK(gp.peak_weight_pending[r] == 0);
      }
      if (microbatches % ranks == 0) {
        const int v = 2;
        const MemoryReport il = validate(interleaved_1f1b(ranks, microbatches, v));
        for (int rank = 0; rank < ranks; ++rank)
          CHECK(il.peak_saved[std::size_t(rank)] ==
                std::min(2 * (ranks - 1 - rank) + (v - 1) * ranks + 1, v * microbatches));
      }
      if (microbatches >= 2 * ranks) {
        const MemoryReport zv = validate(zero_bubble_v(ranks, microbatches));
        // 2p chunk activations: as much as 1F1B's p whole stages on its first rank.
        for (int rank = 0; rank < ranks; ++rank) CHECK(zv.peak_saved[std::size_t(rank)] == 2 * ranks);
      }
    }
  // The profile step by step: GPipe on 2 ranks holds 1, 2 after its forwards, then releases.
  const MemoryReport two = validate(gpipe(2, 2));
  const Schedule schedule = gpipe(2, 2);
  for (std::size_t step = 0; step < schedule.actions[0].size(); ++step) {
    const auto& list = schedule.actions[0];
    const auto forwards = std::count_if(list.begin(), list.begin() + std::ptrdiff_t(step) + 1,
                                        [](const Action& a) { return a.kind == ActionKind::forward; });
    const auto backwards = std::count_if(list.begin(), list.begin() + std::ptrdiff_t(step) + 1,
                                         [](const Action& a) { return a.kind == ActionKind::backward; });
    CHECK(two.saved[0][step] == forwards - backwards);
  }
}

TEST_CASE("broken schedules are rejected with the rule, position and action", "[pipeline]") {
  const StageLayout two = StageLayout::looped(2);
  auto violation = [](const Schedule& s, SendMode sends = SendMode::blocking) {
    auto result = inspect(s, {sends});
    REQUIRE(result.violation.has_value());
    return *result.violation;
  };
  // The valid base: 2 ranks, 1 micro-batch.
  REQUIRE_NOTHROW(validate(from_rows(two, 1, "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n")));

  SECTION("a B before its F") {
    const Violation v = violation(from_rows(two, 1, "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1B0,1F0,1SEND_B0\n"));
    CHECK(v.rule == "order");
    CHECK(v.rank == 1);
    CHECK(v.step == 1);
    CHECK(v.action == "1B0");
    CHECK_THAT(v.message, Contains("1B0") && Contains("before its forward 1F0") && Contains("rank 1 at step 1"));
    CHECK_THROWS_WITH(validate(from_rows(two, 1, "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1B0,1F0,1SEND_B0\n")),
                      Contains("pipeline::validate") && Contains("1B0"));
  }
  SECTION("a missing send") {
    const Violation v = violation(from_rows(two, 1, "0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"));
    CHECK(v.rule == "matching");
    CHECK(v.rank == 1);
    CHECK(v.action == "1RECV_F0");
    CHECK_THAT(v.message, Contains("no matching send 0SEND_F0 on rank 0"));
  }
  SECTION("a receive cycle deadlocks with either kind of send") {
    // Rank 0 computes 0B0 before sending 0F0's output; rank 1 needs that output for 1F0, before
    // it can send the gradient 0B0 waits for.
    const Schedule cycle = from_rows(two, 1, "0F0,0RECV_B0,0B0,0SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
    for (SendMode sends : {SendMode::blocking, SendMode::asynchronous}) {
      const Violation v = violation(cycle, sends);
      CHECK(v.rule == "deadlock");
      CHECK(v.action == "0B0");
      CHECK_THAT(v.message, Contains("0B0 waits for rank 1 to run 1SEND_B0") &&
                                Contains("1F0 waits for rank 0 to run 0SEND_F0"));
    }
  }
  SECTION("blocking sends that meet in the wrong order deadlock; asynchronous ones do not") {
    const Schedule crossed = from_rows(two, 2,
                                       "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                                       "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
    const Violation v = violation(crossed, SendMode::blocking);
    CHECK(v.rule == "deadlock");
    CHECK(v.action == "0SEND_F1");
    CHECK_THAT(v.message, Contains("blocking") && Contains("waits for rank 1 to post 1RECV_F1"));
    CHECK_FALSE(inspect(crossed, {SendMode::asynchronous}).violation.has_value());
  }
  SECTION("a W before its I") {
    const StageLayout one = StageLayout::looped(1);
    const Violation v = violation(from_rows(one, 1, "0F0,0W0,0I0\n"));
    CHECK(v.rule == "order");
    CHECK(v.action == "0W0");
    CHECK_THAT(v.message, Contains("weight gradient runs before its input gradient 0I0"));
  }
  SECTION("actions computed twice, missing, or on the wrong rank") {
    const StageLayout one = StageLayout::looped(1);
    CHECK(violation(from_rows(one, 1, "0F0,0B0,0F0\n")).rule == "once");
    CHECK(violation(from_rows(one, 1, "0F0,0I0,0B0\n")).rule == "once");
    CHECK(violation(from_rows(one, 1, "0F0,0B0,0W0\n")).rule == "once");
    const Violation missing_w = violation(from_rows(one, 1, "0F0,0I0\n"));
    CHECK(missing_w.rule == "complete");
    CHECK(missing_w.action == "0W0");
    CHECK(missing_w.step == -1);
    CHECK(violation(from_rows(one, 2, "0F0,0B0\n")).action == "0F1");
    const Violation foreign = violation(from_rows(two, 1, "1F0\n\n"));
    CHECK(foreign.rule == "action");
    CHECK_THAT(foreign.message, Contains("stage 1 is held by rank 1"));
    CHECK_THAT(violation(from_rows(one, 1, "0F3\n")).message, Contains("micro-batch 3 is not in [0, 1)"));
    CHECK_THAT(violation(from_rows(one, 1, "0F0,0SEND_F0\n")).message, Contains("no stage 1"));
    // In the V shape stages 1 and 2 share rank 1: a message between them is an error.
    const Violation local = violation(from_rows(StageLayout::v_shape(2), 1, "\n2RECV_F0\n"));
    CHECK_THAT(local.message, Contains("same rank"));
  }
  SECTION("a generated schedule with one action taken out") {
    Schedule s = zero_bubble_h1(4, 8);
    auto& list = s.actions[2];
    const auto w = std::find(list.begin(), list.end(), parse_action("2W3"));
    REQUIRE(w != list.end());
    list.erase(w);
    const Violation v = violation(s);
    CHECK(v.rule == "complete");
    CHECK(v.action == "2W3");
    CHECK(v.rank == 2);
  }
}

TEST_CASE("the send/recv pass places messages and rejects impossible orders", "[pipeline]") {
  const StageLayout two = StageLayout::looped(2);
  const Schedule s = add_send_recv(two, 1, {{parse_action("0F0"), parse_action("0B0")},
                                            {parse_action("1F0"), parse_action("1B0")}});
  CHECK(write_csv(s) == "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  // In the V shape the turn at the last rank is local: no message between stages p - 1 and p.
  const Schedule v = zero_bubble_v(2, 4);
  for (const auto& list : v.actions)
    for (const Action& a : list)
      if (!is_compute(a.kind)) CHECK(((a.stage == 0 || a.stage == 3) || (a.stage == 1 && a.kind == ActionKind::recv_forward) ||
                                      (a.stage == 1 && a.kind == ActionKind::send_backward) ||
                                      (a.stage == 2 && a.kind == ActionKind::send_forward) ||
                                      (a.stage == 2 && a.kind == ActionKind::recv_backward)));
  CHECK_THROWS_WITH(add_send_recv(two, 1, {{parse_action("0B0"), parse_action("0F0")}, {parse_action("1F0"), parse_action("1B0")}}),
                    Contains("can never run") && Contains("rank 0 step 0 0B0 waits for 0F0"));
  CHECK_THROWS_WITH(add_send_recv(two, 1, {{parse_action("0SEND_F0")}, {}}), Contains("0SEND_F0 is a message"));
  CHECK_THROWS_WITH(add_send_recv(two, 1, {{parse_action("1F0")}, {}}), Contains("stage 1 is not held by this rank"));
  CHECK_THROWS_WITH(add_send_recv(two, 1, {{}}), Contains("compute orders for 1 ranks"));
}

TEST_CASE("CSV round-trips and rejects unknown actions", "[pipeline]") {
  for (ScheduleKind kind : all_kinds) {
    CAPTURE(name_of(kind));
    const Schedule s = make_schedule(kind, 4, 8);
    const std::string text = write_csv(s);
    CHECK(read_csv(text, s.layout, s.microbatches) == s);
    std::istringstream in(text);
    CHECK(read_csv(in, s.layout, s.microbatches) == s);
  }
  // PyTorch writes idle slots as empty cells; spaces and CRLF line ends are tolerated.
  const Schedule spaced = read_csv(" 0F0 ,, 0SEND_F0,0RECV_B0,0B0\r\n,1RECV_F0,1F0,1B0,1SEND_B0\r\n",
                                   StageLayout::looped(2), 1);
  CHECK(spaced == read_csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", StageLayout::looped(2), 1));
  CHECK_THROWS_WITH(read_csv("0F0,0B0\n1RECV_F0,1F0,0X1,1B0\n", StageLayout::looped(2), 1),
                    Contains("pipeline::read_csv") && Contains("row 2 (rank 1), column 3: '0X1'"));
  CHECK_THROWS_WITH(read_csv("0F0,0B0\n", StageLayout::looped(2), 1), Contains("1 rows, one per rank is 2"));
  CHECK_THROWS_WITH(read_csv("0F0\n", StageLayout::looped(1), 0), Contains("at least one micro-batch"));
}

TEST_CASE("CSV: PyTorch's compute-only and OVERLAP_F_B cells", "[pipeline]") {
  for (ScheduleKind kind : all_kinds) {
    CAPTURE(name_of(kind));
    const Schedule s = make_schedule(kind, 4, 8);
    // The computations alone, as PyTorch's compute CSVs list them; every F directly followed by
    // a B (or I) written as one overlapped cell, as its DualPipeV CSVs do.
    std::string text;
    std::size_t overlapped = 0;
    for (const auto& list : s.actions) {
      std::vector<Action> compute;
      for (const Action& a : list)
        if (is_compute(a.kind)) compute.push_back(a);
      for (std::size_t i = 0; i < compute.size(); ++i) {
        text += i ? "," : "";
        if (i + 1 < compute.size() && compute[i].kind == ActionKind::forward && makes_input_gradient(compute[i + 1].kind)) {
          text += "(" + to_string(compute[i]) + ";" + to_string(compute[i + 1]) + ")OVERLAP_F_B";
          ++overlapped, ++i;
        } else {
          text += to_string(compute[i]);
        }
      }
      text += "\n";
    }
    CHECK(overlapped > 0);
    const Schedule as_written = read_csv(text, s.layout, s.microbatches);
    CHECK(is_compute_only(as_written));  // not runnable as it is: says so
    CHECK_FALSE(is_compute_only(s));
    // The communication added on request: the generator's schedule (its sends and receives come
    // from the same add_send_recv), valid.
    const Schedule runnable = read_csv(text, s.layout, s.microbatches, {.add_send_recv = true});
    CHECK(runnable == s);
    CHECK_NOTHROW(validate(runnable));
  }
  const auto two = StageLayout::looped(2);
  CHECK_FALSE(is_compute_only(read_csv("0F0,0B0\n", StageLayout::looped(1), 1)));  // one rank needs none
  CHECK_THROWS_WITH(read_csv("(0F0;0B0)OVERLAP_B_F\n1F0\n", two, 1),
                    Contains("row 1 (rank 0), column 1") && Contains("the action kind OVERLAP_B_F is not supported"));
  CHECK_THROWS_WITH(read_csv("(0F0;0X0)OVERLAP_F_B\n1F0\n", two, 1), Contains("'(0F0;0X0)OVERLAP_F_B' is not an action"));
  CHECK_THROWS_WITH(read_csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", two, 1, {.add_send_recv = true}),
                    Contains("has its own communication (0SEND_F0 on rank 0)"));
}

TEST_CASE("tables by step and by simulated time", "[pipeline]") {
  const Schedule s = gpipe(2, 2);
  const std::string steps = format_table(s);
  CHECK_THAT(steps, Contains("rank 0 0F0") && Contains("rank 1 1RECV_F0"));
  // GPipe on 2 ranks, F = 1 and B = 2: rank 1 starts one unit late, rank 0's backwards wait for
  // rank 1's (worked out by hand).
  CHECK(format_timeline(simulate(s)) ==
        "time   0   1   2   3   4   5   6   7   8\n"
        "rank 0 0F0 0F1             0B0 0B0 0B1 0B1\n"
        "rank 1     1F0 1F1 1B0 1B0 1B1 1B1\n");
  CHECK_THROWS_WITH(format_timeline(simulate(s, {0.5, 1, 1})), Contains("whole-unit costs"));
}

TEST_CASE("schedules by name and bad input", "[pipeline]") {
  CHECK(parse_schedule_kind("gpipe") == ScheduleKind::gpipe);
  CHECK(parse_schedule_kind("1f1b") == ScheduleKind::one_f_one_b);
  CHECK(parse_schedule_kind("interleaved") == ScheduleKind::interleaved);
  CHECK(parse_schedule_kind("zb") == ScheduleKind::zero_bubble_h1);
  CHECK(parse_schedule_kind("zbv") == ScheduleKind::zero_bubble_v);
  CHECK_THROWS_WITH(parse_schedule_kind("dualpipe"), Contains("unknown schedule 'dualpipe'"));
  CHECK(make_schedule(ScheduleKind::interleaved, 2, 4).layout == StageLayout::looped(2, 2));
  CHECK(make_schedule(ScheduleKind::interleaved, 2, 4, 1) == one_f_one_b(2, 4));
  CHECK(make_schedule(ScheduleKind::zero_bubble_v, 2, 4).layout == StageLayout::v_shape(2));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::one_f_one_b, 2, 4, 2), Contains("stages_per_rank = 2"));
  CHECK_THROWS_WITH(interleaved_1f1b(4, 8, 0), Contains("v = 0"));
  CHECK_THROWS_WITH(interleaved_1f1b(4, 6, 2), Contains("m = 6 must be a multiple of p = 4"));
  CHECK_THROWS_WITH(interleaved_1f1b(8, 4, 2), Contains("m = 4 must be a multiple of p = 8"));
  CHECK_THROWS_WITH(gpipe(0, 4), Contains("pipeline::gpipe") && Contains("at least one rank"));
  CHECK_THROWS_WITH(one_f_one_b(2, 0), Contains("at least one micro-batch"));
  CHECK_THROWS_WITH(zero_bubble_v(0, 4), Contains("at least one rank"));
  CHECK_THROWS_WITH(zero_bubble_h1(2, -1), Contains("at least one micro-batch"));
  Schedule wrong_ranks = gpipe(2, 2);
  wrong_ranks.actions.pop_back();
  CHECK_THROWS_WITH(validate(wrong_ranks), Contains("action lists for 1 ranks"));
}

namespace {
// PyTorch's golden DualPipeV order, 4 ranks x 10 micro-batches, as ScheduleDualPipeV writes it
// (test/distributed/pipelining/artifacts/dualpipev_4rank_10mb.csv): computations only, each
// forward overlapped with another micro-batch's backward as one OVERLAP_F_B cell.
constexpr const char* pytorch_dualpipev_4rank_10mb =
    "0F0,0F1,0F2,0F3,0F4,0F5,0F6,7F0,7I0,7W0,7F1,7I1,7W1,7F2,7I2,7W2,7F3,(0F7;7B3)OVERLAP_F_B,(7F4;0B0)OVERLAP_F_B,"
    "(0F8;7B4)OVERLAP_F_B,(7F5;0B1)OVERLAP_F_B,(0F9;7B5)OVERLAP_F_B,(7F6;0B2)OVERLAP_F_B,7B6,(7F7;0B3)OVERLAP_F_B,7B7,"
    "(7F8;0B4)OVERLAP_F_B,7B8,(7F9;0B5)OVERLAP_F_B,7B9,0I6,0W6,0I7,0W7,0I8,0W8,0I9,0W9\n"
    "1F0,1F1,1F2,1F3,1F4,6F0,1F5,6F1,6I0,6W0,6F2,6I1,6W1,6F3,(1F6;6B2)OVERLAP_F_B,(6F4;1B0)OVERLAP_F_B,"
    "(1F7;6B3)OVERLAP_F_B,(6F5;1B1)OVERLAP_F_B,(1F8;6B4)OVERLAP_F_B,(6F6;1B2)OVERLAP_F_B,(1F9;6B5)OVERLAP_F_B,"
    "(6F7;1B3)OVERLAP_F_B,6B6,(6F8;1B4)OVERLAP_F_B,6B7,(6F9;1B5)OVERLAP_F_B,6B8,1B6,6I9,1I7,6W9,1I8,1W7,1I9,1W8,1W9\n"
    "2F0,2F1,2F2,5F0,2F3,5F1,2F4,5F2,5I0,5W0,5F3,(2F5;5B1)OVERLAP_F_B,(5F4;2B0)OVERLAP_F_B,(2F6;5B2)OVERLAP_F_B,"
    "(5F5;2B1)OVERLAP_F_B,(2F7;5B3)OVERLAP_F_B,(5F6;2B2)OVERLAP_F_B,(2F8;5B4)OVERLAP_F_B,(5F7;2B3)OVERLAP_F_B,"
    "(2F9;5B5)OVERLAP_F_B,(5F8;2B4)OVERLAP_F_B,5B6,(5F9;2B5)OVERLAP_F_B,5B7,2B6,5B8,2I7,5I9,2I8,2W7,2I9,5W9,2W8,2W9\n"
    "3F0,4F0,3F1,4F1,3F2,4F2,3F3,4F3,3F4,4B0,(4F4;3B0)OVERLAP_F_B,(3F5;4B1)OVERLAP_F_B,(4F5;3B1)OVERLAP_F_B,"
    "(3F6;4B2)OVERLAP_F_B,(4F6;3B2)OVERLAP_F_B,(3F7;4B3)OVERLAP_F_B,(4F7;3B3)OVERLAP_F_B,(3F8;4B4)OVERLAP_F_B,"
    "(4F8;3B4)OVERLAP_F_B,(3F9;4B5)OVERLAP_F_B,(4F9;3B5)OVERLAP_F_B,4B6,3B6,4B7,3B7,4I8,3I8,4I9,3I9,4W8,3W8,4W9,3W9\n";
}  // namespace

TEST_CASE("DualPipeV: PyTorch's golden order, its bubble and activation peak", "[pipeline]") {
  const StageLayout v4 = StageLayout::v_shape(4);
  const Schedule ours = dual_pipe_v(4, 10);
  CHECK(ours.layout == v4);
  // The same computations in the same order on every rank, and, with the communication added
  // by the same pass, the same runnable schedule.
  CHECK(ours.compute_only() == read_csv(pytorch_dualpipev_4rank_10mb, v4, 10));
  const Schedule theirs = read_csv(pytorch_dualpipev_4rank_10mb, v4, 10, {.add_send_recv = true});
  CHECK(ours == theirs);
  CHECK_NOTHROW(validate(theirs));
  // Its bubble is PyTorch's (same order), for equal and unequal costs alike.
  for (const Costs& costs : {Costs{1, 1, 1}, Costs{1, 1.5, 0.5}, Costs{2, 1, 1}})
    CHECK(simulate(ours, costs).makespan == simulate(theirs, costs).makespan);
  for (int ranks : {2, 3, 4, 8})
    for (int microbatches : {2 * ranks, 2 * ranks + 1, 16, 32}) {
      CAPTURE(ranks, microbatches);
      const Schedule s = dual_pipe_v(ranks, microbatches);
      const double p = ranks, m = microbatches;
      // With F = I = W = 1 every rank idles p - 1 units of 6m + p - 1 (worked out on the phases:
      // only the fill of the V), a third of ZB-H1's (p - 1) / (3m + p - 1)...
      const Timeline t = simulate(s, {1, 1, 1});
      CHECK(t.makespan == Approx(6 * m + p - 1).epsilon(1e-12));
      for (int rank = 0; rank < ranks; ++rank) CHECK(t.idle_fraction(rank) == Approx((p - 1) / (6 * m + p - 1)).epsilon(1e-12));
      CHECK(t.bubble() < simulate(zero_bubble_h1(ranks, microbatches), {1, 1, 1}).bubble());
      // ... with the activations of 2p + 1 chunk micro-batches per rank (DualPipe's "PP + 1" for
      // PP = 2p stages): one more than ZB-V's 2p.
      const MemoryReport memory = validate(s);
      for (int rank = 0; rank < ranks; ++rank) CHECK(memory.peak_saved[std::size_t(rank)] == 2 * ranks + 1);
      for (SendMode sends : {SendMode::blocking, SendMode::asynchronous})
        CHECK_FALSE(inspect(s, {sends}).violation.has_value());
    }
  CHECK(parse_schedule_kind("dualpipev") == ScheduleKind::dual_pipe_v);
  CHECK(make_schedule(ScheduleKind::dual_pipe_v, 2, 4) == dual_pipe_v(2, 4));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::dual_pipe_v, 2, 4, 1), Contains("2 stage(s) on each rank"));
  CHECK_THROWS_WITH(dual_pipe_v(4, 7), Contains("pipeline::dual_pipe_v") && Contains("m = 7 < 2p = 8"));
  CHECK_THROWS_WITH(dual_pipe_v(0, 4), Contains("at least one rank"));
}

TEST_CASE("DualPipeV's overlapped pairs: PyTorch's OVERLAP_F_B cells, and what they save", "[pipeline]") {
  // The backwards of the generator's [F; B] pairs are those of PyTorch's cells, row by row:
  // 2m - 3p + rank + 1 of them (worked out on the phases), the last rank's first F, B not a pair.
  const Schedule ours = dual_pipe_v(4, 10);
  const std::vector<Action> overlapped = dual_pipe_v_overlapped(4, 10);
  std::istringstream rows(pytorch_dualpipev_4rank_10mb);
  std::string row;
  std::vector<Action> cells;
  for (int rank = 0; std::getline(rows, row); ++rank) {
    CAPTURE(rank);
    int count = 0;
    for (auto at = row.find(";"); at != std::string::npos; at = row.find(";", at + 1), ++count)
      cells.push_back(parse_action(row.substr(at + 1, row.find(')', at) - at - 1)));
    CHECK(overlapped_pairs(ours, rank, overlapped) == count);
    CHECK(count == 2 * 10 - 3 * 4 + rank + 1 - (rank == 3 ? 1 : 0));
  }
  std::sort(cells.begin(), cells.end());
  CHECK(cells == overlapped);
  for (const Action& b : overlapped) CHECK(b.kind == ActionKind::backward);
  // Each pair's backward takes pair_saving() less: here both halves hide their whole
  // communication (F 1 of which 0.25, B 2 of which 0.5: 0.75 saved), every other computation
  // its full cost; without hideable parts, or without pairs, nothing changes.
  const Costs paired{
      .forward = 1, .backward_input = 1.5, .backward_weight = 0.5, .forward_hideable = 0.25, .backward_hideable = 0.5};
  CHECK(paired.pair_saving() == 0.75);
  // A half hides only behind the other's compute: 0.9 of a forward of 1 behind B's 2 - 0.5, but
  // only 0.1 of B's 0.5 behind the forward's 1 - 0.9.
  CHECK(
      Costs{.forward = 1, .backward_input = 1, .backward_weight = 1, .forward_hideable = 0.9, .backward_hideable = 0.5}
          .pair_saving() == Approx(0.9 + 0.1));
  const Timeline plain = simulate(ours, Costs{1, 1.5, 0.5});
  const Timeline overlapping = simulate(ours, paired, SendMode::asynchronous, overlapped);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    int shortened = 0;
    for (const TimedAction& a : overlapping.actions[std::size_t(rank)]) {
      if (!is_compute(a.action.kind)) continue;
      const bool pair = std::binary_search(overlapped.begin(), overlapped.end(), a.action);
      shortened += pair;
      CHECK(a.end - a.start == Approx(paired.of(a.action.kind) - (pair ? 0.75 : 0)));
    }
    CHECK(shortened == overlapped_pairs(ours, rank, overlapped));
  }
  CHECK(overlapping.makespan < plain.makespan);
  CHECK(simulate(ours, paired).makespan == plain.makespan);
  CHECK(simulate(ours, Costs{1, 1.5, 0.5}, SendMode::asynchronous, overlapped).makespan == plain.makespan);
  CHECK_THROWS_WITH(simulate(ours, paired, SendMode::asynchronous, {overlapped.back(), overlapped.front()}),
                    Contains("pipeline::simulate") && Contains("must be sorted"));
  CHECK_THROWS_WITH(dual_pipe_v_overlapped(4, 7),
                    Contains("pipeline::dual_pipe_v_overlapped") && Contains("m = 7 < 2p = 8"));
}
