// dtensor/comm/work.hpp — the handle of a collective that may still be running.
//
//   Work w = comm.all_gather_async(send, recv);
//   ...compute that does not touch send or recv...
//   w.wait();            // rethrows if the collective failed on this rank
//
// A default-constructed Work is already complete. Buffers passed to an asynchronous call must
// stay alive and untouched until wait() returns (or test() has returned true).
#pragma once

#include <memory>
#include <utility>

namespace dtensor {

namespace detail {
/// What a backend implements for one pending operation.
struct WorkState {
  virtual ~WorkState() = default;
  virtual void wait() = 0;   // blocks until done; throws dtensor::Error on failure
  virtual bool test() = 0;   // true when done; throws on failure
};
}  // namespace detail

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  void wait() {
    if (state_) {
      auto s = std::move(state_);
      s->wait();
    }
  }
  bool test() {
    if (!state_) return true;
    if (!state_->test()) return false;
    state_.reset();
    return true;
  }
  bool done() const noexcept { return !state_; }

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace dtensor
