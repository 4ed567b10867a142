// dtensor/comm/detail/wake_word.hpp — a word threads sleep on until it changes (an event count):
// the threads backend's waits for a collective's peers and for a message.
//
//   const auto seen = word.now();          // 1. read the word
//   if (ready()) return;                   // 2. check what the waiter waits for
//   word.wait_until(seen, deadline);       // 3. sleep unless the word moved since 1.
//   ...                                    //    (returns at once, at a wake(), at the deadline, or spuriously)
//   make_ready(); word.wake();             // the other side: publish, then wake every sleeper
//
// Why not a condition variable (threads backend, issue 46): a condition variable's sleepers wake
// holding nothing and must each take its mutex again before they can look at anything, one
// after another. The collectives' waiters look only at atomic counters, so a completed
// rendezvous woke its group's N-1 parked ranks into a queue on the group's mutex: on the
// README's main job (16 rank threads on 2 cores) 28 % of all context switches were that queue
// (`perf record -e context-switches -g`, docs/benchmarks.md). Here a woken waiter takes no lock.
// On Linux the word is a futex (one system call to sleep, one to wake everyone, none when no one
// sleeps); elsewhere a mutex and condition variable of the word's own stand in for it.
//
// No lost wake-up: a sleeper counts itself in `sleepers_` and then has the kernel compare the
// word; wake() changes the word and then reads `sleepers_` (both sequentially consistent), so
// either the sleeper's comparison sees the new word or wake() sees the sleeper.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#else
#include <condition_variable>
#include <mutex>
#endif

namespace dtensor::threads::detail {

class WakeWord {
 public:
  using Clock = std::chrono::steady_clock;

  WakeWord() = default;
  WakeWord(const WakeWord&) = delete;
  WakeWord& operator=(const WakeWord&) = delete;

  /// The word's value now: read it before checking the condition waited for.
  std::uint32_t now() const noexcept { return word_.load(); }

  /// Sleeps while the word still equals `seen`, at most until `deadline`. Returns whether the
  /// deadline is still ahead (woken, the word had already moved, or spuriously): the caller
  /// checks its condition again either way.
  bool wait_until(std::uint32_t seen, Clock::time_point deadline) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return false;
    ++sleepers_;
#if defined(__linux__)
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(left);
    const timespec rel{static_cast<time_t>(s.count()),
                       static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(left - s).count())};
    // EAGAIN (the word moved), EINTR and ETIMEDOUT all return to the caller's loop.
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, seen, &rel, nullptr, 0);
#else
    {
      std::unique_lock l(mu_);
      cv_.wait_until(l, deadline, [&] { return word_.load() != seen; });
    }
#endif
    --sleepers_;
    return Clock::now() < deadline;
  }
  /// As wait_until, without a deadline.
  void wait(std::uint32_t seen) { wait_until(seen, Clock::time_point::max()); }

  /// Moves the word and wakes every thread sleeping on it (no system call when none sleeps).
  void wake() noexcept {
    ++word_;
    if (sleepers_.load() == 0) return;
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
    {
      std::lock_guard l(mu_);
    }  // a sleeper is inside cv_.wait_until, not between its check and its wait
    cv_.notify_all();
#endif
  }

 private:
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                    std::atomic<std::uint32_t>::is_always_lock_free,
                "a futex word must be a plain 32-bit word");
  std::atomic<std::uint32_t> word_{0};
  std::atomic<int> sleepers_{0};
#if !defined(__linux__)
  std::mutex mu_;
  std::condition_variable cv_;
#endif
};

}  // namespace dtensor::threads::detail
