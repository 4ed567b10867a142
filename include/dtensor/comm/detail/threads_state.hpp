// dtensor/comm/detail/threads_state.hpp — the shared state behind the threads backend.
//
//   World   one per threads::run: the abort flag and its reason, which ranks have left their
//           function, the registry of groups (so an abort or a departure can wake every
//           waiter), the point-to-point mailboxes and the async pool.
//   Group   one per process group, shared by the communicators of all its member ranks: the
//           rendezvous slots of its collectives, keyed by sequence number.
//   Slot    one collective in flight: what each rank posted and the counters of its phases.
//   Task    an asynchronous operation: the WorkState a Work waits on.
//   Pool    the threads that run asynchronous operations; it grows instead of queueing, so
//           that any number of outstanding operations make progress at once (a fixed-size pool
//           could deadlock when ranks issue asynchronous collectives in different orders).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/communicator.hpp"
#include "dtensor/comm/detail/wake_word.hpp"
#include "dtensor/comm/work.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/error.hpp"

namespace dtensor::threads::detail {

using Clock = std::chrono::steady_clock;

/// A deadline `timeout` from now; huge timeouts are clamped so the arithmetic cannot overflow.
inline Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr auto cap = std::chrono::hours(24 * 365);
  return Clock::now() + std::min<Clock::duration>(timeout, cap);
}

/// The text of an exception, whatever it is.
inline std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

// ------------------------------------------------------------------------------ waiting

/// Waits for ready() by spinning for a few microseconds before the caller goes to sleep on a
/// condition variable: most waits inside a collective are short (the peers are already on
/// their way), and waking a sleeping thread costs tens of microseconds. Returns ready().
/// `threads` is the run's rank threads (the world's size, not the group's): when they outnumber
/// the cores it does not spin at all. A spinning waiter then holds a core that a rank with work
/// needs — the peer it waits for, or a rank of another group — and on the README's main job (16
/// rank threads on 2 cores) the waiters' spins and yields stood between the ranks that computed
/// and the cores (a throw-away program of 16 ranks, pairs and the world all-reducing between
/// unequal work: 30 % less wall time, the same CPU time; docs/benchmarks.md, issue 46).
template <class Ready>
bool spin_until(Ready&& ready, int threads) {
  static const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (threads > cores) return ready();
  const auto until = Clock::now() + std::chrono::microseconds(20);
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
    if (i % 64 == 0) {
      if (Clock::now() > until) return false;
      std::this_thread::yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
}

// ------------------------------------------------------------------------------ async work

class Task : public dtensor::detail::WorkState {
 public:
  /// Runs the operation and publishes its outcome; called once, by a pool thread.
  void run() noexcept {
    std::exception_ptr e;
    try {
      execute();
    } catch (...) {
      e = std::current_exception();
    }
    {
      std::lock_guard l(mu_);
      error_ = e;
      done_ = true;
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    std::lock_guard l(mu_);
    if (done_ && error_) std::rethrow_exception(error_);
    return done_;
  }

 protected:
  virtual void execute() = 0;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

template <class F>
class FnTask final : public Task {
 public:
  explicit FnTask(F f) : f_(std::move(f)) {}

 private:
  void execute() override { f_(); }
  F f_;
};

class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() { shutdown(); }

  void submit(std::shared_ptr<Task> t) {
    std::unique_lock l(mu_);
    if (stopped_) {  // the run has ended: the operation fails at once, on the caller's thread
      l.unlock();
      t->run();
      return;
    }
    queue_.push_back(std::move(t));
    if (idle_ >= queue_.size()) {
      l.unlock();
      cv_.notify_one();
    } else {
      threads_.emplace_back([this] { work(); });
    }
  }

  /// Runs what is queued, then joins every thread. Called once all ranks have returned.
  void shutdown() {
    std::vector<std::thread> ts;
    {
      std::lock_guard l(mu_);
      stopped_ = true;
      ts.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : ts) t.join();
  }

 private:
  void work() {
    std::unique_lock l(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(l, [&] { return stopped_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;
      auto t = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      t->run();
      t.reset();
      l.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool stopped_ = false;
};

// ------------------------------------------------------------------------------ memory

/// Where a rank's buffers live when they are not plain host memory. The collectives' copies
/// and reductions go through it, so the same rendezvous serves ranks whose buffers are on a GPU
/// (comm/cuda_threads.cuh implements it with CUDA streams); a null MemOps means host memory,
/// memcpy and threads_reduce.hpp. Copies and reductions are enqueued on the rank's own queue
/// (its stream); fence() waits for them, so a peer never reads a buffer before its contents
/// are there, and a rank never leaves while its own reads of a peer are still in flight.
struct MemOps {
  virtual ~MemOps() = default;
  virtual std::string_view backend() const = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) const = 0;
  /// dst[i] = srcs[0][i] op ... op srcs[n-1][i] in rank order (as threads_reduce.hpp's reduce).
  virtual void reduce(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, std::size_t count) const = 0;
  /// Scratch memory of the same kind as `like`, a buffer of the collective: device memory for a
  /// device buffer, host memory for a host one (a user's all-reduce of a std::vector, which is
  /// reduced on the host and must not land in device memory).
  virtual std::shared_ptr<std::byte> allocate(std::size_t bytes, const void* like) const = 0;
  virtual void fence() const = 0;
};

// ------------------------------------------------------------------------------ rendezvous

/// What one rank brings to a collective. Peers read it (and the buffers it points to) once all
/// ranks have arrived; it is never written after that, so reading needs no lock.
struct Post {
  CollectiveKind kind = CollectiveKind::barrier;
  DType dtype = DType::uint8;
  ReduceOp op = ReduceOp::sum;
  int root = -1;
  std::size_t count = 0;
  const void* send = nullptr;     // what peers read: the caller's buffer or the slot's eager copy
  std::size_t send_bytes = 0;     // how much of it they may read (0: nothing)
  const std::size_t* counts[4] = {};  // all_to_all_v: send counts, send displs, recv counts, recv displs
  int color = 0, key = 0;         // split
  bool lent = false;              // peers read this rank's own memory: it must wait until they are done
  bool strided = false;           // all_to_all: the blocks in `send` lie where `blocks` says
  StridedBlocks blocks{};
  // The operation this collective is part of (a redistribution), compared with the arguments
  // (agreement before data, Communicator::agrees_before_data): a hash of its fingerprint, by
  // value (0: none), since a peer may still validate after this rank has left; and, for the
  // message only, the fingerprint in the issuing rank's Ctx, read on the failure path, where no
  // rank leaves before all have validated.
  std::uint64_t context_key = 0;
  const dtensor::detail::Fingerprint* context = nullptr;
  // The always-on check carried in the rendezvous (Communicator::carries_verify): the record's
  // count and hash by value, compared in validate(); its address, read only to name the call
  // that differed (null: the check is off on this rank).
  const dtensor::detail::VerifyRecord* verify = nullptr;
  std::uint64_t verify_calls = 0, verify_hash = 0;
  int verify_every = 0;
};

class Group;

struct Slot {
  std::uint64_t seq = 0;
  bool in_use = false;
  bool failed = false;      // aborted or timed out before every rank arrived: nobody reads peers
  std::string reason;       // why it failed, for the ranks still waiting and those arriving late
  // Phase counters. `arrived` changes under the group's mutex; the others are counted without
  // it (Group::count); all are atomic so that waiters can spin on them.
  std::atomic<int> arrived{0}, mid{0}, done_reading{0}, left{0};
  std::vector<Post> posts;  // one per rank
  std::vector<char> here;   // which ranks have arrived (to name the missing ones on a timeout)
  std::vector<std::byte> eager;  // small sends are copied here, so their owners need not wait
  std::unique_ptr<std::byte[]> scratch;  // all_reduce's reduced values
  std::size_t scratch_bytes = 0;
  std::vector<std::shared_ptr<Group>> made;  // split: the new group of each rank
  std::vector<int> new_rank;                 // split: each rank's rank in it
};

/// Sends up to this many bytes are copied into the slot on arrival ("eager"), which spares the
/// sender the wait for its peers to finish reading; larger ones are read in place (zero-copy).
inline constexpr std::size_t eager_limit = 8192;

// ------------------------------------------------------------------------------ the run

using MailKey = std::tuple<std::uint64_t, int, int, int>;  // group id, src, dst (group ranks), tag

/// A message in flight; it lives on the sender's stack until the receiver has copied it.
struct Message {
  const void* buf = nullptr;
  std::size_t count = 0;
  DType dtype = DType::uint8;
  std::uint64_t ticket = 0;  // its place among the sends of its (group, src, dst, tag)
  bool taken = false;  // a receiver is copying it: the sender must wait for `done`, whatever happens
  bool done = false;
  std::string error{};  // set by the receiver when the two sides disagree
};

/// Which ranks have left the function given to threads::run. A rank that has left and has no
/// asynchronous operation still pending can never again arrive in a collective or send or
/// receive a message: it is "gone", and whoever waits for it is released at once (instead of
/// after the timeout) with an error naming it.
class Departures {
 public:
  explicit Departures(int n)
      : left_(new std::atomic<int>[std::size_t(n)]), pending_(new std::atomic<int>[std::size_t(n)]) {
    for (int r = 0; r < n; ++r) left_[std::size_t(r)] = still_here, pending_[std::size_t(r)] = 0;
  }

  enum : int { still_here = 0, returned = 1, threw = 2 };

  /// Rank `world_rank` left its function; returns true when it is now gone.
  bool leave(int world_rank, bool by_throwing) {
    left_[std::size_t(world_rank)] = by_throwing ? threw : returned;
    return pending_[std::size_t(world_rank)] == 0;
  }
  /// An asynchronous operation of `world_rank` was issued / has finished. finish() returns
  /// true when that made the rank gone. (Sequentially consistent atomics: of leave() and the
  /// last finish(), at least one sees the other's write, so the departure is never missed.)
  void start(int world_rank) { ++pending_[std::size_t(world_rank)]; }
  bool finish(int world_rank) {
    return --pending_[std::size_t(world_rank)] == 0 && left_[std::size_t(world_rank)] != still_here;
  }

  bool gone(int world_rank) const {
    return left_[std::size_t(world_rank)] != still_here && pending_[std::size_t(world_rank)] == 0;
  }
  /// "returned from" or "threw out of", for messages about a gone rank.
  const char* how_left(int world_rank) const {
    return left_[std::size_t(world_rank)] == threw ? "threw out of" : "returned from";
  }

 private:
  std::unique_ptr<std::atomic<int>[]> left_, pending_;
};

class World {
 public:
  explicit World(int n) : size(n), departures(n) {}
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  const int size;

  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  /// Why the run was aborted; valid once aborted() returned true (written once, before the flag).
  const std::string& reason() const noexcept { return reason_; }
  /// The world rank whose failure aborted the run (-1 when not a rank's).
  int origin() const noexcept { return origin_; }

  /// Aborts the run (the first reason wins) and wakes every thread waiting in it.
  inline void abort(int origin, std::string reason);

  /// Who has left the run's function; waiters check it for the ranks they wait for.
  Departures departures;
  /// Rank `world_rank` left its function (after its last statement or by throwing): wakes every
  /// waiter, so that those waiting for it fail now rather than at their timeout.
  void leave(int world_rank, bool by_throwing) {
    if (departures.leave(world_rank, by_throwing)) wake_all();
  }
  /// An asynchronous operation of `world_rank` finished (see Departures).
  void async_finished(int world_rank) {
    if (departures.finish(world_rank)) wake_all();
  }

  void add(const std::shared_ptr<Group>& g) {
    std::lock_guard l(mu_);
    std::erase_if(groups_, [](const std::weak_ptr<Group>& w) { return w.expired(); });
    groups_.push_back(g);
  }
  std::uint64_t new_group_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }

  /// After every rank returned: operations still pending fail, the pool's threads are joined.
  void finish() {
    abort(-1, "the threads::run has ended");
    pool.shutdown();
  }

  Pool pool;

  // Point-to-point mailboxes, FIFO per (group, src, dst, tag). Sends and receives draw tickets
  // in program order when they are issued; the k-th receive takes the k-th send, so messages
  // do not overtake each other even when asynchronous ones run on different pool threads
  // (MPI's non-overtaking rule).
  std::mutex p2p_mu;
  /// The word world rank r's sends and receives sleep on: a message posted to r, or one of r's
  /// taken and copied, moves it (one rank's waiters wake, not every waiter of the run).
  WakeWord& p2p_wake(int world_rank) { return p2p_wake_[std::size_t(world_rank)]; }
  std::map<MailKey, std::deque<Message*>> mail;  // ordered by ticket
  std::map<MailKey, std::uint64_t> send_tickets, recv_tickets;

  /// The next ticket of a send (or receive) on `key`.
  std::uint64_t take_ticket(const MailKey& key, bool sending) {
    std::lock_guard l(p2p_mu);
    return (sending ? send_tickets : recv_tickets)[key]++;
  }

 private:
  std::mutex mu_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  int origin_ = -1;
  inline void wake_all();
  std::vector<std::weak_ptr<Group>> groups_;
  std::atomic<std::uint64_t> next_id_{0};
  std::unique_ptr<WakeWord[]> p2p_wake_ = std::make_unique<WakeWord[]>(std::size_t(size));
};

class Group {
 public:
  Group(std::shared_ptr<World> w, std::vector<int> ranks)
      : world(std::move(w)), world_ranks(std::move(ranks)), size(int(world_ranks.size())), id(world->new_group_id()) {}

  /// Creates a group and registers it with its world, so that an abort reaches its waiters.
  static std::shared_ptr<Group> make(const std::shared_ptr<World>& w, std::vector<int> ranks) {
    auto g = std::make_shared<Group>(w, std::move(ranks));
    w->add(g);
    return g;
  }

  const std::shared_ptr<World> world;
  const std::vector<int> world_ranks;  // group rank -> world rank
  const int size;
  const std::uint64_t id;

  std::mutex mu;  // the slots: finding, posting to, failing and recycling one
  /// Moved (and its sleepers woken) when a rendezvous completes or fails, and by World::wake_all;
  /// every rank waiting in one of this group's collectives sleeps on it (detail/wake_word.hpp).
  WakeWord wake;

  /// Counts this rank in `counter` without the mutex and wakes the waiters when the count is
  /// complete (WakeWord: the counter's increment comes before the word's, so a waiter that read
  /// the word before seeing an incomplete count is woken).
  void count(std::atomic<int>& counter) {
    if (++counter == size) wake.wake();
  }

  /// Waits until every rank has been counted in `counter`: spins briefly, then sleeps.
  void wait_all(const std::atomic<int>& counter) {
    auto all = [&] { return counter.load() == size; };
    if (spin_until(all, world->size)) return;
    for (;;) {
      const auto seen = wake.now();
      if (all()) return;
      wake.wait(seen);
    }
  }

  /// The slot of collective `seq`, created by the first rank to arrive. Caller holds `mu`.
  Slot& slot(std::uint64_t seq) {
    Slot* free = nullptr;
    for (auto& s : slots_) {
      if (s->in_use && s->seq == seq) return *s;
      if (!s->in_use && !free) free = s.get();
    }
    if (!free) free = slots_.emplace_back(std::make_unique<Slot>()).get();
    Slot& s = *free;
    s.seq = seq;
    s.in_use = true;
    s.failed = false;
    s.reason.clear();
    s.arrived = 0;
    s.mid = 0;
    s.done_reading = 0;
    s.left = 0;
    s.posts.resize(std::size_t(size));
    s.here.assign(std::size_t(size), 0);
    return s;
  }

  /// A rank is done with the slot; the last one recycles it. Caller holds `mu`.
  void leave(Slot& s) {
    if (++s.left == size) recycle(s);
  }
  /// As leave(), for a caller that does not hold `mu` (the common way out of a collective).
  void leave_unlocked(Slot& s) {
    if (++s.left < size) return;
    std::lock_guard l(mu);
    recycle(s);
  }

 private:
  /// Makes a slot that every rank has left free for another collective. Caller holds `mu`.
  void recycle(Slot& s) {
    s.in_use = false;
    s.made.clear();
    if (s.scratch_bytes > (std::size_t(64) << 20)) {  // don't pin a huge buffer for good
      s.scratch.reset();
      s.scratch_bytes = 0;
    }
  }

  std::vector<std::unique_ptr<Slot>> slots_;  // reused, so a collective allocates nothing
};

inline void World::abort(int origin, std::string reason) {
  {
    std::lock_guard l(mu_);
    if (aborted()) return;
    reason_ = std::move(reason);
    origin_ = origin;
    aborted_.store(true, std::memory_order_release);
  }
  wake_all();
}

/// Wakes every thread waiting in a collective or a point-to-point operation of this run.
inline void World::wake_all() {
  std::vector<std::shared_ptr<Group>> gs;
  {
    std::lock_guard l(mu_);
    for (auto& w : groups_)
      if (auto g = w.lock()) gs.push_back(std::move(g));
  }
  // The flag (abort or departure) is set before the words move, so a waiter that read a word
  // before the flag was set is woken, and one that read it after sees the flag.
  for (auto& g : gs) g->wake.wake();
  for (int r = 0; r < size; ++r) p2p_wake(r).wake();
}

}  // namespace dtensor::threads::detail
