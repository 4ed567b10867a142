// dtensor/comm/comm_log.hpp — recording the collectives a piece of code issues.
//
//   {
//     dtensor::CommLog log;                       // records on this rank (thread) only
//     auto y = x.redistribute<Layout<Replicate>>();
//     REQUIRE(log.count(CollectiveKind::all_gather) == 1);
//     std::cout << log.to_string();
//   }
//
// A CommLog is an RAII scope: every collective the calling thread issues while it is alive is
// appended to it (and to the scopes that enclose it). On the threads backend each rank is a
// thread, so each rank sees its own log, exactly as each process does under MPI.
#pragma once

#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/core/dtype.hpp"

namespace dtensor {

enum class CollectiveKind : std::uint8_t {
  all_gather,
  reduce_scatter,
  all_reduce,
  all_to_all,
  all_to_all_v,
  broadcast,
  send,
  recv,
  send_recv,
  barrier,
  split,
};

constexpr std::string_view name_of(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::all_to_all: return "all_to_all";
    case CollectiveKind::all_to_all_v: return "all_to_all_v";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
    case CollectiveKind::send_recv: return "send_recv";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::split: return "split";
  }
  return "?";
}

/// The bytes one rank sends and receives in a collective over `group` ranks whose larger
/// buffer (nccl-tests' "size") is `size_bytes`, under the algorithms that are bandwidth-optimal
/// for large messages: a ring all-gather, reduce-scatter or all-to-all moves (n-1)/n of the
/// buffer each way, a ring all-reduce (a reduce-scatter, then an all-gather) twice that, a
/// pipelined broadcast the whole buffer. The redistribution planner's estimate
/// (Plan::estimate) uses the same figures, so a plan and the log of running it agree.
struct WireBytes {
  std::size_t sent = 0, received = 0;
};
constexpr WireBytes wire_bytes(CollectiveKind k, std::size_t size_bytes, int group) {
  if (group <= 1) return {};
  const std::size_t n = std::size_t(group);
  const std::size_t ring = size_bytes / n * (n - 1) + size_bytes % n * (n - 1) / n;  // (n-1)/n, no overflow
  switch (k) {
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
    case CollectiveKind::all_to_all_v: return {ring, ring};
    case CollectiveKind::all_reduce: return {2 * ring, 2 * ring};
    case CollectiveKind::broadcast:
    case CollectiveKind::send_recv: return {size_bytes, size_bytes};
    case CollectiveKind::send: return {size_bytes, 0};
    case CollectiveKind::recv: return {0, size_bytes};
    case CollectiveKind::barrier:
    case CollectiveKind::split: return {};
  }
  return {};
}

/// One collective as this rank issued it.
struct CommRecord {
  CollectiveKind kind;
  std::string group;       // the communicator's label: a mesh dimension ("tp"), "dp*tp", "world"
  int group_size = 0;
  std::size_t bytes = 0;   // the larger of this rank's input and output (nccl-tests' "size")
  DType dtype = DType::uint8;
  ReduceOp op = ReduceOp::sum;  // meaningful for reductions only
  int peer = -1;                // send / recv: the peer's rank in the group

  /// What this rank sends and receives on the wire (see wire_bytes).
  WireBytes wire() const { return wire_bytes(kind, bytes, group_size); }
};

class CommLog {
 public:
  CommLog() : parent_(current()) { current() = this; }
  ~CommLog() { current() = parent_; }
  CommLog(const CommLog&) = delete;
  CommLog& operator=(const CommLog&) = delete;

  const std::vector<CommRecord>& records() const noexcept { return records_; }
  std::size_t size() const noexcept { return records_.size(); }
  void clear() noexcept { records_.clear(); }

  std::size_t count(CollectiveKind k) const {
    std::size_t n = 0;
    for (const auto& r : records_) n += (r.kind == k);
    return n;
  }
  std::size_t count(CollectiveKind k, std::string_view group) const {
    std::size_t n = 0;
    for (const auto& r : records_) n += (r.kind == k && r.group == group);
    return n;
  }
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& r : records_) n += r.bytes;
    return n;
  }
  /// Bytes this rank sent and received over all records (see wire_bytes).
  WireBytes wire() const {
    WireBytes w;
    for (const auto& r : records_) {
      const auto one = r.wire();
      w.sent += one.sent;
      w.received += one.received;
    }
    return w;
  }
  /// "all_gather(tp, 4 ranks, 1024 B, float32, sent 768 B, received 768 B)" per line.
  std::string to_string() const {
    std::ostringstream s;
    for (const auto& r : records_) {
      s << name_of(r.kind) << '(' << r.group << ", " << r.group_size << " ranks, " << r.bytes << " B, "
        << name_of(r.dtype);
      if (r.kind == CollectiveKind::all_reduce || r.kind == CollectiveKind::reduce_scatter) s << ", " << name_of(r.op);
      if (r.peer >= 0) s << ", peer " << r.peer;
      const auto w = r.wire();
      s << ", sent " << w.sent << " B, received " << w.received << " B";
      s << ")\n";
    }
    return s.str();
  }

  /// Called by Communicator for every operation it issues.
  static void record(const CommRecord& r) {
    for (CommLog* l = current(); l; l = l->parent_) l->records_.push_back(r);
  }

 private:
  static CommLog*& current() {
    thread_local CommLog* c = nullptr;
    return c;
  }
  CommLog* parent_;
  std::vector<CommRecord> records_;
};

}  // namespace dtensor
