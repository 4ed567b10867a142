// dtensor/comm/threads.hpp — the in-process backend: every rank is a thread of this process.
//
//   dtensor::threads::run(4, [](dtensor::CommPtr world) {
//     std::vector<float> x(16, float(world->rank()));
//     world->all_reduce(std::span<float>(x), dtensor::ReduceOp::sum);   // x == 0+1+2+3
//     auto row = world->split(world->rank() / 2, world->rank());        // two groups of two
//   });
//
// run() starts n threads, calls fn(world) on each and joins them. If a rank throws, the run is
// aborted: every rank waiting in a collective, send or recv wakes with a dtensor::Error naming
// the failed rank, and run() rethrows, after all threads are joined, an Error that carries the
// failed rank's number and message. run_collect() returns every rank's exception instead.
// A rank that returns while others wait for it (in a collective it never calls, or a send or
// receive it never matches) releases them at once: each gets an Error naming that rank and the
// operation it waits in, instead of waiting for the timeout.
//
// Collectives copy straight from the peers' buffers (zero-copy, in parallel on every rank),
// reduce in rank order (results are identical on every rank and in every run), check that all
// ranks passed the same arguments, and fail after the communicator's timeout() naming the ranks
// that did not arrive. Asynchronous operations run on a pool that grows as needed, so any
// number of them can be outstanding at once.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/comm/detail/threads_ops.hpp"

namespace dtensor::threads {

class ThreadsCommunicator final : public Communicator {
 public:
  /// `mem`: how to move and reduce this rank's buffers when they are not host memory (null for
  /// host memory; comm/cuda_threads.cuh passes the GPU's). Sub-groups from split inherit it.
  ThreadsCommunicator(std::shared_ptr<detail::Group> group, int rank, std::shared_ptr<const detail::MemOps> mem = {})
      : Communicator(rank, group->size, group->world_ranks[std::size_t(rank)]),
        group_(std::move(group)),
        mem_(std::move(mem)) {}

  std::string_view backend() const override { return mem_ ? mem_->backend() : "threads"; }
  /// Agreement before data happens in the rendezvous every collective makes (threads_ops.hpp,
  /// validate): the arguments were always compared there; the redistribution's fingerprint now is too.
  bool agrees_in_rendezvous() const noexcept override { return true; }
  /// The always-on check rides on every collective's rendezvous (detail::verify_problem).
  bool carries_verify() const noexcept override { return true; }

 protected:
  CommPtr do_split(int color, int key) override {
    auto [g, r] = detail::split(context(CollectiveKind::split, true), color, key);
    if (!g) return nullptr;
    auto c = std::make_shared<ThreadsCommunicator>(std::move(g), r, mem_);
    c->set_label(label());
    return c;
  }
  Work do_all_gather(const void* send, void* recv, std::size_t count, DType t, bool async) override {
    return issue(CollectiveKind::all_gather, async, [=](const detail::Ctx& c) { detail::all_gather(c, send, recv, count, t); });
  }
  Work do_reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, bool async) override {
    return issue(CollectiveKind::reduce_scatter, async,
                 [=](const detail::Ctx& c) { detail::reduce_scatter(c, send, recv, count, t, op); });
  }
  Work do_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, bool async) override {
    return issue(CollectiveKind::all_reduce, async,
                 [=](const detail::Ctx& c) { detail::all_reduce(c, send, recv, count, t, op); });
  }
  Work do_all_to_all(const void* send, void* recv, std::size_t count, DType t, bool async) override {
    return issue(CollectiveKind::all_to_all, async, [=](const detail::Ctx& c) { detail::all_to_all(c, send, recv, count, t); });
  }
  Work do_all_to_all_strided(const void* send, const StridedBlocks& blocks, void* recv, DType t, bool async) override {
    return issue(CollectiveKind::all_to_all, async,
                 [=](const detail::Ctx& c) { detail::all_to_all_strided(c, send, blocks, recv, t); });
  }
  Work do_all_to_all_v(const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
                       const std::size_t* recv_counts, const std::size_t* recv_displs, DType t, bool async) override {
    if (!async) {
      const std::size_t* const v[4] = {send_counts, send_displs, recv_counts, recv_displs};
      return issue(CollectiveKind::all_to_all_v, false, [&](const detail::Ctx& c) { detail::all_to_all_v(c, send, recv, v, t); });
    }
    // The caller's count arrays may be gone by the time the operation runs: keep a copy.
    const auto n = std::size_t(size());
    std::vector<std::size_t> v(4 * n);
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = send_counts[i];
      v[n + i] = send_displs[i];
      v[2 * n + i] = recv_counts[i];
      v[3 * n + i] = recv_displs[i];
    }
    return issue(CollectiveKind::all_to_all_v, true, [=, v = std::move(v)](const detail::Ctx& c) {
      const std::size_t* const p[4] = {v.data(), v.data() + n, v.data() + 2 * n, v.data() + 3 * n};
      detail::all_to_all_v(c, send, recv, p, t);
    });
  }
  Work do_broadcast(void* buf, std::size_t count, DType t, int root, bool async) override {
    return issue(CollectiveKind::broadcast, async, [=](const detail::Ctx& c) { detail::broadcast(c, buf, count, t, root); });
  }
  Work do_send(const void* buf, std::size_t count, DType t, int peer, int tag, bool async) override {
    const std::uint64_t ticket = group_->world->take_ticket({group_->id, rank(), peer, tag}, true);
    return issue(CollectiveKind::send, async,
                 [=](const detail::Ctx& c) { detail::send(c, buf, count, t, peer, tag, ticket); }, false);
  }
  Work do_recv(void* buf, std::size_t count, DType t, int peer, int tag, bool async) override {
    const std::uint64_t ticket = group_->world->take_ticket({group_->id, peer, rank(), tag}, false);
    return issue(CollectiveKind::recv, async,
                 [=](const detail::Ctx& c) { detail::recv(c, buf, count, t, peer, tag, ticket); }, false);
  }
  void do_barrier() override { detail::barrier(context(CollectiveKind::barrier, true)); }

 private:
  /// The operation's context. A collective takes the next sequence number here, on the
  /// caller's thread in program order, which is what matches it with the peers' k-th one.
  detail::Ctx context(CollectiveKind k, bool collective) {
    const detail::World& w = *group_->world;
    if (w.aborted()) throw Error(detail::Ctx{group_, rank(), 0, timeout(), label()}.op(k), w.reason(), rank());
    detail::Ctx c{group_, rank(), collective ? next_seq_++ : 0, timeout(), label(), mem_};
    // Agreement before data: the redistribution this collective is part of is compared in the
    // rendezvous with its arguments (validate), at no extra synchronisation.
    if (collective && agrees_before_data() && dtensor::detail::call_context) {
      c.has_context = true;
      c.context = *dtensor::detail::call_context;
    }
    if (collective) {
      c.verify = record_to_carry();
      c.verify_every = verify_every();
    }
    return c;
  }

  /// Runs `body` inline, or on the pool with a Work to wait on.
  template <class F>
  Work issue(CollectiveKind k, bool async, F&& body, bool collective = true) {
    detail::Ctx c = context(k, collective);
    if (!async) {
      body(c);
      return Work();
    }
    return issue_async(std::move(c), std::function<void(const detail::Ctx&)>(std::forward<F>(body)));
  }
  /// The asynchronous path once for every operation, its body type-erased: one task type and
  /// one shared_ptr control block, not one of each (with their vtables) per operation's body
  /// (16 MiB of a user FSDP x TP program's compile memory, docs/benchmarks.md).
  Work issue_async(detail::Ctx c, std::function<void(const detail::Ctx&)> body) {
    // While it is pending, the rank may still arrive in a collective even after it has left its
    // function: it does not count as gone (threads_state.hpp, Departures) until this has run.
    if (c.verify) {  // this rank folds on while the collective runs: it compares a copy
      c.verify_copy = std::make_shared<const dtensor::detail::VerifyRecord>(*c.verify);
      c.verify = c.verify_copy.get();
    }
    detail::World& world = *group_->world;
    world.departures.start(world_rank());
    auto run = [body = std::move(body), c = std::move(c)] {
      struct Finished {
        const detail::Ctx& c;
        ~Finished() { c.group->world->async_finished(c.world_rank()); }
      } finished{c};
      body(c);
    };
    auto task = std::make_shared<detail::FnTask<decltype(run)>>(std::move(run));
    group_->world->pool.submit(task);
    return Work(std::move(task));
  }

  std::shared_ptr<detail::Group> group_;
  std::shared_ptr<const detail::MemOps> mem_;
  std::uint64_t next_seq_ = 0;
};

namespace detail {

struct RunResult {
  std::vector<std::exception_ptr> errors;
  int origin = -1;  // the rank whose failure aborted the run, if any
};

/// The most ranks one run may have: each rank is a thread, and beyond a few thousand a process
/// meets the system's thread limits before any useful work is done.
inline constexpr int max_ranks = 4096;

/// The communicator of rank r of a run over host memory.
struct MakeHostComm {
  CommPtr operator()(const std::shared_ptr<Group>& g, int r) const { return std::make_shared<ThreadsCommunicator>(g, r); }
};

/// Runs fn(make(group, r)) on n threads. `make` runs on the rank's thread (a backend that
/// keeps per-thread state, such as a current CUDA stream, sets it up there).
template <class F, class Make = MakeHostComm>
RunResult run_ranks(int n, F& fn, const Make& make = {}) {
  if (n < 1) throw Error("threads::run", dtensor::detail::cat("needs at least one rank, got ", n));
  if (n > max_ranks)
    throw Error("threads::run", dtensor::detail::cat(n, " ranks is more than the threads backend's limit of ", max_ranks,
                                                     " (one thread per rank); run that many ranks as processes, "
                                                     "with the MPI backend"));
  auto world = std::make_shared<World>(n);
  std::vector<int> ranks(static_cast<std::size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = Group::make(world, std::move(ranks));

  RunResult result{std::vector<std::exception_ptr>(std::size_t(n)), -1};
  auto rank_main = [&](int r) {
    bool threw = false;
    try {
      CommPtr comm = make(group, r);
      fn(comm);
    } catch (...) {
      threw = true;
      result.errors[std::size_t(r)] = std::current_exception();
      world->abort(r, dtensor::detail::cat("rank ", r, " failed: ", what_of(result.errors[std::size_t(r)])));
    }
    world->leave(r, threw);  // whoever still waits for this rank is released now, naming it
  };
  std::vector<std::thread> threads;
  threads.reserve(std::size_t(n));
  try {
    for (int r = 0; r < n; ++r) threads.emplace_back(rank_main, r);
  } catch (const std::exception& e) {  // could not start a thread: release the ones that did start
    const std::string why = dtensor::detail::cat("could not start the thread of rank ", threads.size(), " of ", n,
                                                 " (", e.what(), "); the system limits the threads of a process: "
                                                 "use fewer ranks");
    world->abort(-1, "threads::run " + why);
    for (auto& t : threads) t.join();
    world->finish();
    throw Error("threads::run", why);
  }
  for (auto& t : threads) t.join();
  result.origin = world->origin();
  world->finish();
  return result;
}

}  // namespace detail

/// The most ranks one threads run may have (run and run_collect refuse more).
using detail::max_ranks;

/// Runs fn(world) on n threads and returns each rank's exception (nullptr where it returned).
template <class F>
std::vector<std::exception_ptr> run_collect(int n, F&& fn) {
  return detail::run_ranks(n, fn).errors;
}

namespace detail {
/// threads::run's verdict: the failure of the rank that aborted the run (or the first one).
inline void rethrow_first(const RunResult& res, const char* op) {
  int r = res.origin >= 0 && res.errors[std::size_t(res.origin)] ? res.origin : -1;
  for (std::size_t i = 0; r < 0 && i < res.errors.size(); ++i)
    if (res.errors[i]) r = int(i);
  if (r >= 0)
    throw Error(op, dtensor::detail::cat("rank ", r, " failed: ", what_of(res.errors[std::size_t(r)])));
}
}  // namespace detail

/// Runs fn(world) on n threads. If any rank threw, throws (after joining all of them) a
/// dtensor::Error with the number and message of the rank that failed first.
template <class F>
void run(int n, F&& fn) {
  detail::rethrow_first(detail::run_ranks(n, fn), "threads::run");
}

}  // namespace dtensor::threads
