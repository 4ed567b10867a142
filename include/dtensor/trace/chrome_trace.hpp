// dtensor/trace/chrome_trace.hpp — a Trace as a Chrome trace (JSON), which Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
//   trace::write_chrome_trace(trace, "trace.json");   // every rank of this process
//   std::string json = trace::chrome_trace_json(trace);
//
// Layout: one process per rank (pid = the rank, named "rank r"), in which thread 0 ("compute")
// holds the compute spans and the waits, and threads 1, 2, ... ("collectives") hold the
// collectives, issue to completion: asynchronous collectives overlap each other and the
// compute, so they are spread over as many lanes as overlap at once (a span never overlaps
// another in its lane, as the viewers require). Every span is a complete event ("ph": "X") with
// the time in microseconds since the earliest span of the trace; a collective's args carry its
// CommLog record (kind, group, group size, bytes, dtype, reduction, peer, bytes sent and
// received). A collective still running when the trace is written has zero length and
// "finished": false; one whose Work was dropped unfinished, "awaited": false.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/json.hpp"
#include "dtensor/trace/rank_trace.hpp"
#include "dtensor/trace/text_file.hpp"
#include "dtensor/trace/trace_scope.hpp"

namespace dtensor::trace {

namespace detail {

using dtensor::detail::json_string;

/// Comma-separated event lists as one (empty ones skipped).
inline std::string joined(const std::vector<std::string>& event_lists) {
  std::string out;
  for (const auto& list : event_lists)
    if (!list.empty()) out += (out.empty() ? "" : ",\n") + list;
  return out;
}

/// Nanoseconds on the steady clock: what ranks compare (one clock on one host).
inline std::int64_t clock_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// Microseconds since `origin_ns`, with nanosecond digits.
inline std::string micros_since(std::int64_t origin_ns, Clock::time_point t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", double(clock_ns(t) - origin_ns) / 1e3);
  return buf;
}

/// The earliest span of one rank (max() when it has none).
inline std::int64_t earliest_ns_of(const std::vector<SpanRecord>& spans) {
  std::int64_t first = std::numeric_limits<std::int64_t>::max();
  for (const auto& s : spans) first = std::min(first, clock_ns(s.begin));
  return first;
}

/// For each collective span (in order), the lane it goes in: the first lane free at its begin.
inline std::vector<int> collective_lanes(const std::vector<SpanRecord>& spans) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < spans.size(); ++i)
    if (spans[i].kind == SpanKind::collective) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return spans[a].begin < spans[b].begin; });
  std::vector<int> lane(spans.size(), -1);
  std::vector<Clock::time_point> lane_free_at;  // end of the last span in each lane
  for (std::size_t i : order) {
    const auto end = spans[i].finished ? spans[i].end : spans[i].begin;
    std::size_t l = 0;
    while (l < lane_free_at.size() && lane_free_at[l] > spans[i].begin) ++l;
    if (l == lane_free_at.size()) lane_free_at.emplace_back();
    lane_free_at[l] = end;
    lane[i] = int(l);
  }
  return lane;
}

inline std::string collective_args(const CommRecord& r) {
  const auto wire = r.wire();
  return dtensor::detail::cat("\"kind\":", json_string(name_of(r.kind)), ",\"group\":", json_string(r.group),
                              ",\"group_size\":", r.group_size, ",\"bytes\":", r.bytes,
                              ",\"dtype\":", json_string(name_of(r.dtype)), ",\"op\":", json_string(name_of(r.op)),
                              ",\"peer\":", r.peer, ",\"sent\":", wire.sent, ",\"received\":", wire.received);
}

/// The events of one rank's track (metadata first), comma-separated, times since `origin_ns`.
inline std::string chrome_events(int rank, const std::vector<SpanRecord>& spans, std::int64_t origin_ns) {
  const auto lanes = collective_lanes(spans);
  const int lane_count = lanes.empty() ? 0 : *std::max_element(lanes.begin(), lanes.end()) + 1;
  std::vector<std::string> events;
  auto metadata = [&](const char* what, int tid, const std::string& name) {
    events.push_back(dtensor::detail::cat("{\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":", rank, ",\"tid\":", tid,
                                          ",\"args\":{\"name\":", json_string(name), "}}"));
  };
  metadata("process_name", 0, dtensor::detail::cat("rank ", rank));
  events.push_back(dtensor::detail::cat("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":", rank,
                                        ",\"tid\":0,\"args\":{\"sort_index\":", rank, "}}"));
  metadata("thread_name", 0, "compute");
  for (int l = 0; l < lane_count; ++l) metadata("thread_name", 1 + l, dtensor::detail::cat("collectives ", l));
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const auto& s = spans[i];
    const auto end = s.finished ? s.end : s.begin;
    const int tid = s.kind == SpanKind::collective ? 1 + lanes[i] : 0;
    std::string args = dtensor::detail::cat("\"finished\":", s.finished ? "true" : "false");
    if (s.collective) args += "," + collective_args(*s.collective);
    if (s.kind == SpanKind::collective && !s.awaited) args += ",\"awaited\":false";
    const auto begin_ns = clock_ns(s.begin), end_ns = clock_ns(end);
    char duration[32];
    std::snprintf(duration, sizeof duration, "%.3f", double(end_ns - begin_ns) / 1e3);
    events.push_back(dtensor::detail::cat("{\"name\":", json_string(s.name), ",\"cat\":", json_string(name_of(s.kind)),
                                          ",\"ph\":\"X\",\"ts\":", micros_since(origin_ns, s.begin), ",\"dur\":",
                                          duration, ",\"pid\":", rank, ",\"tid\":", tid, ",\"args\":{", args, "}}"));
  }
  return joined(events);
}

/// The whole document around comma-separated event lists.
inline std::string chrome_document(const std::vector<std::string>& event_lists) {
  return "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n" + joined(event_lists) + "\n]}\n";
}

/// The spans of every track of a Trace, copied at one moment.
struct TraceSnapshot {
  std::vector<int> ranks;
  std::vector<std::vector<SpanRecord>> spans;                         // per track, as ranks
  std::int64_t earliest_ns = std::numeric_limits<std::int64_t>::max();  // of any span

  static TraceSnapshot of(const Trace& trace) {
    TraceSnapshot s;
    for (const auto& t : trace.tracks()) {
      s.spans.push_back(t->spans());
      s.ranks.push_back(t->rank());
      s.earliest_ns = std::min(s.earliest_ns, earliest_ns_of(s.spans.back()));
    }
    return s;
  }
  /// The events of every track, comma-separated, times since `origin_ns`.
  std::string events(std::int64_t origin_ns) const {
    std::vector<std::string> lists;
    for (std::size_t i = 0; i < spans.size(); ++i) lists.push_back(chrome_events(ranks[i], spans[i], origin_ns));
    return joined(lists);
  }
};

}  // namespace detail

/// Every track of `trace` as one Chrome trace document.
inline std::string chrome_trace_json(const Trace& trace) {
  const auto snapshot = detail::TraceSnapshot::of(trace);
  return detail::chrome_document({snapshot.events(snapshot.earliest_ns)});
}

/// Writes chrome_trace_json(trace) to `path`; throws a dtensor::Error if it cannot.
inline void write_chrome_trace(const Trace& trace, const std::string& path) {
  detail::write_text_file(path, chrome_trace_json(trace), "trace::write_chrome_trace");
}

}  // namespace dtensor::trace
