// dtensor/trace/collective_span.hpp — how the communicator times its collectives for a trace.
//
//   auto span = trace::detail::collective_issued(record);            // in Communicator, with the CommLog entry
//   return trace::detail::collective_started(span, do_all_reduce(...), async);
//
// collective_issued opens a span on the calling thread's active trace (nothing when there is
// none: one thread-local load and one branch). collective_started closes it when the Work
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
#include "dtensor/comm/work.hpp"
#include "dtensor/trace/rank_trace.hpp"

namespace dtensor::trace::detail {

/// An open collective span: where it is recorded (nullptr: no trace was active) and its id.
struct CollectiveSpan {
  RankTrace* trace = nullptr;
  std::size_t id = 0;
};

inline CollectiveSpan collective_issued(const CommRecord& r) {
  RankTrace* t = active_trace();
  if (t == nullptr) [[likely]]
    return {};
  return {t, t->issue(r)};
}

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

/// Returns `w`, or a Work that closes `span` when `w` completes.
inline Work collective_started(const CollectiveSpan& span, Work w, bool async) {
  if (span.trace == nullptr) [[likely]]
    return w;
  if (w.done()) {
    span.trace->complete(span.id, Clock::now());
    return w;
  }
  return Work(std::make_shared<TracedWork>(span.trace->shared_from_this(), span.id, std::move(w), async));
}

/// Closes `span` now: a collective that returns no Work (split, barrier).
inline void collective_finished(const CollectiveSpan& span) {
  if (span.trace != nullptr) [[unlikely]]
    span.trace->complete(span.id, Clock::now());
}

}  // namespace dtensor::trace::detail
