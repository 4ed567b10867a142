// dtensor/comm/nccl.cuh — the NCCL backend: one GPU per rank, ranks are MPI processes.
//
//   int main(int argc, char** argv) {
//     dtensor::mpi::Environment env(argc, argv);
//     dtensor::CommPtr world = dtensor::nccl::world();      // collective over MPI_COMM_WORLD
//     dtensor::Tensor<float, 1, dtensor::cuda_space> x({1 << 20});
//     world->all_reduce(x.span(), dtensor::ReduceOp::avg);  // ncclAllReduce(ncclAvg)
//   }
//
// Start-up: rank 0 calls ncclGetUniqueId and MPI_Bcast sends the id to the others; each rank
// picks GPU (local rank % visible GPUs) — the local rank from MPI_Comm_split_type(SHARED) — and
// creates a non-blocking NCCL communicator (ncclConfig_t::blocking = 0) so that no NCCL call can
// block the host: every call that returns ncclInProgress is polled with ncclCommGetAsyncError
// against the communicator's timeout(). Sub-groups come from ncclCommSplit.
//
// Streams: each communicator has its own non-blocking stream. An operation first makes that
// stream wait for an event recorded on the caller's current stream (cuda::current_stream(), so
// inputs written by earlier kernels are complete), runs there, and records a completion event.
// The Work waits on that event on the host, polling cudaEventQuery and ncclCommGetAsyncError;
// test() queries them once. Compute issued on the caller's stream meanwhile overlaps the
// communication. A blocking call is the same operation waited on at once.
//
// Failure: an NCCL error (from a call or asynchronous, from ncclCommGetAsyncError) or a wait
// longer than timeout() aborts the communicator (ncclCommAbort, which also stops its kernels,
// so a dead peer cannot hang the job) and throws a dtensor::Error naming the op, the group, the
// rank, NCCL's message (ncclGetErrorString, ncclGetLastError) and backend_code() = the
// ncclResult_t. Every later call on that communicator throws at once.
//
// Buffers: device memory (cuda_space) is used in place. Host buffers work too — the layers
// above pass small host arrays (check_collectives fingerprints, the extents distribute
// broadcasts) — by staging through pinned and device memory (a slow path for small data).
// Uneven shards arrive padded by the redistribution executor, so every collective has equal
// blocks. all_to_all and all_to_all_v are grouped ncclSend/ncclRecv. ReduceOp::avg is ncclAvg.
//
// Point-to-point: NCCL matches sends and receives between two ranks in issue order and has no
// tags (the tag is ignored), and a send blocks its stream until the peer receives. So
// asynchronous sends and receives issued one after another are batched into one NCCL group,
// closed by the next collective, blocking call or wait: a ring step (send_recv) cannot
// deadlock, as with ncclGroupStart/End by hand. A size mismatch between a send and its
// receive is not detected by NCCL (it is undefined behaviour there).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/cuda_space.cuh"

namespace dtensor::nccl {

namespace detail {

using Clock = std::chrono::steady_clock;
using dtensor::detail::cat;

inline ncclDataType_t datatype(DType t) {
  switch (t) {
    case DType::float32: return ncclFloat32;
    case DType::float64: return ncclFloat64;
    case DType::bfloat16: return ncclBfloat16;
    case DType::int32: return ncclInt32;
    case DType::int64: return ncclInt64;
    case DType::uint8: return ncclUint8;
  }
  return ncclUint8;
}

inline ncclRedOp_t red_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

/// Pinned host buffers for staging host data, reused: cudaMallocHost is slow and cudaFreeHost
/// synchronizes the device, so they are freed only with the communicator.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  ~PinnedPool() {
    for (auto& [n, p] : free_) dtensor::detail::cuda_report(cudaFreeHost(p), "cudaFreeHost");
  }
  std::shared_ptr<std::byte> get(std::size_t bytes) {
    void* p = nullptr;
    {
      std::lock_guard l(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->first >= bytes) {
          p = it->second;
          bytes = it->first;
          free_.erase(it);
          break;
        }
    }
    if (!p) DTENSOR_CUDA_CHECK(cudaMallocHost(&p, bytes));
    auto self = shared_from_this();
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [self, bytes](std::byte* q) {
      std::lock_guard l(self->mu_);
      self->free_.emplace_back(bytes, q);
    });
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::size_t, void*>> free_;
};

/// What every NCCL communicator of a group shares with its pending operations.
struct State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0, size = 0;
  std::string label;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;          // guards the fields below and every NCCL call on comm
  bool aborted = false;
  std::string abort_reason;
  std::shared_ptr<PinnedPool> pinned = std::make_shared<PinnedPool>();
  struct Batch;           // open group of asynchronous sends and receives
  std::shared_ptr<Batch> batch;

  Error error(std::string_view op, const std::string& what, int code = 0) const {
    return Error(cat(op, "[", label, "]"), what, rank, code);
  }
  [[noreturn]] void fail_nccl(std::string_view op, const char* call, ncclResult_t r) {
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    const std::string what = cat(call, " failed: ", ncclGetErrorString(r), last && *last ? cat(" (", last, ")") : "");
    abort_locked(what);
    throw error(op, what, int(r));
  }
  /// Caller holds mu. Stops the communicator's kernels; every later call fails with `why`.
  void abort_locked(const std::string& why) {
    if (aborted) return;
    aborted = true;
    abort_reason = why;
    if (comm) ncclCommAbort(comm);  // its own failure cannot be reported better than `why`
    comm = nullptr;
  }
  void check_alive(std::string_view op) const {
    if (aborted) throw error(op, cat("the NCCL communicator was aborted earlier: ", abort_reason));
  }
  /// Caller holds mu. Completes an NCCL call on a non-blocking communicator: polls while it is
  /// in progress, fails on an error or after the timeout (then aborts).
  void settle(std::string_view op, const char* call, ncclResult_t r, ncclComm_t c = nullptr) {
    if (!c) c = comm;
    const auto deadline = Clock::now() + timeout;
    while (r == ncclInProgress) {
      if (Clock::now() > deadline) {
        abort_locked(cat(call, " did not complete within ", timeout.count(), " ms"));
        throw error(op, abort_reason);
      }
      std::this_thread::yield();
      ncclCommGetAsyncError(c, &r);
    }
    if (r != ncclSuccess) fail_nccl(op, call, r);
  }
  void cuda(std::string_view op, const char* call, cudaError_t e) {
    if (e != cudaSuccess) [[unlikely]]
      throw error(op, cat(call, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)), int(e));
  }
};

/// A host buffer of an operation, moved through pinned and device memory.
struct Stage {
  void* user = nullptr;
  std::size_t bytes = 0;
  bool out = false;                   // copied back to `user` once the operation completed
  std::shared_ptr<std::byte> pinned;  // freed (back to the pool) with the operation
  void* device = nullptr;             // freed on the stream right after the operation
};

/// The completion of one operation (or one batch of sends and receives).
struct Done {
  cudaEvent_t event = nullptr;
  std::vector<Stage> stages;
  bool finished = false;
  ~Done() {
    if (event) dtensor::detail::cuda_report(cudaEventDestroy(event), "cudaEventDestroy");
  }
};

struct State::Batch {
  std::shared_ptr<Done> done = std::make_shared<Done>();
  bool closed = false;
};

/// The Work of an NCCL operation: waits on its event with the communicator's timeout.
class NcclWork final : public dtensor::detail::WorkState {
 public:
  NcclWork(std::shared_ptr<State> s, std::shared_ptr<Done> d, std::shared_ptr<State::Batch> b, std::string op)
      : s_(std::move(s)), d_(std::move(d)), batch_(std::move(b)), op_(std::move(op)) {}

  void wait() override {
    close_batch();
    const auto deadline = Clock::now() + s_->timeout;
    while (!poll()) {
      if (Clock::now() > deadline) {
        std::lock_guard l(s_->mu);
        s_->abort_locked(cat(op_, " did not complete within ", s_->timeout.count(),
                             " ms (a peer may have died or issued other collectives); communicator aborted"));
        throw s_->error(op_, s_->abort_reason);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  bool test() override {
    close_batch();
    return poll();
  }

 private:
  void close_batch();
  /// True once complete (then copies staged host outputs back); throws on any failure.
  bool poll() {
    if (d_->finished) return true;
    std::lock_guard l(s_->mu);
    s_->check_alive(op_);
    const cudaError_t q = cudaEventQuery(d_->event);
    if (q == cudaErrorNotReady) {
      ncclResult_t r = ncclSuccess;
      ncclCommGetAsyncError(s_->comm, &r);
      if (r != ncclSuccess && r != ncclInProgress) s_->fail_nccl(op_, "asynchronous NCCL operation", r);
      return false;
    }
    s_->cuda(op_, "cudaEventQuery", q);
    for (auto& st : d_->stages)
      if (st.out) std::memcpy(st.user, st.pinned.get(), st.bytes);
    d_->stages.clear();
    d_->finished = true;
    return true;
  }

  std::shared_ptr<State> s_;
  std::shared_ptr<Done> d_;
  std::shared_ptr<State::Batch> batch_;
  std::string op_;
};

}  // namespace detail

class NcclCommunicator final : public Communicator {
 public:
  /// Takes ownership of `comm`, a ready communicator on GPU `device`.
  NcclCommunicator(ncclComm_t comm, int world_rank, int device)
      : Communicator(user_rank(comm), count(comm), world_rank), s_(std::make_shared<detail::State>()) {
    s_->comm = comm;
    s_->device = device;
    s_->rank = rank();
    s_->size = size();
    s_->label = label();
    s_->timeout = timeout();
    here();
    s_->cuda("nccl::NcclCommunicator", "cudaStreamCreateWithFlags",
             cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking));
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() override {
    std::lock_guard l(s_->mu);
    cudaSetDevice(s_->device);
    try {
      close_batch(*s_);  // sends and receives still batched go out before the end
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dtensor: ~NcclCommunicator: %s\n", e.what());
    }
    if (s_->comm) {
      // Lets pending operations finish (bounded by the timeout), then frees the communicator.
      ncclResult_t r = ncclCommFinalize(s_->comm);
      const auto deadline = detail::Clock::now() + s_->timeout;
      while (r == ncclInProgress && detail::Clock::now() < deadline) ncclCommGetAsyncError(s_->comm, &r);
      if (r == ncclSuccess) ncclCommDestroy(s_->comm);
      else ncclCommAbort(s_->comm);
      s_->comm = nullptr;
      // A Work that outlives its communicator fails instead of touching a freed handle.
      s_->aborted = true;
      s_->abort_reason = "the communicator was destroyed";
    }
    if (s_->stream) dtensor::detail::cuda_report(cudaStreamDestroy(s_->stream), "cudaStreamDestroy (nccl stream)");
  }

  std::string_view backend() const override { return "nccl"; }
  ncclComm_t native() const noexcept { return s_->comm; }
  /// The stream the communicator's operations run on.
  cudaStream_t stream() const noexcept { return s_->stream; }
  int device() const noexcept { return s_->device; }

 protected:
  CommPtr do_split(int color, int key) override {
    std::lock_guard l(s_->mu);
    sync_settings();
    s_->check_alive("split");
    close_batch_locked();
    here();
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t sub = nullptr;
    const ncclResult_t r = ncclCommSplit(s_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &cfg);
    s_->settle("split", "ncclCommSplit", r);
    if (!sub) return nullptr;
    s_->settle("split", "ncclCommSplit (new communicator)", ncclInProgress, sub);
    auto c = std::make_shared<NcclCommunicator>(sub, world_rank(), s_->device);
    c->set_label(label());
    return c;
  }

  Work do_all_gather(const void* send, void* recv, std::size_t count, DType t, bool async) override {
    const std::size_t b = count * size_of(t);
    return issue("all_gather", async, {{send, b, false}, {recv, b * std::size_t(size()), true}},
                 [&](void* const* p, cudaStream_t st) {
                   return ncclAllGather(p[0], p[1], count, detail::datatype(t), s_->comm, st);
                 });
  }
  Work do_reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, bool async) override {
    const std::size_t b = count * size_of(t);
    return issue("reduce_scatter", async, {{send, b * std::size_t(size()), false}, {recv, b, true}},
                 [&](void* const* p, cudaStream_t st) {
                   return ncclReduceScatter(p[0], p[1], count, detail::datatype(t), detail::red_op(op), s_->comm, st);
                 });
  }
  Work do_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, bool async) override {
    const std::size_t b = count * size_of(t);
    return issue("all_reduce", async, {{send, b, false}, {recv, b, true}}, [&](void* const* p, cudaStream_t st) {
      return ncclAllReduce(p[0], p[1], count, detail::datatype(t), detail::red_op(op), s_->comm, st);
    });
  }
  Work do_all_to_all(const void* send, void* recv, std::size_t count, DType t, bool async) override {
    const std::size_t b = count * size_of(t), n = std::size_t(size());
    return issue("all_to_all", async, {{send, b * n, false}, {recv, b * n, true}}, [&](void* const* p, cudaStream_t st) {
      ncclResult_t r = ncclGroupStart();
      for (std::size_t j = 0; j < n && r == ncclSuccess; ++j) {
        r = ncclSend(static_cast<const std::byte*>(p[0]) + j * b, count, detail::datatype(t), int(j), s_->comm, st);
        if (r == ncclSuccess)
          r = ncclRecv(static_cast<std::byte*>(p[1]) + j * b, count, detail::datatype(t), int(j), s_->comm, st);
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  Work do_all_to_all_v(const void* send, const std::size_t* sc, const std::size_t* sd, void* recv,
                       const std::size_t* rc, const std::size_t* rd, DType t, bool async) override {
    const std::size_t es = size_of(t), n = std::size_t(size());
    std::size_t send_extent = 0, recv_extent = 0;
    for (std::size_t j = 0; j < n; ++j) {
      send_extent = std::max(send_extent, sd[j] + sc[j]);
      recv_extent = std::max(recv_extent, rd[j] + rc[j]);
    }
    return issue("all_to_all_v", async, {{send, send_extent * es, false}, {recv, recv_extent * es, true}},
                 [&](void* const* p, cudaStream_t st) {
                   ncclResult_t r = ncclGroupStart();
                   for (std::size_t j = 0; j < n && r == ncclSuccess; ++j) {
                     if (sc[j])
                       r = ncclSend(static_cast<const std::byte*>(p[0]) + sd[j] * es, sc[j], detail::datatype(t), int(j),
                                    s_->comm, st);
                     if (r == ncclSuccess && rc[j])
                       r = ncclRecv(static_cast<std::byte*>(p[1]) + rd[j] * es, rc[j], detail::datatype(t), int(j),
                                    s_->comm, st);
                   }
                   const ncclResult_t e = ncclGroupEnd();
                   return r != ncclSuccess ? r : e;
                 });
  }
  Work do_broadcast(void* buf, std::size_t count, DType t, int root, bool async) override {
    const std::size_t b = count * size_of(t);
    return issue("broadcast", async, {{buf, b, true}}, [&](void* const* p, cudaStream_t st) {
      return ncclBroadcast(p[0], p[0], count, detail::datatype(t), root, s_->comm, st);
    });
  }
  Work do_send(const void* buf, std::size_t count, DType t, int peer, int, bool async) override {
    return p2p("send", async, {const_cast<void*>(buf), count * size_of(t), false}, [&](void* p, cudaStream_t st) {
      return ncclSend(p, count, detail::datatype(t), peer, s_->comm, st);
    });
  }
  Work do_recv(void* buf, std::size_t count, DType t, int peer, int, bool async) override {
    return p2p("recv", async, {buf, count * size_of(t), true}, [&](void* p, cudaStream_t st) {
      return ncclRecv(p, count, detail::datatype(t), peer, s_->comm, st);
    });
  }
  void do_barrier() override {
    // A one-element all-reduce of device memory, waited on (NCCL has no barrier).
    std::int32_t* d = nullptr;
    {
      std::lock_guard l(s_->mu);
      s_->check_alive("barrier");
      here();
      s_->cuda("barrier", "cudaMallocAsync", cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof *d, s_->stream));
      s_->cuda("barrier", "cudaMemsetAsync", cudaMemsetAsync(d, 0, sizeof *d, s_->stream));
    }
    struct Free {  // also when the all-reduce throws
      detail::State& s;
      void* p;
      ~Free() {
        std::lock_guard l(s.mu);
        if (!s.aborted) dtensor::detail::cuda_report(cudaFreeAsync(p, s.stream), "cudaFreeAsync (barrier)");
      }
    } free_on_exit{*s_, d};
    issue("barrier", false, {{d, sizeof *d, true}}, [&](void* const* p, cudaStream_t st) {
      return ncclAllReduce(p[0], p[0], 1, ncclInt32, ncclSum, s_->comm, st);
    });
  }

 private:
  struct Buf {
    const void* ptr;
    std::size_t bytes;
    bool out;
  };

  static int user_rank(ncclComm_t c) {
    int r = 0;
    if (const ncclResult_t e = ncclCommUserRank(c, &r); e != ncclSuccess)
      throw Error("nccl::NcclCommunicator", cat_nccl("ncclCommUserRank", e), Error::no_rank, int(e));
    return r;
  }
  static int count(ncclComm_t c) {
    int n = 0;
    if (const ncclResult_t e = ncclCommCount(c, &n); e != ncclSuccess)
      throw Error("nccl::NcclCommunicator", cat_nccl("ncclCommCount", e), Error::no_rank, int(e));
    return n;
  }
  static std::string cat_nccl(const char* call, ncclResult_t e) {
    return dtensor::detail::cat(call, " failed: ", ncclGetErrorString(e));
  }

  void here() { s_->cuda("nccl", "cudaSetDevice", cudaSetDevice(s_->device)); }
  /// The label and timeout may have changed since construction (the mesh names its groups).
  void sync_settings() {
    s_->label = label();
    s_->timeout = timeout();
  }

  /// Caller holds mu. The comm stream waits for what the caller's stream has issued so far.
  void after_caller(std::string_view op) {
    cudaEvent_t e = nullptr;
    s_->cuda(op, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const cudaError_t r1 = cudaEventRecord(e, cuda::current_stream());
    const cudaError_t r2 = r1 == cudaSuccess ? cudaStreamWaitEvent(s_->stream, e, 0) : r1;
    cudaEventDestroy(e);  // released once the wait has been satisfied
    s_->cuda(op, "cudaEventRecord/cudaStreamWaitEvent", r2);
  }

  /// Caller holds mu. Host buffers get device copies (inputs copied in, through pinned memory).
  void* stage(std::string_view op, detail::Done& d, const Buf& b) {
    if (b.bytes == 0 || cuda::is_device_pointer(b.ptr)) return const_cast<void*>(b.ptr);
    detail::Stage st{const_cast<void*>(b.ptr), b.bytes, b.out, s_->pinned->get(b.bytes), nullptr};
    s_->cuda(op, "cudaMallocAsync", cudaMallocAsync(&st.device, b.bytes, s_->stream));
    std::memcpy(st.pinned.get(), b.ptr, b.bytes);
    s_->cuda(op, "cudaMemcpyAsync", cudaMemcpyAsync(st.device, st.pinned.get(), b.bytes, cudaMemcpyHostToDevice, s_->stream));
    void* dev = st.device;
    d.stages.push_back(std::move(st));
    return dev;
  }
  /// Caller holds mu. Outputs of staged buffers go back to pinned memory; the event marks the end.
  void finish(std::string_view op, detail::Done& d) {
    for (auto& st : d.stages) {
      if (st.out)
        s_->cuda(op, "cudaMemcpyAsync",
                 cudaMemcpyAsync(st.pinned.get(), st.device, st.bytes, cudaMemcpyDeviceToHost, s_->stream));
      s_->cuda(op, "cudaFreeAsync", cudaFreeAsync(st.device, s_->stream));
    }
    s_->cuda(op, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&d.event, cudaEventDisableTiming));
    s_->cuda(op, "cudaEventRecord", cudaEventRecord(d.event, s_->stream));
  }

  /// Caller holds mu. Ends the open batch of sends and receives, if any.
  void close_batch_locked() { close_batch(*s_); }

 public:
  /// Ends `s`'s open batch of asynchronous sends and receives (caller holds s.mu).
  static void close_batch(detail::State& s) {
    if (!s.batch || s.batch->closed) return;
    auto b = std::move(s.batch);
    b->closed = true;
    s.settle("send/recv", "ncclGroupEnd", ncclGroupEnd());
    auto& d = *b->done;
    for (auto& st : d.stages) {
      if (st.out)
        s.cuda("send/recv", "cudaMemcpyAsync",
               cudaMemcpyAsync(st.pinned.get(), st.device, st.bytes, cudaMemcpyDeviceToHost, s.stream));
      s.cuda("send/recv", "cudaFreeAsync", cudaFreeAsync(st.device, s.stream));
    }
    s.cuda("send/recv", "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&d.event, cudaEventDisableTiming));
    s.cuda("send/recv", "cudaEventRecord", cudaEventRecord(d.event, s.stream));
  }

 private:
  /// One collective: order after the caller's stream, stage host buffers, call NCCL, record.
  template <class Call>
  Work issue(const char* op, bool async, std::initializer_list<Buf> bufs, Call&& call) {
    auto done = std::make_shared<detail::Done>();
    {
      std::lock_guard l(s_->mu);
      sync_settings();
      s_->check_alive(op);
      close_batch_locked();
      here();
      after_caller(op);
      void* p[2] = {nullptr, nullptr};
      std::size_t i = 0;
      for (const Buf& b : bufs) p[i++] = stage(op, *done, b);
      s_->settle(op, op, call(p, s_->stream));
      finish(op, *done);
    }
    Work w(std::make_shared<detail::NcclWork>(s_, std::move(done), nullptr, dtensor::detail::cat(op, "[", label(), "]")));
    if (!async) {
      w.wait();
      return {};
    }
    return w;
  }

  /// A send or receive: joins the open batch (opening one if needed); a blocking one closes it.
  template <class Call>
  Work p2p(const char* op, bool async, Buf b, Call&& call) {
    std::shared_ptr<detail::State::Batch> batch;
    {
      std::lock_guard l(s_->mu);
      sync_settings();
      s_->check_alive(op);
      here();
      if (!s_->batch) {
        after_caller(op);
        s_->settle(op, "ncclGroupStart", ncclGroupStart());
        s_->batch = std::make_shared<detail::State::Batch>();
      }
      batch = s_->batch;
      void* p = stage(op, *batch->done, b);
      const ncclResult_t r = call(p, s_->stream);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();  // leave the group before the error aborts the communicator
        s_->batch.reset();
        s_->fail_nccl(op, op, r);
      }
      if (!async) close_batch_locked();
    }
    Work w(std::make_shared<detail::NcclWork>(s_, batch->done, batch, dtensor::detail::cat(op, "[", label(), "]")));
    if (!async) {
      w.wait();
      return {};
    }
    return w;
  }

  std::shared_ptr<detail::State> s_;
};

inline void detail::NcclWork::close_batch() {
  if (!batch_ || batch_->closed) return;
  std::lock_guard l(s_->mu);
  s_->check_alive(op_);
  NcclCommunicator::close_batch(*s_);
}

/// The NCCL communicator of all ranks of `mpi_comm` (collective over it; MPI must be
/// initialized). `device` < 0 picks local rank % visible GPUs; the chosen device becomes the
/// calling thread's current device. Creation waits at most comm_defaults().timeout.
inline CommPtr world(MPI_Comm mpi_comm = MPI_COMM_WORLD, int device = -1) {
  auto mpi_check = [](int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error("nccl::world", dtensor::detail::cat(call, " failed: ", msg), Error::no_rank, rc);
  };
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error("nccl::world", "MPI is not initialized: create a dtensor::mpi::Environment first");
  int rank = 0, size = 0;
  mpi_check(MPI_Comm_rank(mpi_comm, &rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(mpi_comm, &size), "MPI_Comm_size");
  const int devices = cuda::device_count();
  if (devices == 0) throw Error("nccl::world", "no CUDA device is visible to this process", rank);
  if (device < 0) {
    MPI_Comm local;
    mpi_check(MPI_Comm_split_type(mpi_comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
    int local_rank = 0;
    mpi_check(MPI_Comm_rank(local, &local_rank), "MPI_Comm_rank");
    MPI_Comm_free(&local);
    device = local_rank % devices;
  }
  dtensor::detail::check_cuda(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__, rank);
  ncclUniqueId id{};
  if (rank == 0)
    if (const ncclResult_t e = ncclGetUniqueId(&id); e != ncclSuccess)
      throw Error("nccl::world", dtensor::detail::cat("ncclGetUniqueId failed: ", ncclGetErrorString(e)), rank, int(e));
  mpi_check(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, mpi_comm), "MPI_Bcast");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  const auto deadline = detail::Clock::now() + comm_defaults().timeout;
  while (r == ncclInProgress && comm) {
    if (detail::Clock::now() > deadline) {
      ncclCommAbort(comm);
      throw Error("nccl::world", dtensor::detail::cat("ncclCommInitRankConfig did not complete within ",
                                                      comm_defaults().timeout.count(), " ms"), rank);
    }
    std::this_thread::yield();
    ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) {
    const std::string last = comm ? ncclGetLastError(comm) : "";
    if (comm) ncclCommAbort(comm);
    throw Error("nccl::world", dtensor::detail::cat("ncclCommInitRankConfig failed: ", ncclGetErrorString(r),
                                                    last.empty() ? "" : " (" + last + ")"), rank, int(r));
  }
  return std::make_shared<NcclCommunicator>(comm, rank, device);
}

}  // namespace dtensor::nccl
