// dtensor/trace/collective_span.hpp — the collective observer (comm/observer.hpp) that times a
// rank's collectives for its trace: installed by TraceScope (trace/trace_scope.hpp) while the
// scope is alive, so comm never includes trace/.
//
// issued() opens a span on the rank's trace. started() closes it when the Work
// completes: at once for a Work that is already done (a blocking call the backend ran inline),
// otherwise when wait() returns or test() first says done — the returned Work wraps the
// backend's to see that. Waiting on an asynchronous collective also records a wait span (the
// time the rank blocked). A Work dropped unfinished closes its span when it is destroyed,
// flagged, so that every collective of the CommLog has exactly one span.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/observer.hpp"
#include "dtensor/comm/work.hpp"
#include "dtensor/trace/rank_trace.hpp"

namespace dtensor::trace::detail {

/// The backend's Work, seen to completion for the span.
class TracedWork final : public dtensor::detail::WorkState {
 public:
  TracedWork(std::shared_ptr<RankTrace> trace, std::size_t id, Work inner, bool async)
      : trace_(std::move(trace)), id_(id), inner_(std::move(inner)), async_(async) {}
  TracedWork(const TracedWork&) = delete;
  TracedWork& operator=(const TracedWork&) = delete;
  ~TracedWork() override {
    if (!closed_) trace_->complete(id_, Clock::now(), false);
  }

  void wait() override {
    const auto begin = Clock::now();
    try {
      inner_.wait();
    } catch (...) {
      close(Clock::now());  // a failed collective still ends here
      throw;
    }
    const auto end = Clock::now();
    // A blocking call waits at once: its collective span says it all; only an asynchronous
    // one has a separate wait, which shows how much of it the rank's work did not hide.
    if (async_) trace_->add_wait(id_, begin, end);
    close(end);
  }
  bool test() override {
    bool done = false;
    try {
      done = inner_.test();
    } catch (...) {
      close(Clock::now());
      throw;
    }
    if (done) close(Clock::now());
    return done;
  }

 private:
  void close(Clock::time_point at) {
    trace_->complete(id_, at);
    closed_ = true;
  }

  std::shared_ptr<RankTrace> trace_;  // the Work may outlive the trace scope
  std::size_t id_;
  Work inner_;
  bool async_;
  bool closed_ = false;
};

/// The observer of one rank's collectives: a span per collective on `trace`.
class CollectiveSpans final : public CollectiveObserver {
 public:
  explicit CollectiveSpans(RankTrace* trace) : trace_(trace) {}

  std::size_t issued(const CommRecord& r) override { return trace_->issue(r); }
  /// Returns `w`, or a Work that closes the span when `w` completes.
  Work started(std::size_t id, Work w, bool async) override {
    if (w.done()) {
      trace_->complete(id, Clock::now());
      return w;
    }
    return Work(std::make_shared<TracedWork>(trace_->shared_from_this(), id, std::move(w), async));
  }
  /// Closes the span now: a collective that returns no Work (split, barrier).
  void finished(std::size_t id) override { trace_->complete(id, Clock::now()); }

 private:
  RankTrace* trace_;
};

}  // namespace dtensor::trace::detail
