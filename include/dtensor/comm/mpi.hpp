// dtensor/comm/mpi.hpp — the MPI backend: ranks are processes started by mpirun.
//
//   int main(int argc, char** argv) {
//     return dtensor::mpi::run(argc, argv, [](dtensor::CommPtr world) {
//       std::vector<float> x(1024, float(world->rank()));
//       world->all_reduce(std::span<float>(x), dtensor::ReduceOp::sum);
//     });   // an exception on any rank prints it with the rank and MPI_Aborts the job
//   }           // (the ranks first agree on DTENSOR_TIMEOUT_MS etc.: comm/env_agreement.hpp)
//
//   dtensor::mpi::Environment env(argc, argv);   // or by hand: MPI_Init_thread .. MPI_Finalize
//   dtensor::CommPtr world = dtensor::mpi::world();
//
// Boost.MPI provides the environment, the communicators and split; the collectives are raw
// MPI calls, because every operation is issued non-blocking (MPI_Iallgather,
// MPI_Ireduce_scatter_block, MPI_Iallreduce, MPI_Ialltoall(v), MPI_Ibcast, MPI_Isend/Irecv,
// MPI_Ibarrier) and Boost.MPI has neither those nor reduce-scatter. A blocking dtensor call is
// that request waited on at once, so that every wait — blocking or not — fails after the
// communicator's timeout() instead of hanging.
//
// After a timeout the operation is still in flight: MPI cannot cancel it, and its buffers must
// stay alive until it completes. A rank that got a timeout (or any error inside a collective)
// should therefore end; dtensor::mpi::run calls MPI_Abort so that its peers end too rather
// than wait for it. Communicator creation (world(), split) is blocking and has no timeout.
//
// Every MPI return code is checked (communicators use MPI_ERRORS_RETURN); a failure is a
// dtensor::Error naming the op, the group, the rank, the MPI routine and MPI's error text,
// with backend_code() = the MPI error code. bfloat16 travels as a 2-byte type and reduces
// (sum, max, min) through user-defined MPI_Ops that round through float to nearest even.
// ReduceOp::avg is a sum divided by the group size once it has arrived (integer division for
// integer types). Waiting (wait(), test(), the blocking forms) must happen on the thread that
// MPI's thread level allows: any one thread at a time with the default MPI_THREAD_SERIALIZED.
#pragma once

#include <mpi.h>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/mpi/exception.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/comm/detail/mpi_request.hpp"
#include "dtensor/comm/detail/mpi_types.hpp"
#include "dtensor/comm/env_agreement.hpp"

namespace dtensor::mpi {

using ThreadLevel = boost::mpi::threading::level;

/// Initializes MPI (unless something already has) and finalizes it when destroyed. Asks for
/// MPI_THREAD_SERIALIZED by default: dtensor calls MPI from whichever thread waits, one at a
/// time. If it is destroyed while an exception is propagating, Boost.MPI aborts the job.
class Environment {
 public:
  explicit Environment(ThreadLevel level = ThreadLevel::serialized) { guarded([&] { env_.emplace(level, true); }); }
  Environment(int& argc, char**& argv, ThreadLevel level = ThreadLevel::serialized) {
    guarded([&] { env_.emplace(argc, argv, level, true); });
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  /// The thread support MPI actually provides.
  static ThreadLevel thread_level() { return boost::mpi::environment::thread_level(); }

 private:
  template <class F>
  static void guarded(F&& f) {
    try {
      f();
    } catch (const boost::mpi::exception& e) {
      throw Error("mpi::Environment", dtensor::detail::cat(e.routine(), " failed: ", detail::error_string(e.result_code())),
                  Error::no_rank, e.result_code());
    }
  }
  std::optional<boost::mpi::environment> env_;
};

/// A dtensor Communicator over an MPI communicator.
class MpiCommunicator final : public Communicator {
 public:
  /// Wraps `comm` (which it shares with Boost.MPI's reference counting); `world_rank` is this
  /// process's rank in the communicator all others were split from.
  MpiCommunicator(boost::mpi::communicator comm, int world_rank)
      : Communicator(comm.rank(), comm.size(), world_rank),
        comm_(std::move(comm)),
        owner_(std::make_shared<const boost::mpi::communicator>(comm_)) {
    detail::State::get();  // creates the bfloat16 type/ops and the MPI_Finalize hook
    comm_id_ = detail::Tally::get().id_of(native());  // departure notices (detail/mpi_departure.hpp)
    // Errors come back as codes that we turn into dtensor::Errors, instead of aborting.
    if (const int rc = MPI_Comm_set_errhandler(native(), MPI_ERRORS_RETURN); rc != MPI_SUCCESS)
      throw detail::mpi_error(info("mpi::MpiCommunicator", "MPI_Comm_set_errhandler"), "MPI_Comm_set_errhandler", rc);
  }

  std::string_view backend() const override { return "mpi"; }
  /// Agreement before data: one fused 16-byte all-reduce before each collective (Communicator::agree_before).
  bool exchanges_agreement() const noexcept override { return true; }
  MPI_Comm native() const noexcept { return MPI_Comm(comm_); }
  const boost::mpi::communicator& boost_comm() const noexcept { return comm_; }

 protected:
  CommPtr do_split(int color, int key) override {
    // MPI_Comm_split blocks without a timeout: meet in a barrier first, which times out and
    // fails at once if a rank has left (mpi::run's departure notices), instead of hanging.
    start("split", "MPI_Ibarrier", false, [&](detail::Request& r) { return MPI_Ibarrier(native(), &r.req); });
    try {
      // MPI's "not in any group" is MPI_UNDEFINED; other negative colors would be erroneous.
      boost::mpi::communicator sub = comm_.split(color < 0 ? MPI_UNDEFINED : color, key);
      if (!sub) return nullptr;
      if (comm_id_ != 0)  // every member computes the same id: the barrier above is counted alike
        detail::Tally::get().name(MPI_Comm(sub), detail::Tally::child_id(comm_id_, detail::Tally::get().issued(comm_id_), color));
      auto c = std::make_shared<MpiCommunicator>(std::move(sub), world_rank());
      c->set_label(label());  // as on the threads backend; a mesh names its groups itself
      return c;
    } catch (const boost::mpi::exception& e) {
      throw detail::mpi_error(info("split", e.routine()), e.routine(), e.result_code());
    }
  }

  Work do_all_gather(const void* send, void* recv, std::size_t count, DType t, bool async) override {
    return start("all_gather", "MPI_Iallgather", async, [&](detail::Request& r) {
      const int n = detail::to_int(r_info(r), count, "count");
      const MPI_Datatype dt = detail::datatype(t);
      return MPI_Iallgather(send, n, dt, recv, n, dt, native(), &r.req);
    });
  }

  Work do_reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                         bool async) override {
    return start("reduce_scatter", "MPI_Ireduce_scatter_block", async, [&](detail::Request& r) {
      const int n = detail::to_int(r_info(r), count, "count");
      average_later(r, op, recv, count, t);
      return MPI_Ireduce_scatter_block(send, recv, n, detail::datatype(t), detail::reduce_op(op, t), native(), &r.req);
    });
  }

  Work do_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, bool async) override {
    return start("all_reduce", "MPI_Iallreduce", async, [&](detail::Request& r) {
      const int n = detail::to_int(r_info(r), count, "count");
      average_later(r, op, recv, count, t);
      return MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, detail::datatype(t),
                            detail::reduce_op(op, t), native(), &r.req);
    });
  }

  Work do_all_to_all(const void* send, void* recv, std::size_t count, DType t, bool async) override {
    return start("all_to_all", "MPI_Ialltoall", async, [&](detail::Request& r) {
      const int n = detail::to_int(r_info(r), count, "count per block");
      const MPI_Datatype dt = detail::datatype(t);
      return MPI_Ialltoall(send, n, dt, recv, n, dt, native(), &r.req);
    });
  }

  /// The strided send blocks as one derived datatype (a vector of runs, resized so that block j
  /// starts j block strides in): MPI reads them in place, no packing copy. The type may be
  /// freed once the call is issued; MPI keeps it until the operation completes.
  Work do_all_to_all_strided(const void* send, const StridedBlocks& b, void* recv, DType t, bool async) override {
    return start("all_to_all", "MPI_Ialltoall", async, [&](detail::Request& r) {
      const MPI_Datatype dt = detail::datatype(t);
      const int rows = detail::to_int(r_info(r), b.rows, "rows per block");
      const int run = detail::to_int(r_info(r), b.run, "elements per run");
      const int stride = detail::to_int(r_info(r), b.row_stride, "row stride");
      const int block = detail::to_int(r_info(r), b.block_elements(), "count per block");
      MPI_Datatype vector = MPI_DATATYPE_NULL, blocks = MPI_DATATYPE_NULL;
      int rc = MPI_Type_vector(rows, run, stride, dt, &vector);
      if (rc == MPI_SUCCESS)
        rc = MPI_Type_create_resized(vector, 0, MPI_Aint(b.block_stride * size_of(t)), &blocks);
      if (vector != MPI_DATATYPE_NULL) MPI_Type_free(&vector);
      if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&blocks);
      if (rc == MPI_SUCCESS) rc = MPI_Ialltoall(send, 1, blocks, recv, block, dt, native(), &r.req);
      if (blocks != MPI_DATATYPE_NULL) MPI_Type_free(&blocks);
      return rc;
    });
  }

  Work do_all_to_all_v(const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
                       const std::size_t* recv_counts, const std::size_t* recv_displs, DType t,
                       bool async) override {
    return start("all_to_all_v", "MPI_Ialltoallv", async, [&](detail::Request& r) {
      // MPI wants int counts and displacements, and reads them until the request completes,
      // so they live in the request.
      const auto p = std::size_t(size());
      r.counts.resize(4 * p);
      int* v = r.counts.data();
      const std::size_t* from[4] = {send_counts, send_displs, recv_counts, recv_displs};
      const char* what[4] = {"send count", "send displacement", "recv count", "recv displacement"};
      for (std::size_t a = 0; a < 4; ++a)
        for (std::size_t j = 0; j < p; ++j) v[a * p + j] = detail::to_int(r_info(r), from[a][j], what[a]);
      const MPI_Datatype dt = detail::datatype(t);
      return MPI_Ialltoallv(send, v, v + p, dt, recv, v + 2 * p, v + 3 * p, dt, native(), &r.req);
    });
  }

  Work do_broadcast(void* buf, std::size_t count, DType t, int root, bool async) override {
    return start("broadcast", "MPI_Ibcast", async, [&](detail::Request& r) {
      return MPI_Ibcast(buf, detail::to_int(r_info(r), count, "count"), detail::datatype(t), root, native(), &r.req);
    });
  }

  Work do_send(const void* buf, std::size_t count, DType t, int peer, int tag, bool async) override {
    return start("send", "MPI_Isend", async, peer, [&](detail::Request& r) {
      return MPI_Isend(buf, detail::to_int(r_info(r), count, "count"), detail::datatype(t), peer, tag, native(),
                       &r.req);
    });
  }

  Work do_recv(void* buf, std::size_t count, DType t, int peer, int tag, bool async) override {
    return start("recv", "MPI_Irecv", async, peer, [&](detail::Request& r) {
      r.recv_count = count;  // a shorter message is an error too, not only a longer one
      r.dtype = t;
      return MPI_Irecv(buf, detail::to_int(r_info(r), count, "count"), detail::datatype(t), peer, tag, native(),
                       &r.req);
    });
  }

  void do_barrier() override {
    start("barrier", "MPI_Ibarrier", false, [&](detail::Request& r) { return MPI_Ibarrier(native(), &r.req); });
  }

 private:
  detail::OpInfo info(const char* op, const char* call) const {
    return detail::OpInfo{op, call, label(), rank(), size(), world_rank(), timeout()};
  }
  // The request's own copy, so that an issue lambda reports with the same words as the wait.
  static const detail::OpInfo& r_info(const detail::Request& r) { return r.info(); }

  static void average_later(detail::Request& r, ReduceOp op, void* buf, std::size_t n, DType t) {
    if (op != ReduceOp::avg) return;
    r.avg_buf = buf;
    r.avg_count = n;
    r.dtype = t;
  }

  /// Issues one operation through `issue(request)` (which returns the MPI code) and either
  /// returns it as a Work or, for a blocking call, waits on it here without allocating.
  template <class Issue>
  Work start(const char* op, const char* call, bool async, Issue&& issue) {
    return start(op, call, async, -1, std::forward<Issue>(issue));
  }
  /// `peer` >= 0: a send or recv with that group rank; otherwise a collective, counted for the
  /// departure notices (detail/mpi_departure.hpp).
  template <class Issue>
  Work start(const char* op, const char* call, bool async, int peer, Issue&& issue) {
    detail::OpInfo i = info(op, call);
    i.comm = native();
    i.peer = peer;
    if (peer < 0 && comm_id_ != 0) {
      i.comm_id = comm_id_;
      i.seq = detail::Tally::get().issue(comm_id_);
    }
    if (async) {
      auto r = std::make_shared<detail::Request>(std::move(i), owner_);
      r->check_issue(issue(*r));
      return Work(std::move(r));
    }
    detail::Request r(std::move(i), owner_);
    r.check_issue(issue(r));
    r.wait();
    return {};
  }

  boost::mpi::communicator comm_;
  std::shared_ptr<const void> owner_;
  std::uint64_t comm_id_ = 0;  // detail::Tally's id of comm_ (0: untracked)  // a second owner of comm_, handed to requests that outlive us
};

/// MPI_COMM_WORLD as a dtensor communicator (label "world"). MPI must be initialized
/// (Environment, run, or MPI_Init). Not a duplicate: dtensor's point-to-point messages share
/// tags with the application's own on MPI_COMM_WORLD.
inline CommPtr world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error("mpi::world", "MPI is not initialized: create a dtensor::mpi::Environment first");
  boost::mpi::communicator w(MPI_COMM_WORLD, boost::mpi::comm_attach);
  const int r = w.rank();
  return std::make_shared<MpiCommunicator>(std::move(w), r);
}

namespace detail {
/// This process's host as MPI names it (MPI_Get_processor_name), for messages.
inline std::string processor_name() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int n = 0;
  if (MPI_Get_processor_name(name, &n) != MPI_SUCCESS) return "?";
  return std::string(name, std::size_t(n));
}

/// Runs fn(world); an exception escaping it is printed with the rank and host and ends the
/// whole job with MPI_Abort, because the other ranks may be waiting in a collective for this
/// one. Before fn, the ranks agree on the DTENSOR_* settings (comm/env_agreement.hpp): across
/// hosts they travel only if the launcher forwards them.
/// A rank whose fn returns sends the others a departure notice and waits for theirs: a rank still
/// waiting in a collective that the departed one never called fails at once, naming it.
template <class F>
int run_or_abort(F&& fn) {
  int rank = -1;
  try {
    CommPtr w = world();
    rank = w->rank();
    require_same_environment(*w, "mpi::run (start-up)");
    // From here a rank that returns tells the others (detail/mpi_departure.hpp), so that one
    // waiting for it in an operation it will never join fails at once instead of at the timeout.
    Departures::get().open();
    int result = 0;
    if constexpr (std::is_convertible_v<std::invoke_result_t<F&, CommPtr>, int>)
      result = int(fn(std::move(w)));
    else
      fn(std::move(w));
    Departures::get().leave();
    return result;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtensor: rank %d failed, aborting the MPI job (host %s): %s\n", rank, processor_name().c_str(),
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "dtensor: rank %d failed with an unknown exception, aborting the MPI job (host %s)\n", rank,
                 processor_name().c_str());
  }
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this keeps the compiler and a broken MPI honest
}
}  // namespace detail

/// Initializes MPI, checks that every rank runs with the same DTENSOR_* settings, runs
/// fn(world) and finalizes. If fn (or that check) throws on any rank, that rank prints the
/// error and calls MPI_Abort, which kills its peers instead of leaving them to hang.
/// Returns fn's result if it returns an int, else 0.
template <class F>
int run(int& argc, char**& argv, F&& fn) {
  Environment env(argc, argv);
  return detail::run_or_abort(std::forward<F>(fn));
}
template <class F>
int run(F&& fn) {
  Environment env;
  return detail::run_or_abort(std::forward<F>(fn));
}

}  // namespace dtensor::mpi
