// dtensor/trace/trace_scope.hpp — recording a trace: the per-process Trace, the per-rank scope,
// and compute spans.
//
//   trace::Trace trace;                                   // one per process
//   threads::run(4, [&](CommPtr world) {
//     trace::TraceScope scope(trace, world->world_rank()); // this thread records rank r's track
//     { trace::ComputeSpan s("forward"); ... }             // a compute span
//     world->all_reduce(...);                              // a collective span, issue to completion
//   });
//   trace::write_chrome_trace(trace, "trace.json");        // trace/chrome_trace.hpp
//
// While a TraceScope is alive, the calling thread records into the Trace's track of its rank:
// the collectives it issues (the same calls its CommLog records, each timed from issue to
// completion, with the time it blocked waiting on asynchronous ones) and the compute spans it
// opens (ComputeSpan; trace/unit_spans.hpp opens one per model unit). A scope replaces an
// enclosing one until it ends; scopes of the same rank, one after another, add to one track.
// Outside a scope, a ComputeSpan or a collective costs one thread-local load and one branch.
// Under MPI each process keeps its own Trace; trace/gather_trace.hpp merges them on rank 0.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/comm/observer.hpp"
#include "dtensor/trace/collective_span.hpp"
#include "dtensor/trace/rank_trace.hpp"

namespace dtensor::trace {

/// The tracks of the ranks of this process (all of them on the threads backend, one under MPI).
class Trace {
 public:
  Trace() = default;
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  /// Rank r's track, created on first use.
  std::shared_ptr<RankTrace> track(int rank) {
    if (rank < 0) throw Error("trace::Trace::track", dtensor::detail::cat("rank ", rank, " is negative"));
    std::lock_guard lock(mutex_);
    for (const auto& t : tracks_)
      if (t->rank() == rank) return t;
    tracks_.push_back(std::make_shared<RankTrace>(rank));
    return tracks_.back();
  }
  /// Every track, by rank.
  std::vector<std::shared_ptr<const RankTrace>> tracks() const {
    std::lock_guard lock(mutex_);
    std::vector<std::shared_ptr<const RankTrace>> out(tracks_.begin(), tracks_.end());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->rank() < b->rank(); });
    return out;
  }
  /// Drops every span recorded so far (a trainer traces a few steps after the warm-up ones).
  void clear() {
    std::lock_guard lock(mutex_);
    for (const auto& t : tracks_) t->clear();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<RankTrace>> tracks_;
};

/// Makes rank `rank`'s track of `trace` the calling thread's active trace while alive.
class TraceScope {
 public:
  TraceScope(Trace& trace, int rank)
      : track_(trace.track(rank)), spans_(track_.get()), enclosing_(detail::active_trace()),
        enclosing_observer_(dtensor::detail::collective_observer_slot()) {
    detail::active_trace_slot() = track_.get();
    dtensor::detail::collective_observer_slot() = &spans_;  // the communicator reports to it
  }
  ~TraceScope() {
    detail::active_trace_slot() = enclosing_;
    dtensor::detail::collective_observer_slot() = enclosing_observer_;
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  std::shared_ptr<RankTrace> track_;
  detail::CollectiveSpans spans_;
  RankTrace* enclosing_;
  CollectiveObserver* enclosing_observer_;
};

/// A compute span on the active trace's track, from construction to end() or destruction;
/// nothing outside a trace scope.
class ComputeSpan {
 public:
  explicit ComputeSpan(std::string_view name) : trace_(detail::active_trace()) {
    if (trace_ != nullptr) [[unlikely]]
      depth_ = trace_->open(std::string(name));
  }
  ~ComputeSpan() { end(); }
  ComputeSpan(const ComputeSpan&) = delete;
  ComputeSpan& operator=(const ComputeSpan&) = delete;

  void end() {
    if (trace_ == nullptr) return;
    trace_->close(depth_);
    trace_ = nullptr;
  }

 private:
  RankTrace* trace_;  // alive: the scope that made it active outlives this span (both on this thread)
  std::size_t depth_ = 0;
};

}  // namespace dtensor::trace
