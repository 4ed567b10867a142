// dtensor/kernels/host/parallel.hpp — intra-op parallelism of the host kernels: a rank's
// persistent pool of worker threads, and the row-partitioned parallel_for the kernels run on it.
//
//   IntraOpThreads scope(2);          // this thread (a rank) gets a pool of 1 worker for the scope's life
//   intra_op_threads()                // the calling thread's count: 1 without a scope
//   detail::parallel_for(rows, grain, [&](Extent r0, Extent r1) { /* rows r0 .. r1 */ });
//
// Why a pool per rank: ranks of the threads backend are threads of one process, each with its
// own cores in mind (train_gpt --intra-op-threads N gives each rank N - 1 workers, started once;
// no thread is spawned per op). A kernel asks for parallel_for over its independent rows; with
// no pool, on a worker, inside another parallel_for, or for less than two grains of work, the
// body runs once over all rows on the calling thread — the serial kernel, unchanged.
//
// Determinism: parallel_for only partitions the rows (contiguous blocks, up to 4 per thread,
// claimed by whichever thread is free: a worker the scheduler wakes late costs no waiting);
// a kernel parallelizes only work whose rows are independent, and keeps every sum over rows (a
// bias or norm weight gradient, a loss) in its serial order — or splits it over columns, each
// column summed over all rows in row order. So a kernel gives the same bits for any thread count
// (tests/unit/test_kernels_host_simd.cpp checks 1 against 2 and 3 threads).
//
// Why not OpenMP: the project builds without -fopenmp and links nothing for threads beyond
// std::thread; OpenMP's runtime is process-wide (one team size, OMP_NUM_THREADS), while here
// each rank-thread owns its pool; and libgomp's spinning workers (OMP_WAIT_POLICY) are what
// collapsed PyTorch's 2-thread runs on a loaded machine (docs/benchmarks.md). This pool spins
// briefly (detail::pool_spins) and then sleeps on the atomic (futex), both on the workers'
// and on the caller's side.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::host {

namespace detail {

/// Polls of an atomic before a thread sleeps on it (each a pause instruction, tens of cycles):
/// a few microseconds, the gap between two kernels of one step, without burning a loaded CPU.
inline constexpr int pool_spins = 1000;

inline void cpu_relax() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  __builtin_ia32_pause();
#endif
}

/// Waits until a.load() != old: spins pool_spins polls, then sleeps (std::atomic::wait).
template <class V>
V wait_change(const std::atomic<V>& a, V old) {
  for (int i = 0; i < pool_spins; ++i) {
    const V v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    cpu_relax();
  }
  for (;;) {
    a.wait(old, std::memory_order_acquire);
    const V v = a.load(std::memory_order_acquire);
    if (v != old) return v;
  }
}

/// Set on the pool's workers and on a caller inside parallel_for: a nested parallel_for runs serially.
inline thread_local bool in_parallel_region = false;

}  // namespace detail

/// threads - 1 worker threads that run the parts of one job at a time with the owning thread.
/// Only the thread that created it may call run() (one job at a time).
///
/// Parts are claimed, not assigned: the caller takes part 0 and then, like each worker that wakes,
/// claims the next unclaimed part (one compare-exchange on a word holding the job, its part count
/// and the next part), until none is left; it then waits only for parts a worker has claimed and
/// not finished. So a worker that a loaded machine does not schedule in time costs no waiting: the
/// caller runs its parts. Which thread runs a part does not change the result (the parts' rows are
/// independent, parallel_for below), so the bits are the same however the claims fall.
class IntraOpPool {
 public:
  explicit IntraOpPool(int threads) {
    detail::check(threads >= 1 && threads <= max_parts, "IntraOpPool", "thread count must be in 1 .. ", max_parts,
                  ", got ", threads);
    workers_.reserve(std::size_t(threads - 1));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  IntraOpPool(const IntraOpPool&) = delete;
  IntraOpPool& operator=(const IntraOpPool&) = delete;
  ~IntraOpPool() {
    stop_ = true;
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const { return int(workers_.size()) + 1; }

  /// The most parts one job may have.
  static constexpr int max_parts = 0xffff;

  /// body(p) once for each p in [0, parts), on this thread and the workers; returns when all are
  /// done. The first exception a part threw is rethrown here (the other parts still run).
  template <class Body>
  void run(int parts, Body& body) {
    run(parts, &body, [](void* ctx, int p) { (*static_cast<Body*>(ctx))(p); });
  }

  /// The same, for call(ctx, p): the job's one body, whatever the kernel (not one per kernel's
  /// lambda: over 30 in a GPT training program).
  void run(int parts, void* ctx, void (*call)(void*, int)) {
    detail::check(parts >= 1 && parts <= max_parts, "IntraOpPool::run", "part count must be in 1 .. ", max_parts,
                  ", got ", parts);
    ctx_ = ctx;
    call_ = call;
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const std::uint32_t job = epoch_.load(std::memory_order_relaxed) + 1;
    // The job, its part count, and part 0 already claimed (by this thread).
    state_.store(std::uint64_t(job) << 32 | std::uint64_t(parts) << 16 | 1u, std::memory_order_release);
    epoch_.store(job, std::memory_order_release);
    epoch_.notify_all();
    run_part(0);
    int mine = 1;
    while (const int p = claim(job)) {
      run_part(p);
      ++mine;
    }
    int done = done_.fetch_add(mine, std::memory_order_acq_rel) + mine;
    while (done != parts) done = detail::wait_change(done_, done);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  /// The next unclaimed part of `job`, claimed; 0 when none is left (part 0 is always the caller's).
  int claim(std::uint32_t job) {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if (std::uint32_t(s >> 32) != job) return 0;
      const auto parts = int((s >> 16) & 0xffff), next = int(s & 0xffff);
      if (next >= parts) return 0;
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) return next;
    }
  }
  void run_part(int p) {
    try {
      call_(ctx_, p);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void work() {
    detail::in_parallel_region = true;
    std::uint32_t seen = 0;
    for (;;) {
      seen = detail::wait_change(epoch_, seen);
      if (stop_) return;
      // A claimed part keeps the job alive (the caller waits for it), so ctx_ and call_ stay
      // valid until done_ counts it.
      while (const int p = claim(seen)) {
        run_part(p);
        const int parts = int((state_.load(std::memory_order_relaxed) >> 16) & 0xffff);
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::atomic<std::uint32_t> epoch_{0};  // the current job's number (one more at the stop)
  std::atomic<std::uint64_t> state_{0};  // job << 32 | parts << 16 | next unclaimed part
  std::atomic<int> done_{0};             // parts finished
  bool stop_ = false;                    // written before the epoch's release, read after its acquire
  void* ctx_ = nullptr;
  void (*call_)(void*, int) = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

namespace detail {
/// The pool of the calling thread (a rank), installed by IntraOpThreads; null: serial kernels.
inline thread_local IntraOpPool* current_pool = nullptr;
}  // namespace detail

/// For its lifetime, the host kernels called by this thread run on `threads` threads (this one
/// and threads - 1 workers it starts); 1 changes nothing. Scopes nest (the inner one wins).
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads) : previous_(detail::current_pool) {
    detail::check(threads >= 1 && threads <= max_threads, "IntraOpThreads", "thread count must be in 1 .. ",
                  max_threads, ", got ", threads);
    if (threads > 1) pool_ = std::make_unique<IntraOpPool>(threads);
    detail::current_pool = pool_.get();
  }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;
  ~IntraOpThreads() { detail::current_pool = previous_; }

  static constexpr int max_threads = 256;

 private:
  std::unique_ptr<IntraOpPool> pool_;
  IntraOpPool* previous_;
};

/// The threads the host kernels called from this thread may use (1: serial).
inline int intra_op_threads() { return detail::current_pool ? detail::current_pool->threads() : 1; }

namespace detail {

/// body(r0, r1) over contiguous blocks of [0, rows), in parallel on the calling thread's pool
/// when there is one and the rows make at least two blocks of `grain` rows (the smallest block
/// worth a wake-up): up to 4 blocks per thread, claimed by the threads as they come free (the
/// caller first). Block boundaries are multiples of `align` rows (except the end). With one
/// block, body(0, rows) runs here: the serial kernel.
template <class Body>
void parallel_for(Extent rows, Extent grain, Body&& body, Extent align = 1) {
  IntraOpPool* pool = current_pool;
  grain = std::max<Extent>(grain, 1);
  // Up to 4 parts per thread: a worker that wakes late still finds parts to claim.
  const Extent most = pool && !in_parallel_region ? std::min<Extent>(4 * pool->threads(), rows / grain) : 1;
  if (most <= 1) {
    if (rows > 0) body(Extent(0), rows);
    return;
  }
  const int parts = int(most);
  auto bound = [&](int p) {
    if (p >= parts) return rows;
    const Extent b = rows * p / parts;
    return std::min(rows, (b + align - 1) / align * align);
  };
  auto part = [&](int p) {
    const Extent r0 = bound(p), r1 = bound(p + 1);
    if (r0 < r1) body(r0, r1);
  };
  in_parallel_region = true;
  struct Reset {
    ~Reset() { in_parallel_region = false; }
  } reset;
  pool->run(parts, part);
}

/// The rows per block for a kernel doing about `work_per_row` element operations per row: a
/// block of at least ~32k, tens of microseconds, well above the cost of waking a worker.
inline Extent grain_for(Extent work_per_row) {
  constexpr Extent min_block_work = Extent(1) << 15;
  return std::max<Extent>(1, min_block_work / std::max<Extent>(work_per_row, 1));
}

}  // namespace detail
}  // namespace dtensor::kernels::host
