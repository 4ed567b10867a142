// dtensor/kernels/meta/cost_log.hpp — what the kernels on meta tensors would have computed.
//
//   {
//     dtensor::kernels::meta::CostLog cost;      // records on this thread (rank) only
//     auto y = ops::matmul<false, true>(x, w);   // x, w: DTensors of meta_space
//     cost.flops();                              // 2 m n k
//     cost.flops("gemm");  cost.count("gemm");  cost.bytes_read();  cost.bytes_written();
//     std::cout << cost.to_string();
//   }
//
// Every meta kernel appends one record (op name, FLOPs, bytes read, bytes written; a GEMM also
// its shape) to the CostLog scopes alive on the calling thread, as CommLog does for collectives. The counts are
// the analytic ones documented in docs/ops.md ("Cost on meta tensors"): 2 m n k per GEMM, the
// unmasked (query, key) pairs for causal attention, one FLOP per element for pointwise maps, and
// bytes as the fused kernel moves them (attention reads q, k, v and writes out and lse: no
// T x T matrix).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor::kernels::meta {

struct CostRecord {
  std::string op;
  std::int64_t flops = 0;
  std::int64_t bytes_read = 0;
  std::int64_t bytes_written = 0;
  // A GEMM's shape (ops "gemm" and "gemm_fp8"): `batch` products of m x k by k x n, so flops =
  // 2 batch m n k. The cost model counts its output tiles over the SMs from it (sim::op_seconds,
  // the wave quantisation); 0 for every other op, and for a GEMM record that does not know its
  // shape (then timed by its arithmetic intensity alone). Four integers: a record is logged for
  // every op of a dry run, so it stays a flat struct.
  std::int64_t m = 0, n = 0, k = 0, batch = 0;
};

class CostLog {
 public:
  CostLog() : parent_(current()) { current() = this; }
  ~CostLog() { current() = parent_; }
  CostLog(const CostLog&) = delete;
  CostLog& operator=(const CostLog&) = delete;

  const std::vector<CostRecord>& records() const noexcept { return records_; }
  void clear() noexcept { records_.clear(); }

  std::int64_t flops() const { return total([](const CostRecord& r) { return r.flops; }); }
  std::int64_t bytes_read() const { return total([](const CostRecord& r) { return r.bytes_read; }); }
  std::int64_t bytes_written() const { return total([](const CostRecord& r) { return r.bytes_written; }); }
  std::int64_t flops(std::string_view op) const {
    std::int64_t n = 0;
    for (const auto& r : records_) n += r.op == op ? r.flops : 0;
    return n;
  }
  std::size_t count(std::string_view op) const {
    std::size_t n = 0;
    for (const auto& r : records_) n += r.op == op;
    return n;
  }
  /// "gemm: 2048 FLOP, 1024 B read, 512 B written" per record.
  std::string to_string() const {
    std::ostringstream s;
    for (const auto& r : records_)
      s << r.op << ": " << r.flops << " FLOP, " << r.bytes_read << " B read, " << r.bytes_written << " B written\n";
    return s.str();
  }

  /// Called by the meta kernels.
  static void record(const CostRecord& r) {
    for (CostLog* l = current(); l; l = l->parent_) l->records_.push_back(r);
  }

 private:
  template <class F>
  std::int64_t total(F f) const {
    std::int64_t n = 0;
    for (const auto& r : records_) n += f(r);
    return n;
  }
  static CostLog*& current() {
    thread_local CostLog* c = nullptr;
    return c;
  }
  CostLog* parent_;
  std::vector<CostRecord> records_;
};

}  // namespace dtensor::kernels::meta
