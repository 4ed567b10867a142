// dtensor/comm/detail/mpi_request.hpp — internals of the MPI backend: the one routine that
// waits for an MPI request with a timeout, and the Work state that wraps a request.
// Included by dtensor/comm/mpi.hpp only.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/comm/detail/mpi_departure.hpp"
#include "dtensor/comm/detail/mpi_types.hpp"
#include "dtensor/comm/work.hpp"

namespace dtensor::mpi::detail {

/// Waits for `req` by polling MPI_Test; returns MPI's code, and done=false when `timeout`
/// passed first. Blocking MPI calls cannot time out, so every dtensor operation, blocking or
/// not, is issued non-blocking and waited on here.
///
/// The polling must not add latency: it first spins on MPI_Test (which also drives MPI's
/// progress engine), then keeps polling but yields the core between tests so that
/// oversubscribed ranks (more ranks than cores) still progress, and only after a second of
/// waiting sleeps 1 ms between tests, which costs an operation that long at most 0.1%.
///
/// While mpi::run's departure channel is open (mpi_departure.hpp), the slow part also reads the
/// notices of ranks that have left, about once a millisecond, and stops early with `why` set
/// when one of them will never join `info`'s operation.
inline int poll(MPI_Request& req, MPI_Status* status, std::chrono::milliseconds timeout, bool& done,
                const OpInfo* info = nullptr, std::string* why = nullptr) {
  using clock = std::chrono::steady_clock;
  constexpr int spins = 4096;
  int flag = 0;
  const auto start = clock::now();
  const auto deadline = start + timeout;
  for (int k = 0; k < spins; ++k) {
    const int rc = MPI_Test(&req, &flag, status);
    if (rc != MPI_SUCCESS || flag) return done = flag != 0, rc;
    // On an oversubscribed machine each test may yield the core (mpi_yield_when_idle): 4,096
    // of them took 600 ms under load, past a 200 ms timeout, so the deadline holds here too.
    if ((k & 255) == 255 && clock::now() >= deadline) return done = false, MPI_SUCCESS;
  }
  auto next_notice_check = start;
  for (;;) {
    const int rc = MPI_Test(&req, &flag, status);
    if (rc != MPI_SUCCESS || flag) return done = flag != 0, rc;
    const auto now = clock::now();
    if (now >= deadline) return done = false, MPI_SUCCESS;
    if (info && why && now >= next_notice_check && Departures::get().active()) {
      next_notice_check = now + std::chrono::milliseconds(1);
      *why = Departures::get().blocked(*info);
      if (!why->empty()) return done = false, MPI_SUCCESS;
    }
    if (now - start < std::chrono::seconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

/// One operation in flight: its request, what to do once it completes (avg's division, a
/// recv's size check) and what its errors must say. Lives on the stack for a blocking call and
/// in a Work for an asynchronous one.
class Request final : public dtensor::detail::WorkState {
 public:
  /// `comm` owns the MPI communicator (see Orphan): a request that outlives its Work keeps it.
  Request(OpInfo info, std::shared_ptr<const void> comm) : info_(std::move(info)), comm_(std::move(comm)) {}
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  ~Request() override {
    // Still running: the Work was dropped without wait(), or wait() timed out. MPI cannot
    // cancel it, so hand it to the process-wide state that completes it by MPI_Finalize.
    if (req == MPI_REQUEST_NULL) return;
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized) return;
    int flag = 0;
    if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) return;
    State::get().adopt(Orphan{req, std::move(counts), std::move(comm_)});
  }

  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> counts;  // all_to_all_v's int counts/displacements, read by MPI until done
  void* avg_buf = nullptr;  // avg: divide these elements by the group size when done
  std::size_t avg_count = 0;
  DType dtype = DType::uint8;
  std::size_t recv_count = npos;  // recv: the element count the message must have
  static constexpr std::size_t npos = std::size_t(-1);

  const OpInfo& info() const noexcept { return info_; }

  /// Throws the Error for an issuing call that failed (req stays null).
  void check_issue(int rc) const {
    if (rc != MPI_SUCCESS) throw mpi_error(info_, info_.call, rc);
  }

  void wait() override {
    if (req == MPI_REQUEST_NULL) return;
    MPI_Status st;
    bool done = false;
    std::string why;
    const int rc = poll(req, status_ptr(st), info_.timeout, done, &info_, &why);
    if (rc != MPI_SUCCESS) throw mpi_error(info_, info_.call, rc);
    if (!why.empty()) throw Error(op_name(info_), dtensor::detail::cat(why, " (", where(info_), ")"), info_.rank);
    if (!done) throw timed_out();
    finish(st);
  }

  bool test() override {
    if (req == MPI_REQUEST_NULL) return true;
    MPI_Status st;
    int flag = 0;
    const int rc = MPI_Test(&req, &flag, status_ptr(st));
    if (rc != MPI_SUCCESS) throw mpi_error(info_, info_.call, rc);
    if (flag) finish(st);
    return flag != 0;
  }

 private:
  MPI_Status* status_ptr(MPI_Status& st) const { return recv_count == npos ? MPI_STATUS_IGNORE : &st; }

  void finish(const MPI_Status& st) {
    if (avg_buf) divide(avg_buf, avg_count, dtype, info_.size);
    if (recv_count != npos) {
      int got = 0;
      if (const int rc = MPI_Get_count(&st, datatype(dtype), &got); rc != MPI_SUCCESS)
        throw mpi_error(info_, "MPI_Get_count", rc);
      if (std::size_t(got) != recv_count)
        throw Error(op_name(info_),
                    dtensor::detail::cat("received ", got, " elements from rank ", st.MPI_SOURCE, ", expected ",
                                         recv_count, " (", where(info_), ")"),
                    info_.rank);
    }
  }

  Error timed_out() const {
    return Error(op_name(info_),
                 dtensor::detail::cat(
                     "timed out after ", info_.timeout.count(), " ms waiting for the other ranks of ", where(info_),
                     " (", info_.call, "). MPI cannot cancel an operation in flight, so this process cannot "
                     "safely go on: let the exception end it (dtensor::mpi::run aborts the whole job)"),
                 info_.rank);
  }

  OpInfo info_;
  std::shared_ptr<const void> comm_;
};

}  // namespace dtensor::mpi::detail
