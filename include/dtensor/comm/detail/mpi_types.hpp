// dtensor/comm/detail/mpi_types.hpp — internals of the MPI backend: the one DType → MPI
// datatype / MPI_Op map, the bfloat16 datatype and reductions, error formatting, and the
// process-wide state that lives until MPI_Finalize. Included by dtensor/comm/mpi.hpp only.
#pragma once

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/error.hpp"

namespace dtensor::mpi::detail {

/// What an error message about one operation needs. The label is copied (short labels stay in
/// the string's inline buffer, so this does not allocate) because a Work may outlive its
/// communicator.
struct OpInfo {
  const char* op;    // "all_gather": dtensor's name
  const char* call;  // "MPI_Iallgather": the MPI routine that started it
  std::string label;
  int rank = 0, size = 0, world_rank = 0;
  std::chrono::milliseconds timeout{0};
  // For departure notices (mpi_departure.hpp): a collective is number `seq` on the
  // communicator of id `comm_id` (0: untracked); a send or recv goes to group rank `peer`.
  MPI_Comm comm = MPI_COMM_NULL;
  std::uint64_t comm_id = 0, seq = 0;
  int peer = -1;
};

inline std::string error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return dtensor::detail::cat("MPI error ", code);
  return std::string(buf, std::size_t(len));
}

inline std::string where(const OpInfo& i) {
  std::string s = dtensor::detail::cat("group '", i.label, "' of ", i.size, " ranks");
  if (i.world_rank != i.rank) s += dtensor::detail::cat(", world rank ", i.world_rank);
  return s;
}

/// The op as Communicator::fail names it: "all_gather[tp]".
inline std::string op_name(const OpInfo& i) { return i.label.empty() ? i.op : std::string(i.op) + "[" + i.label + "]"; }

/// The Error for an MPI routine that returned `code` (the routine, MPI's own text, the code).
/// A truncation is how ranks that disagree (about a setting, a layout, a count) show under MPI
/// with the full collective check off: the message says so and how to see each rank's call.
inline Error mpi_error(const OpInfo& i, const char* call, int code) {
  int cls = 0;
  const bool truncated = MPI_Error_class(code, &cls) == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE;
  return Error(op_name(i),
               dtensor::detail::cat(call, " failed: ", error_string(code), " (", where(i), ")",
                                    truncated ? ": the ranks passed different sizes to this operation, so they "
                                                "disagree about what to exchange (a setting, a layout, a count). "
                                                "Rerun with DTENSOR_CHECK_COLLECTIVES=1 to see each rank's call"
                                              : ""),
               i.rank, code);
}

/// MPI counts are ints; dtensor's are size_t. Larger counts fail here, before any MPI call.
inline int to_int(const OpInfo& i, std::size_t n, const char* what) {
  if (n > std::size_t(INT_MAX))
    throw Error(op_name(i),
                dtensor::detail::cat(what, " ", n, " exceeds ", INT_MAX,
                                     ", the largest count an MPI call accepts (", where(i), ")"),
                i.rank);
  return int(n);
}

/// Calls f(T{}) with the element type T of t: the single place that turns a DType into a type.
template <class F>
decltype(auto) with_element_type(DType t, F&& f) {
  switch (t) {
    case DType::float32: return f(float{});
    case DType::float64: return f(double{});
    case DType::bfloat16: return f(bfloat16{});
    case DType::int32: return f(std::int32_t{});
    case DType::int64: return f(std::int64_t{});
    case DType::uint8: break;
  }
  return f(std::uint8_t{});
}

/// ReduceOp::avg finishes here: the sum divided by the group size, in T's own arithmetic
/// (integer division for integers; bfloat16 divides in float and rounds to nearest even).
inline void divide(void* buf, std::size_t n, DType t, int divisor) {
  with_element_type(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(buf);
    const T d = T(divisor);
    for (std::size_t k = 0; k < n; ++k) p[k] = T(p[k] / d);
  });
}

// MPI has no bfloat16, so it travels as a 2-byte contiguous type and reduces through
// user-defined ops that round through float exactly as dtensor::bfloat16 does on the host.
template <ReduceOp Op>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bfloat16*>(in);
  auto* b = static_cast<bfloat16*>(inout);
  for (int k = 0; k < *len; ++k) b[k] = reduce_pair(Op, a[k], b[k]);  // MPI: inout = in op inout
}

/// A request that was still running when its Work was dropped (or timed out): MPI cannot
/// cancel a collective, so the request and the int arrays it reads stay alive until it ends.
/// It also holds its communicator: freeing an MPI communicator while a non-blocking collective
/// on it is pending crashes Open MPI's libnbc when the request is progressed later.
struct Orphan {
  MPI_Request req;
  std::vector<int> counts;
  std::shared_ptr<const void> comm;  // keeps the MPI communicator alive until req completes
};

/// Process-wide MPI state, created at first use and released by MPI_Finalize (through an
/// attribute on MPI_COMM_SELF, whose delete callback MPI runs first thing in MPI_Finalize,
/// so it works whoever finalizes: dtensor::mpi::Environment, Boost.MPI or the user).
class State {
 public:
  static State& get() {
    static State s;
    return s;
  }
  MPI_Datatype bf16() const noexcept { return bf16_; }
  MPI_Op bf16_op(ReduceOp op) const noexcept {
    return op == ReduceOp::max ? bf16_max_ : op == ReduceOp::min ? bf16_min_ : bf16_sum_;
  }
  void adopt(Orphan o) {
    std::lock_guard lock(mu_);
    orphans_.push_back(std::move(o));
  }

 private:
  State() {
    // Failures here mean MPI is not initialized or broken; they surface as Errors on first use.
    auto check = [](int rc, const char* call) {
      if (rc != MPI_SUCCESS) throw Error("mpi", dtensor::detail::cat(call, " failed: ", error_string(rc)), Error::no_rank, rc);
    };
    check(MPI_Type_contiguous(2, MPI_BYTE, &bf16_), "MPI_Type_contiguous");
    check(MPI_Type_commit(&bf16_), "MPI_Type_commit");
    check(MPI_Op_create(&bf16_reduce<ReduceOp::sum>, 1, &bf16_sum_), "MPI_Op_create");
    check(MPI_Op_create(&bf16_reduce<ReduceOp::max>, 1, &bf16_max_), "MPI_Op_create");
    check(MPI_Op_create(&bf16_reduce<ReduceOp::min>, 1, &bf16_min_), "MPI_Op_create");
    int key = MPI_KEYVAL_INVALID;
    check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &State::at_finalize, &key, this), "MPI_Comm_create_keyval");
    check(MPI_Comm_set_attr(MPI_COMM_SELF, key, this), "MPI_Comm_set_attr");
  }

  static int at_finalize(MPI_Comm, int key, void*, void* extra) {
    static_cast<State*>(extra)->release();
    MPI_Comm_free_keyval(&key);
    return MPI_SUCCESS;
  }

  void release() {
    // Finish the orphans first: their buffers may be the user's, and MPI_Finalize with
    // requests in flight is erroneous. A peer that never arrives leaves them pending; we wait
    // one default timeout and then warn rather than hang forever.
    std::vector<Orphan> orphans;
    {
      std::lock_guard lock(mu_);
      orphans.swap(orphans_);
    }
    const auto deadline = std::chrono::steady_clock::now() + comm_defaults().timeout;
    for (auto& o : orphans) {
      int done = 0;
      while (MPI_Test(&o.req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!done) {
        std::fprintf(stderr, "dtensor: MPI_Finalize with an MPI operation that never completed (a peer did not "
                             "take part); the job should have been aborted\n");
        new std::shared_ptr<const void>(std::move(o.comm));  // never free a communicator in use
      }
    }
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    MPI_Op_free(&bf16_min_);
    MPI_Type_free(&bf16_);
  }

  MPI_Datatype bf16_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL, bf16_min_ = MPI_OP_NULL;
  std::mutex mu_;
  std::vector<Orphan> orphans_;
};

/// The one DType → MPI_Datatype map.
inline MPI_Datatype datatype(DType t) {
  switch (t) {
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::bfloat16: return State::get().bf16();
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::uint8: break;
  }
  return MPI_UINT8_T;
}

/// The one (ReduceOp, DType) → MPI_Op map. avg reduces as a sum; the caller divides after.
inline MPI_Op reduce_op(ReduceOp op, DType t) {
  if (t == DType::bfloat16) return State::get().bf16_op(op);
  return op == ReduceOp::max ? MPI_MAX : op == ReduceOp::min ? MPI_MIN : MPI_SUM;
}

}  // namespace dtensor::mpi::detail
