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
#include <string_view>
#include <type_traits>
#include <utility>

namespace dtensor {

class Error : public std::runtime_error {
 public:
  static constexpr int no_rank = -1;

  /// `rank` is the rank in the group the op ran on; `world_rank`, when given and different,
  /// is printed next to it ("on rank 1 (world rank 5)") so that an error on a sub-group says
  /// which process it is.
  Error(std::string op, const std::string& what, int rank = no_rank, int backend_code = 0, int world_rank = no_rank)
      : std::runtime_error(format(op, what, rank, backend_code, world_rank)),
        op_(std::move(op)),
        message_(what),
        rank_(rank),
        world_rank_(world_rank == no_rank ? rank : world_rank),
        backend_code_(backend_code) {}

  const std::string& op() const noexcept { return op_; }
  /// What went wrong, without the "dtensor: op on rank r: " that what() starts with.
  const std::string& message() const noexcept { return message_; }
  int rank() const noexcept { return rank_; }
  /// The rank in the world communicator (the same as rank() when not known to differ).
  int world_rank() const noexcept { return world_rank_; }
  /// The backend's own error code (MPI, CUDA, NCCL), 0 when the error is dtensor's own.
  int backend_code() const noexcept { return backend_code_; }

 private:
  static std::string format(const std::string& op, const std::string& what, int rank, int code, int world_rank) {
    std::ostringstream s;
    s << "dtensor: " << op;
    if (rank != no_rank) s << " on rank " << rank;
    if (rank != no_rank && world_rank != no_rank && world_rank != rank) s << " (world rank " << world_rank << ")";
    s << ": " << what;
    if (code != 0) s << " (backend code " << code << ")";
    return s.str();
  }

  std::string op_;
  std::string message_;
  int rank_;
  int world_rank_;
  int backend_code_;
};

namespace detail {
/// One piece of a message, appended as `std::ostream << part` writes it. Text and integers are
/// appended directly; anything else goes through a stream of its own. Per piece type, not per
/// message: an ostringstream in every cat<...> (one per distinct list of argument types, over
/// 80 in a GPT training program) was 5 % of such a program's object code.
template <class P>
void cat_piece(std::string& out, const P& p) {
  if constexpr (std::is_same_v<P, std::string> || std::is_same_v<P, std::string_view>) out.append(p);
  else if constexpr (std::is_array_v<P> && std::is_same_v<std::remove_cv_t<std::remove_extent_t<P>>, char>)
    out.append(p);
  else if constexpr (std::is_same_v<P, const char*> || std::is_same_v<P, char*>) {
    if (p) out.append(p);  // (a stream would print nothing, and nothing after it either)
  } else if constexpr (std::is_integral_v<P> && !std::is_same_v<P, bool> && !std::is_same_v<P, char> &&
                       !std::is_same_v<P, signed char> && !std::is_same_v<P, unsigned char> &&
                       !std::is_same_v<P, wchar_t> && !std::is_same_v<P, char8_t> && !std::is_same_v<P, char16_t> &&
                       !std::is_same_v<P, char32_t>)
    out.append(std::to_string(p));
  else {
    std::ostringstream s;
    s << p;
    out.append(s.str());
  }
}

/// Builds a message from any streamable pieces: detail::cat("got ", n, " expected ", m).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (cat_piece(out, parts), ...);
  return out;
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

/// The message of the exception fn() throws, or "" if it throws none (what a rank tells its
/// peers before they agree on a failure: checkpoint/detail/agree.hpp, the MPI tests).
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}
}  // namespace detail

}  // namespace dtensor
