// Observability (include/dtensor/trace/): the Chrome trace of a GPT step on 4 ranks against the
// CommLog of the same scope, its merge through a communicator, the progress bar and the SVG loss
// plot. The trace is read back with a strict JSON parser (support/strict_json.hpp) and the plot
// with an XML well-formedness check (below), so a malformed file fails here, not in a viewer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>  // setenv: DTENSOR_PROGRESS and a launcher's variables
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <variant>

#include <unistd.h>  // getpid: a temporary directory of this run
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/trace/all.hpp"
#include "support/on_ranks.hpp"
#include "support/strict_json.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_trace {

using namespace dtensor;
using dtensor::testing::Json;
using dtensor::testing::JsonParser;

namespace {

// ---------------------------------------------------------------- an XML well-formedness check

/// "" when `xml` is well-formed (one root, tags nested and closed, attributes quoted, only the
/// predefined entities), else what is wrong. Enough for the SVG writer: no DTD, no CDATA.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  std::size_t i = 0, roots = 0;
  auto name_at = [&](std::size_t& k) {
    const std::size_t from = k;
    while (k < xml.size() && (std::isalnum(static_cast<unsigned char>(xml[k])) || xml[k] == '-' || xml[k] == ':' ||
                              xml[k] == '_' || xml[k] == '.'))
      ++k;
    return xml.substr(from, k - from);
  };
  auto entity_ok = [&](std::size_t k) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
      if (xml.compare(k, std::strlen(e), e) == 0) return true;
    return false;
  };
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] != '<') {
      if (xml[i] == '&' && !entity_ok(i)) return "bad entity at " + std::to_string(i);
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i]))) return "text outside the root";
      ++i;
      continue;
    }
    ++i;
    if (i < xml.size() && xml[i] == '/') {
      ++i;
      const auto name = name_at(i);
      if (open.empty() || open.back() != name) return "</" + name + "> closes nothing open";
      open.pop_back();
      if (i >= xml.size() || xml[i] != '>') return "bad end tag " + name;
      ++i;
      continue;
    }
    const auto name = name_at(i);
    if (name.empty()) return "empty tag name at " + std::to_string(i);
    if (open.empty() && ++roots > 1) return "a second root <" + name + ">";
    std::set<std::string> attributes;
    while (true) {
      while (i < xml.size() && std::isspace(static_cast<unsigned char>(xml[i]))) ++i;
      if (i >= xml.size()) return "unterminated <" + name + ">";
      if (xml[i] == '>') {
        open.push_back(name);
        ++i;
        break;
      }
      if (xml.compare(i, 2, "/>") == 0) {
        i += 2;
        break;
      }
      const auto attribute = name_at(i);
      if (attribute.empty() || !attributes.insert(attribute).second) return "bad attribute in <" + name + ">";
      if (i + 1 >= xml.size() || xml[i] != '=' || xml[i + 1] != '"') return "unquoted " + attribute + " in <" + name + ">";
      i += 2;
      for (; i < xml.size() && xml[i] != '"'; ++i) {
        if (xml[i] == '<') return "'<' in attribute " + attribute;
        if (xml[i] == '&' && !entity_ok(i)) return "bad entity in attribute " + attribute;
      }
      ++i;
    }
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return roots == 1 ? "" : "no root element";
}

// ---------------------------------------------------------------- reading a trace back

/// What one rank's track of a Chrome trace holds.
struct TrackContents {
  std::map<std::string, std::size_t> collectives;  // kind/group -> spans
  std::size_t waits = 0, unfinished = 0, lane_overlaps = 0;
  std::size_t unmatched_waits = 0;  // waits that end other than when a collective of their name ends
  std::set<std::string> compute;  // names
  std::set<double> collective_tids;
};

std::map<int, TrackContents> read_tracks(const std::string& json) {
  const Json doc = JsonParser(json).document();
  std::map<int, TrackContents> tracks;
  std::map<std::pair<int, double>, std::vector<std::pair<double, double>>> lanes;  // (pid, tid) -> [begin, end)
  std::map<std::pair<int, std::string>, std::vector<std::pair<double, double>>> collectives, waits;  // by name
  for (const auto& e : doc["traceEvents"].array()) {
    const int pid = int(e["pid"].number());
    auto& t = tracks[pid];
    if (e["ph"].text() != "X") continue;
    const auto& cat = e["cat"].text();
    if (!e["args"]["finished"].boolean()) ++t.unfinished;
    if (cat == "collective") {
      ++t.collectives[e["args"]["kind"].text() + "/" + e["args"]["group"].text()];
      t.collective_tids.insert(e["tid"].number());
      lanes[{pid, e["tid"].number()}].push_back({e["ts"].number(), e["ts"].number() + e["dur"].number()});
      collectives[{pid, e["name"].text()}].push_back({e["ts"].number(), e["ts"].number() + e["dur"].number()});
    } else if (cat == "wait") {
      ++t.waits;
      const auto& name = e["name"].text();  // "wait all_reduce dp"
      waits[{pid, name.substr(5)}].push_back({e["ts"].number(), e["ts"].number() + e["dur"].number()});
    } else {
      t.compute.insert(e["name"].text());
    }
  }
  // A wait ends when its collective completes, inside the collective's span.
  for (const auto& [key, list] : waits)
    for (const auto& [begin, end] : list) {
      bool matched = false;
      for (const auto& c : collectives[key]) matched = matched || (c.first <= begin && std::abs(c.second - end) < 0.0025);
      tracks[key.first].unmatched_waits += !matched;
    }
  for (auto& [key, spans] : lanes) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t k = 1; k < spans.size(); ++k) tracks[key.first].lane_overlaps += spans[k].first < spans[k - 1].second;
  }
  return tracks;
}

std::map<std::string, std::size_t> counts_of(const CommLog& log) {
  std::map<std::string, std::size_t> c;
  for (const auto& r : log.records()) ++c[std::string(name_of(r.kind)) + "/" + r.group];
  return c;
}

using Mesh = DeviceMesh<"dp", "tp">;
using Model = models::GPT<double, Mesh, parallel::MegatronPlan<true>>;

models::GPTConfig small_gpt() {
  return {.vocab = 29, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .mlp_ratio = 2, .checkpoint = false, .seed = 5};
}

/// One training step of a small GPT with DDP (dp 2 x tp 2 on 4 ranks), whose gradient
/// all-reduces are asynchronous and waited on in finish_gradient_sync.
void gpt_step(const Mesh& mesh) {
  Model model(mesh, small_gpt());
  parallel::DataParallel<Mesh> ddp(mesh, {.bucket_bytes = 2048});
  ddp.attach(model);
  trace::trace_units(model);  // after the wrappers: keeps their hooks
  const auto v = small_gpt().vocab;
  using Ids = Model::Ids;
  auto ids = distribute_replicated<Ids::layout>(mesh, randint<std::int32_t>(Shape<2>{4, 8}, 11, 0, v));
  auto targets = distribute_replicated<Ids::layout>(mesh, randint<std::int32_t>(Shape<2>{4, 8}, 12, 0, v));
  trace::ComputeSpan step("step");
  {
    trace::ComputeSpan forward("forward");
    auto [loss, saved] = model.forward(ids, targets);
    forward.end();
    trace::ComputeSpan backward("backward");
    model.backward(std::move(saved));
  }
  ddp.finish_gradient_sync();
}

}  // namespace

TEST_CASE("trace: a GPT step on 4 ranks gives one track per rank and one span per CommLog collective",
          "[trace]") {
  trace::Trace trace;
  std::mutex m;
  std::map<int, std::map<std::string, std::size_t>> logged;
  threads::run(4, [&](CommPtr world) {
    Mesh mesh(world, {2, 2});  // its splits happen outside the scope: not in the log, not in the trace
    trace::TraceScope scope(trace, world->world_rank());
    CommLog log;
    gpt_step(mesh);
    std::lock_guard lock(m);
    logged[world->rank()] = counts_of(log);
  });
  const auto json = trace::chrome_trace_json(trace);
  std::map<int, TrackContents> tracks;
  REQUIRE_NOTHROW(tracks = read_tracks(json));
  REQUIRE(tracks.size() == 4);
  for (const auto& [rank, t] : tracks) {
    INFO("rank " << rank);
    REQUIRE(logged.count(rank));
    CHECK(t.collectives == logged[rank]);
    CHECK(logged[rank].size() >= 3);  // tp all-gathers and reduce-scatters, dp all-reduces
    CHECK(t.waits >= 1);  // at least DDP's last bucket, issued just before finish_gradient_sync
    CHECK(t.unmatched_waits == 0);
    CHECK(t.unfinished == 0);
    CHECK(t.lane_overlaps == 0);
    for (const char* name : {"step", "forward", "backward", "forward embed", "forward h.0", "forward h.1",
                             "forward head", "backward head", "backward h.1", "backward h.0", "backward embed"})
      CHECK(t.compute.count(name) == 1);
  }
}

TEST_CASE("trace: ranks that trace separately (as MPI processes do) merge on rank 0 through the communicator",
          "[trace]") {
  std::string merged;
  std::mutex m;
  std::map<int, std::map<std::string, std::size_t>> logged;
  threads::run(4, [&](CommPtr world) {
    trace::Trace own;  // one per rank, as one per process under MPI
    CommLog log;
    {
      trace::TraceScope scope(own, world->rank());
      std::vector<float> x(5, float(world->rank()));
      world->all_reduce(std::span<float>(x), ReduceOp::sum);
      auto row = world->split(world->rank() / 2, world->rank());
      std::vector<float> gathered(10);
      row->all_gather(std::span<const float>(x), std::span<float>(gathered));
      Work w = row->all_reduce_async(std::span<const float>(x), std::span<float>(x), ReduceOp::max);
      w.wait();
    }
    const auto in_scope = counts_of(log);
    auto json = trace::gather_chrome_trace_json(own, *world);  // its collectives are not traced
    std::lock_guard lock(m);
    logged[world->rank()] = in_scope;
    if (world->rank() == 0) merged = std::move(json);
    else if (!json.empty()) merged = "rank " + std::to_string(world->rank()) + " got a document too";
  });
  std::map<int, TrackContents> tracks;
  REQUIRE_NOTHROW(tracks = read_tracks(merged));
  REQUIRE(tracks.size() == 4);
  for (const auto& [rank, t] : tracks) {
    INFO("rank " << rank);
    CHECK(t.collectives == logged[rank]);
    CHECK(t.collectives.size() == 3);  // all_reduce/world, split/world, all_gather/world (the row's label)
    CHECK(t.waits == 1);
    CHECK(t.unmatched_waits == 0);
  }
}

TEST_CASE("trace: a Work dropped unfinished still closes its span, flagged; nothing is recorded outside a scope",
          "[trace]") {
  trace::Trace trace;
  // The buffers outlive the run: the dropped all-reduce may still be running when its rank returns.
  std::vector<std::vector<double>> sends(2, std::vector<double>(3, 1.0)), receives(2, std::vector<double>(3));
  threads::run(2, [&](CommPtr world) {
    auto& x = sends[std::size_t(world->rank())];
    auto& y = receives[std::size_t(world->rank())];
    {
      trace::TraceScope scope(trace, world->rank());
      Work w = world->all_reduce_async(std::span<const double>(x), std::span<double>(y), ReduceOp::sum);
      while (!w.test()) {
      }
      // A second one whose Work goes out of scope unwaited: the barrier below orders it.
      { Work dropped = world->all_reduce_async(std::span<const double>(x), std::span<double>(y), ReduceOp::sum); }
    }
    world->barrier();  // outside the scope
    trace::ComputeSpan ignored("outside");
  });
  const Json doc = JsonParser(trace::chrome_trace_json(trace)).document();
  std::size_t collectives = 0, awaited = 0, dropped = 0, other = 0;
  for (const auto& e : doc["traceEvents"].array()) {
    if (e["ph"].text() != "X") continue;
    if (e["cat"].text() != "collective") {
      ++other;
      continue;
    }
    ++collectives;
    CHECK(e["args"]["finished"].boolean());
    if (e["args"].has("awaited")) ++dropped;
    else ++awaited;
  }
  CHECK(collectives == 4);  // two per rank
  CHECK(awaited == 2);      // completed through test()
  CHECK(dropped == 2);      // the Work dropped unwaited (its span closed when it was destroyed)
  CHECK(other == 0);        // test() records no wait; the barrier and the span outside the scope nothing
}

TEST_CASE("trace: bad input is a dtensor::Error", "[trace]") {
  trace::Trace trace;
  CHECK_THROWS_AS(trace.track(-1), Error);
  CHECK_THROWS_WITH(trace::write_chrome_trace(trace, "/nonexistent-dir/trace.json"),
                    Catch::Contains("/nonexistent-dir/trace.json"));
}

TEST_CASE("progress bar: a bar redrawn in place on a terminal, plain lines elsewhere", "[trace][progress]") {
  using S = trace::ProgressBar::Seconds;
  SECTION("not a terminal: the first step, every plain_every-th and the last, one line each") {
    std::ostringstream out;
    trace::ProgressBar bar(out, {.total_steps = 25, .tokens_per_step = 2000, .plain_every = 10}, false);
    for (int step = 1; step <= 25; ++step) bar.update(step, 3.0 - 0.1 * step, S(0.5 * (step - 1)));
    bar.finish();
    const auto text = out.str();
    CHECK(text.find('\r') == std::string::npos);
    CHECK(std::count(text.begin(), text.end(), '\n') == 4);  // steps 1, 10, 20, 25
    // 0.5 s per step: 4000 tokens/s; at step 10, 15 steps left: 7.5 s.
    CHECK_THAT(text, Catch::Contains("step 10/25  loss 2.0000  4.00k tok/s  ETA 0:08"));
    CHECK_THAT(text, Catch::Contains("step 25/25  loss 0.5000  4.00k tok/s  ETA 0:00"));
  }
  SECTION("a terminal: carriage returns, a bar, messages above it") {
    std::ostringstream out;
    trace::ProgressBar bar(out, {.total_steps = 300, .tokens_per_step = 0, .bar_width = 10}, true);
    bar.update(1, 4.0, S(0));
    bar.update(150, 2.0, S(149 * 2.0));
    bar.message("validation loss 2.1");
    bar.finish();
    const auto text = out.str();
    CHECK_THAT(text, Catch::Contains("\r[#####.....] 150/300  loss 2.0000  ETA 5:00"));
    CHECK_THAT(text, Catch::Contains("\rvalidation loss 2.1\x1b[K\n[#####.....] 150/300"));
    CHECK(text.find("tok/s") == std::string::npos);
    CHECK(text.back() == '\n');
  }
  std::ostringstream out;
  CHECK_THROWS_AS(trace::ProgressBar(out, {.total_steps = 0}), Error);
  trace::ProgressBar bar(out, {.total_steps = 3}, false);
  CHECK_THROWS_AS(bar.update(4, 1.0), Error);
}

TEST_CASE("progress bar: rates readable at any size, three significant digits", "[trace][progress]") {
  using trace::detail::short_rate;
  CHECK(short_rate(0) == "0.00");
  CHECK(short_rate(9.5) == "9.50");
  CHECK(short_rate(950) == "950");
  CHECK(short_rate(999.4) == "999");
  CHECK(short_rate(999.6) == "1.00k");      // rounds up into the next prefix, not "1000"
  CHECK(short_rate(41234) == "41.2k");
  CHECK(short_rate(3.1e6) == "3.10M");
  CHECK(short_rate(1.17e9) == "1.17G");     // was "1.17e+03M"
  CHECK(short_rate(999.96e6) == "1.00G");
  CHECK(short_rate(2.5e15) == "2.50P");
  CHECK(short_rate(3e21) == "3000E");       // past the last prefix: the digits, never an exponent
}

namespace {
/// Sets (or, with nullptr, unsets) an environment variable for one scope, then restores it.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    if (value) ::setenv(name.c_str(), value, 1);
    else ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};
}  // namespace

TEST_CASE("progress bar: no bar under an MPI launcher's forwarding; DTENSOR_PROGRESS decides", "[trace][progress]") {
  ScopedEnv no_force("DTENSOR_PROGRESS", nullptr);
  SECTION("an MPI launcher's rank: plain lines even where isatty says yes") {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
      ScopedEnv launcher(v, "0");
      CHECK_FALSE(trace::stdout_is_terminal());
    }
  }
  SECTION("DTENSOR_PROGRESS=bar and =lines win over the launcher and isatty") {
    ScopedEnv launcher("OMPI_COMM_WORLD_RANK", "0");
    {
      ScopedEnv force("DTENSOR_PROGRESS", "bar");
      CHECK(trace::stdout_is_terminal());
    }
    ScopedEnv force("DTENSOR_PROGRESS", "lines");
    CHECK_FALSE(trace::stdout_is_terminal());
  }
  SECTION("TERM=dumb (or none): plain lines, no ESC[K; DTENSOR_PROGRESS=bar still wins") {
    for (const char* term : {"dumb", "", static_cast<const char*>(nullptr)}) {
      ScopedEnv t("TERM", term);
      CHECK(trace::detail::dumb_terminal());
      CHECK_FALSE(trace::stdout_is_terminal());
    }
    ScopedEnv t("TERM", "xterm-256color");
    CHECK_FALSE(trace::detail::dumb_terminal());
    ScopedEnv force("DTENSOR_PROGRESS", "bar");
    ScopedEnv dumb("TERM", "dumb");
    CHECK(trace::stdout_is_terminal());
  }
  SECTION("a bad DTENSOR_PROGRESS is an error naming it") {
    ScopedEnv force("DTENSOR_PROGRESS", "yes");
    CHECK_THROWS_WITH(trace::stdout_is_terminal(), Catch::Contains("DTENSOR_PROGRESS") && Catch::Contains("'yes'"));
  }
}

TEST_CASE("training monitor: every line while the bar is up goes above it", "[trace][progress]") {
  ScopedEnv force("DTENSOR_PROGRESS", "bar");
  std::ostringstream out;
  threads::run(1, [&](CommPtr world) {
    trace::MonitorOptions options;
    options.total_steps = 4;
    trace::TrainingMonitor monitor(world, options, out);
    monitor.train_loss(1, 3.0);
    monitor.train_loss(2, 2.5);
    monitor.validation_loss(2, 2.7, "  pipeline idle 0.250");
    monitor.message("step    2  checkpoint saved to ckpt");
    monitor.train_loss(3, 2.0);
    monitor.finish();
  });
  const auto text = out.str();
  // Each line starts after a carriage return and clears the bar's rest; the bar comes back below.
  CHECK_THAT(text, Catch::Contains("\rstep    2  validation loss 2.7000  pipeline idle 0.250\x1b[K\n["));
  CHECK_THAT(text, Catch::Contains("\rstep    2  checkpoint saved to ckpt\x1b[K\n["));
  CHECK(text.back() == '\n');
}

TEST_CASE("training monitor: without the bar, messages and validation lines are plain lines on rank 0",
          "[trace][progress]") {
  ScopedEnv force("DTENSOR_PROGRESS", "bar");  // even on a terminal: no bar
  std::ostringstream out;
  threads::run(2, [&](CommPtr world) {
    trace::MonitorOptions options;
    options.total_steps = 3;
    options.progress = false;
    std::ostringstream other;
    trace::TrainingMonitor monitor(world, options, world->rank() == 0 ? out : other);
    monitor.train_loss(1, 3.0);
    monitor.message("step    1  loss 3.0000");
    monitor.validation_loss(1, 2.7, "  more");
    monitor.finish();
    if (world->rank() != 0 && !other.str().empty()) throw Error("test", "rank 1 printed: " + other.str());
  });
  CHECK(out.str() == "step    1  loss 3.0000\nstep    1  validation loss 2.7000  more\n");
}

TEST_CASE("loss plot: a well-formed SVG with both curves and a legend", "[trace][plot]") {
  trace::LossCurve train{"train", {}, {}}, val{"validation <held out> & co", {}, {}};
  for (int s = 1; s <= 200; ++s) {
    train.steps.push_back(s);
    train.losses.push_back(3.3 * std::exp(-s / 60.0) + 1.2);
  }
  for (int s = 50; s <= 200; s += 50) {
    val.steps.push_back(s);
    val.losses.push_back(3.3 * std::exp(-s / 60.0) + 1.35);
  }
  train.losses[7] = std::nan("");  // a diverged step is left out, not drawn at NaN
  const auto svg = trace::loss_plot_svg({train, val}, {.title = "GPT dp 2 x tp 2"});
  INFO(svg.substr(0, 400));
  CHECK(xml_problem(svg).empty());
  CHECK(xml_problem("<svg><g></svg>") != "");  // the checker itself can fail
  // Both curves, each a polyline with one point per finite (step, loss).
  std::vector<std::size_t> points;
  for (std::size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) {
    const auto begin = svg.find("points=\"", at) + 8, end = svg.find('"', begin);
    const auto list = svg.substr(begin, end - begin);
    points.push_back(list.empty() ? 0 : std::size_t(std::count(list.begin(), list.end(), ' ') + 1));
  }
  CHECK(points == std::vector<std::size_t>{train.steps.size() - 1, val.steps.size()});
  CHECK_THAT(svg, Catch::Contains(">train</text>"));
  CHECK_THAT(svg, Catch::Contains(">validation &lt;held out&gt; &amp; co</text>"));
  CHECK(svg.find("nan") == std::string::npos);
  // One curve, one point, or none at all: still a well-formed image.
  CHECK(xml_problem(trace::loss_plot_svg({trace::LossCurve{"one", {5}, {2.5}}})).empty());
  CHECK(xml_problem(trace::loss_plot_svg({})).empty());
  CHECK_THROWS_AS(trace::loss_plot_svg({trace::LossCurve{"bad", {1, 2}, {1.0}}}), Error);
  CHECK_THROWS_AS(trace::loss_plot_svg({train}, {.width = 10}), Error);
}

TEST_CASE("training monitor: traces the chosen steps on every rank, writes the trace and the plot from rank 0",
          "[trace][monitor]") {
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor_test_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto trace_path = (dir / "trace.json").string(), plot_path = (dir / "loss.svg").string();
  std::ostringstream rank0_out;
  threads::run(3, [&](CommPtr world) {
    std::ostringstream others;
    trace::TrainingMonitor monitor(world,
                                   {.trace_path = trace_path, .plot_path = plot_path, .first_traced_step = 2,
                                    .traced_steps = 2, .total_steps = 5, .tokens_per_step = 64},
                                   world->rank() == 0 ? rank0_out : others);
    for (int step = 1; step <= 5; ++step) {
      double loss = 4.0 / step + world->rank();  // each rank its own; the mean is the global loss
      {
        auto traced = monitor.step(step);
        world->all_reduce(std::span<double>(&loss, 1), ReduceOp::avg);
      }
      monitor.train_loss(step, loss);
      if (step % 2 == 0) monitor.validation_loss(step, loss + 0.1);
    }
    monitor.finish();
    if (world->rank() != 0 && !others.str().empty()) throw std::runtime_error("rank " + std::to_string(world->rank()) + " printed");
  });
  std::ifstream trace_file(trace_path), plot_file(plot_path);
  const std::string json((std::istreambuf_iterator<char>(trace_file)), {}), svg((std::istreambuf_iterator<char>(plot_file)), {});
  std::filesystem::remove_all(dir);
  std::map<int, TrackContents> tracks;
  REQUIRE_NOTHROW(tracks = read_tracks(json));
  REQUIRE(tracks.size() == 3);
  for (const auto& [rank, t] : tracks) {
    INFO("rank " << rank);
    CHECK(t.compute == std::set<std::string>{"step 2", "step 3"});
    CHECK(t.collectives == std::map<std::string, std::size_t>{{"all_reduce/world", 2}});
  }
  CHECK(xml_problem(svg).empty());
  CHECK_THAT(svg, Catch::Contains(">train</text>") && Catch::Contains(">validation</text>"));
  CHECK_THAT(rank0_out.str(), Catch::Contains("validation loss 2.1000") && Catch::Contains("written to " + trace_path) &&
                                  Catch::Contains("written to " + plot_path));
}

}  // namespace test_trace
