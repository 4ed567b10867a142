// dtensor/comm/observer.hpp — the hook through which a rank's collectives are observed (timed),
// owned by comm so that comm includes nothing above it.
//
//   class MyObserver final : public CollectiveObserver { ... };   // trace/collective_span.hpp's is one
//   detail::collective_observer_slot() = &observer;                // this thread's collectives from now on
//
// The communicator reports every call it makes: issued(record) when it is logged (returns an id
// for the call), started(id, work, async) with the backend's Work (the observer may return a
// Work that wraps it, to see its completion), finished(id) for a call that returns no Work
// (split, barrier). With no observer installed — the common case — each report is one
// thread-local load and one branch. The observer must outlive its installation; the Work it
// returns may outlive both (it keeps what it needs).
#pragma once

#include <cstddef>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/work.hpp"

namespace dtensor {

class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  virtual std::size_t issued(const CommRecord& r) = 0;
  virtual Work started(std::size_t id, Work w, bool async) = 0;
  virtual void finished(std::size_t id) = 0;
};

namespace detail {

/// This thread's observer, or nullptr.
inline CollectiveObserver*& collective_observer_slot() noexcept {
  thread_local CollectiveObserver* observer = nullptr;
  return observer;
}

/// A call reported to an observer (none: observer == nullptr) and the id it gave.
struct ObservedCollective {
  CollectiveObserver* observer = nullptr;
  std::size_t id = 0;
};

inline ObservedCollective collective_issued(const CommRecord& r) {
  CollectiveObserver* o = collective_observer_slot();
  if (o == nullptr) [[likely]]
    return {};
  return {o, o->issued(r)};
}

/// Returns `w`, or the observer's Work that sees it complete.
inline Work collective_started(const ObservedCollective& c, Work w, bool async) {
  if (c.observer == nullptr) [[likely]]
    return w;
  return c.observer->started(c.id, std::move(w), async);
}

/// A call that returns no Work has finished.
inline void collective_finished(const ObservedCollective& c) {
  if (c.observer != nullptr) [[unlikely]]
    c.observer->finished(c.id);
}

}  // namespace detail
}  // namespace dtensor
