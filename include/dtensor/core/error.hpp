// dtensor/core/error.hpp — the one exception type of the library.
//
//   throw dtensor::Error("all_gather", "recv has 12 elements, expected 16", rank);
//
// Every run-time failure (bad input, a peer that failed, a timeout, a backend error) is a
// dtensor::Error. Its message always names the operation and, where known, the rank, so that a
// log line from any rank says what went wrong where.
#pragma once

#include <concepts>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dtensor {

class Error : public std::runtime_error {
 public:
  static constexpr int no_rank = -1;

  Error(std::string op, const std::string& what, int rank = no_rank, int backend_code = 0)
      : std::runtime_error(format(op, what, rank, backend_code)),
        op_(std::move(op)),
        rank_(rank),
        backend_code_(backend_code) {}

  const std::string& op() const noexcept { return op_; }
  int rank() const noexcept { return rank_; }
  /// The backend's own error code (MPI, CUDA, NCCL), 0 when the error is dtensor's own.
  int backend_code() const noexcept { return backend_code_; }

 private:
  static std::string format(const std::string& op, const std::string& what, int rank, int code) {
    std::ostringstream s;
    s << "dtensor: " << op;
    if (rank != no_rank) s << " on rank " << rank;
    s << ": " << what;
    if (code != 0) s << " (backend code " << code << ")";
    return s.str();
  }

  std::string op_;
  int rank_;
  int backend_code_;
};

namespace detail {
/// Builds a message from any streamable pieces: detail::cat("got ", n, " expected ", m).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

/// Something that knows its rank (a DeviceMesh, a Communicator): errors name it.
template <class W>
concept HasRank = requires(const W& w) {
  { w.rank() } -> std::convertible_to<int>;
};

/// Throws dtensor::Error(op, message) unless ok; the message is built only on failure.
///   detail::check(n >= 0, "split", "negative size ", n);
template <class... Parts>
inline void check(bool ok, const char* op, const Parts&... parts) {
  if (!ok) [[unlikely]]
    throw Error(op, cat(parts...));
}

/// The same, naming the rank of `where` (a mesh): detail::check(ok, "matmul", x.mesh(), "a ", ...).
template <HasRank Where, class... Parts>
inline void check(bool ok, const char* op, const Where& where, const Parts&... parts) {
  if (!ok) [[unlikely]]
    throw Error(op, cat(parts...), where.rank());
}
}  // namespace detail

}  // namespace dtensor
