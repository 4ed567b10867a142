// dtensor/trace/gather_trace.hpp — one Chrome trace from the Traces of several processes (MPI).
//
//   trace::Trace trace;                                   // each process: its own rank's track
//   { trace::TraceScope scope(trace, world->rank()); ...a few steps... }
//   trace::write_chrome_trace(trace, *world, "trace.json");   // collective; rank 0 writes the file
//
// Under MPI every process records its own track. Merging them is collective over `comm`: the
// ranks agree on the earliest span (an all-reduce), so that the times of all tracks count from
// the same origin — the steady clock is one clock for the processes of one host; across hosts
// their clocks are not aligned and the tracks are only as comparable as the hosts' clocks —
// then each rank's events go to rank 0 (an all-gather of their lengths and an all-to-all-v of
// the text). These collectives are not traced. With the threads backend, where all ranks share
// one Trace, call trace::write_chrome_trace(trace, path) once instead (trace/chrome_trace.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/trace/chrome_trace.hpp"

namespace dtensor::trace {

namespace detail {
/// No active trace while alive: the merge's own collectives stay out of the trace.
class TracingPaused {
 public:
  TracingPaused() : paused_(active_trace()), paused_observer_(dtensor::detail::collective_observer_slot()) {
    active_trace_slot() = nullptr;
    dtensor::detail::collective_observer_slot() = nullptr;
  }
  ~TracingPaused() {
    active_trace_slot() = paused_;
    dtensor::detail::collective_observer_slot() = paused_observer_;
  }
  TracingPaused(const TracingPaused&) = delete;
  TracingPaused& operator=(const TracingPaused&) = delete;

 private:
  RankTrace* paused_;
  CollectiveObserver* paused_observer_;
};
}  // namespace detail

/// The Chrome trace of every track of every process of `comm` on its rank 0 (the empty string
/// on the others). Collective over `comm`.
inline std::string gather_chrome_trace_json(const Trace& trace, Communicator& comm) {
  detail::TracingPaused paused;
  const auto snapshot = detail::TraceSnapshot::of(trace);
  std::int64_t origin = snapshot.earliest_ns;
  comm.all_reduce(std::span<std::int64_t>(&origin, 1), ReduceOp::min);
  const std::string mine = snapshot.events(origin);

  const auto n = std::size_t(comm.size());
  const std::int64_t my_length = std::int64_t(mine.size());
  std::vector<std::int64_t> lengths(n);
  comm.all_gather(std::span<const std::int64_t>(&my_length, 1), std::span<std::int64_t>(lengths));
  std::vector<std::size_t> send_counts(n, 0), send_displs(n, 0), recv_counts(n, 0), recv_displs(n, 0);
  send_counts[0] = mine.size();
  std::size_t total = 0;
  if (comm.rank() == 0)
    for (std::size_t r = 0; r < n; ++r) {
      recv_counts[r] = std::size_t(lengths[r]);
      recv_displs[r] = total;
      total += recv_counts[r];
    }
  std::vector<std::uint8_t> received(total);
  comm.all_to_all_v(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(mine.data()), mine.size()),
                    std::span<const std::size_t>(send_counts), std::span<const std::size_t>(send_displs),
                    std::span<std::uint8_t>(received), std::span<const std::size_t>(recv_counts),
                    std::span<const std::size_t>(recv_displs));
  if (comm.rank() != 0) return {};
  std::vector<std::string> per_rank;
  for (std::size_t r = 0; r < n; ++r)
    per_rank.emplace_back(reinterpret_cast<const char*>(received.data()) + recv_displs[r], recv_counts[r]);
  return detail::chrome_document(per_rank);
}

/// gather_chrome_trace_json, written to `path` by rank 0. Collective over `comm`.
inline void write_chrome_trace(const Trace& trace, Communicator& comm, const std::string& path) {
  const auto json = gather_chrome_trace_json(trace, comm);
  if (comm.rank() == 0) detail::write_text_file(path, json, "trace::write_chrome_trace");
}

}  // namespace dtensor::trace
