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
// Determinism: parallel_for only partitions the rows (contiguous blocks, part 0 on the caller);
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
inline constexpr int pool_spins = 2000;

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
/// Only the thread that created it may call run() (one job at a time, no locks on the fast path).
class IntraOpPool {
 public:
  explicit IntraOpPool(int threads) {
    detail::check(threads >= 1, "IntraOpPool", "thread count must be >= 1, got ", threads);
    workers_.reserve(std::size_t(threads - 1));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
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

  /// body(p) for p in [0, parts) (parts <= threads()): part 0 here, part p on worker p. Returns
  /// when all are done; the first exception a part threw is rethrown here.
  template <class Body>
  void run(int parts, Body& body) {
    parts_ = std::min(parts, threads());
    ctx_ = &body;
    call_ = [](void* ctx, int p) { (*static_cast<Body*>(ctx))(p); };
    error_ = nullptr;
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_release);  // publishes the job to the workers
    epoch_.notify_all();
    try {
      body(0);
    } catch (...) {
      keep_error(std::current_exception());
    }
    for (int left = pending_.load(std::memory_order_acquire); left != 0;)
      left = detail::wait_change(pending_, left);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(int index) {
    detail::in_parallel_region = true;
    std::uint32_t seen = 0;
    for (;;) {
      seen = detail::wait_change(epoch_, seen);
      if (stop_) return;
      if (index < parts_) {
        try {
          call_(ctx_, index);
        } catch (...) {
          keep_error(std::current_exception());
        }
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }
  void keep_error(std::exception_ptr e) {
    std::lock_guard lock(error_mutex_);
    if (!error_) error_ = e;
  }

  std::vector<std::thread> workers_;
  std::atomic<std::uint32_t> epoch_{0};  // one more per job (and at the stop)
  std::atomic<int> pending_{0};          // workers that have not finished the current job
  bool stop_ = false;                    // written before the epoch's release, read after its acquire
  int parts_ = 0;
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
/// worth a wake-up); block boundaries are multiples of `align` rows (except the end). With one
/// block, body(0, rows) runs here: the serial kernel.
template <class Body>
void parallel_for(Extent rows, Extent grain, Body&& body, Extent align = 1) {
  IntraOpPool* pool = current_pool;
  grain = std::max<Extent>(grain, 1);
  const Extent most = pool && !in_parallel_region ? std::min<Extent>(pool->threads(), rows / grain) : 1;
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
