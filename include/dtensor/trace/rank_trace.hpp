// dtensor/trace/rank_trace.hpp — the spans one rank records while a trace scope is active.
//
//   RankTrace* t = trace::detail::active_trace();   // this thread's, or nullptr (one load, one branch)
//   auto depth = t->open("forward h.0");            // a compute span on the rank's own track ...
//   t->close(depth);                                // ... closed (with anything opened inside it)
//   auto id = t->issue(record);                     // a collective, from issue ...
//   t->complete(id, Clock::now());                  // ... to completion
//
// A RankTrace belongs to one rank: a thread of the threads backend, a process under MPI. The
// trace scope (trace/trace.hpp) makes it the calling thread's active trace; the communicator
// (comm/communicator.hpp) and the compute spans record into it only while one is active, so
// code outside a scope pays one thread-local load and one branch per collective or span.
// Compute spans nest (a stack, as the calls they time); collectives overlap freely (an
// asynchronous one completes whenever its Work does), so they are kept apart. A Work may
// complete on another thread than the one that issued it: every member takes the lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtensor/comm/comm_log.hpp"

namespace dtensor::trace {

using Clock = std::chrono::steady_clock;

enum class SpanKind : std::uint8_t {
  compute,     // a phase, a model unit or an op: on the rank's own track
  collective,  // issue to completion of one collective (one per CommLog record)
  wait,        // the time the rank blocked in Work::wait on an asynchronous collective
};

constexpr std::string_view name_of(SpanKind k) {
  switch (k) {
    case SpanKind::compute: return "compute";
    case SpanKind::collective: return "collective";
    case SpanKind::wait: return "wait";
  }
  return "?";
}

struct SpanRecord {
  SpanKind kind = SpanKind::compute;
  std::string name;
  Clock::time_point begin{}, end{};
  std::optional<CommRecord> collective;  // collective and wait spans: what the CommLog records
  bool finished = false;  // false: still open when read (written with zero length, flagged)
  bool awaited = true;    // collective: completed through wait() or test(); false: its Work was dropped
};

class RankTrace : public std::enable_shared_from_this<RankTrace> {
 public:
  explicit RankTrace(int rank) : rank_(rank) {}
  RankTrace(const RankTrace&) = delete;
  RankTrace& operator=(const RankTrace&) = delete;

  /// The rank whose track this is (the world rank).
  int rank() const noexcept { return rank_; }

  /// Opens a compute span inside the open ones; returns its depth, for close().
  std::size_t open(std::string name) {
    std::lock_guard lock(mutex_);
    spans_.push_back({SpanKind::compute, std::move(name), Clock::now(), {}, std::nullopt, false, true});
    open_compute_.push_back(spans_.size() - 1);
    return open_compute_.size() - 1;
  }
  /// Closes the compute span at `depth` and the ones still open inside it (their callers forgot
  /// them or threw): the spans of one track always nest, as a trace viewer requires.
  void close(std::size_t depth) {
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    while (open_compute_.size() > depth) {
      auto& s = spans_[open_compute_.back()];
      s.end = now;
      s.finished = true;
      open_compute_.pop_back();
    }
  }
  /// The number of compute spans open now.
  std::size_t depth() const {
    std::lock_guard lock(mutex_);
    return open_compute_.size();
  }

  /// A collective issued now; returns its id for complete().
  std::size_t issue(const CommRecord& r) {
    std::lock_guard lock(mutex_);
    spans_.push_back({SpanKind::collective, std::string(name_of(r.kind)) + " " + r.group, Clock::now(), {}, r, false,
                      true});
    return spans_.size() - 1;
  }
  /// The collective `id` completed at `at`; `awaited` false when its Work was dropped unfinished.
  void complete(std::size_t id, Clock::time_point at, bool awaited = true) {
    std::lock_guard lock(mutex_);
    auto& s = spans_.at(id);
    if (s.finished) return;
    s.end = at;
    s.finished = true;
    s.awaited = awaited;
  }
  /// This rank blocked from `begin` to `end` waiting for the collective `id`.
  void add_wait(std::size_t id, Clock::time_point begin, Clock::time_point end) {
    std::lock_guard lock(mutex_);
    const auto r = spans_.at(id).collective;
    spans_.push_back({SpanKind::wait, "wait " + spans_.at(id).name, begin, end, r, true, true});
  }

  /// A copy of every span so far, in the order they were recorded (open ones unfinished).
  std::vector<SpanRecord> spans() const {
    std::lock_guard lock(mutex_);
    return spans_;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    spans_.clear();
    open_compute_.clear();
  }

 private:
  mutable std::mutex mutex_;
  int rank_;
  std::vector<SpanRecord> spans_;
  std::vector<std::size_t> open_compute_;  // indices into spans_, innermost last
};

namespace detail {
/// The calling thread's active trace (set by trace::TraceScope), or nullptr.
inline RankTrace*& active_trace_slot() noexcept {
  thread_local RankTrace* active = nullptr;
  return active;
}
inline RankTrace* active_trace() noexcept { return active_trace_slot(); }
}  // namespace detail

}  // namespace dtensor::trace
