// dtensor/core/error.hpp — the one exception type of the library.
//
//   throw dtensor::Error("all_gather", "recv has 12 elements, expected 16", rank);
//
// Every run-time failure (bad input, a peer that failed, a timeout, a backend error) is a
// dtensor::Error. Its message always names the operation and, where known, the rank, so that a
// log line from any rank says what went wrong where.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <ostream>
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
  // An op or a message written as a literal (most throw sites): the strings are built here, not
  // at each site (two constructions and their clean-ups per throw, in code that never runs).
  [[gnu::noinline]] Error(const char* op, const std::string& what, int rank = no_rank, int backend_code = 0,
                          int world_rank = no_rank)
      : Error(std::string(op), what, rank, backend_code, world_rank) {}
  [[gnu::noinline]] Error(const char* op, const char* what, int rank = no_rank, int backend_code = 0,
                          int world_rank = no_rank)
      : Error(std::string(op), std::string(what), rank, backend_code, world_rank) {}

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
/// A view of one piece of a message, appended as `std::ostream << piece` writes it. Text and
/// integers are held as such; anything else is held by address with the one function that streams
/// its type. detail::cat and detail::check turn their pieces into these and hand them to one
/// function that is not a template: what a message's list of piece types instantiates is an array
/// of views, not a function body (225 cat<...> and 74 check<...> bodies, each with its own string
/// building and throw, in a GPT training program).
class MessagePiece {
 public:
  // Each constructor sets only what its kind reads (a piece is built at every check site, in code
  // that runs only on failure; its length, for a C string, is taken when the message is built).
  MessagePiece(const char* text) : data_(text), kind_(Kind::c_string) {}
  MessagePiece(const std::string& text) : data_(text.data()), size_(text.size()), kind_(Kind::text) {}
  MessagePiece(std::string_view text) : data_(text.data()), size_(text.size()), kind_(Kind::text) {}
  template <class P>
    requires(!std::is_convertible_v<const P&, std::string_view> && !std::is_convertible_v<const P&, const char*>)
  MessagePiece(const P& piece) {
    if constexpr (std::is_integral_v<P> && !std::is_same_v<P, bool> && !std::is_same_v<P, char> &&
                  !std::is_same_v<P, signed char> && !std::is_same_v<P, unsigned char> && !std::is_same_v<P, wchar_t> &&
                  !std::is_same_v<P, char8_t> && !std::is_same_v<P, char16_t> && !std::is_same_v<P, char32_t>) {
      kind_ = std::is_signed_v<P> ? Kind::signed_integer : Kind::unsigned_integer;
      size_ = static_cast<std::uint64_t>(piece);  // (two's complement: signed_integer casts it back)
    } else {
      kind_ = Kind::streamed;
      data_ = &piece;
      stream_ = &stream_as<P>;
    }
  }

  void append_to(std::string& out) const {
    switch (kind_) {
      case Kind::c_string:
        if (data_) out.append(static_cast<const char*>(data_));
        return;
      case Kind::text:
        out.append(static_cast<const char*>(data_), size_);
        return;
      case Kind::signed_integer:
        out.append(std::to_string(static_cast<long long>(size_)));
        return;
      case Kind::unsigned_integer:
        out.append(std::to_string(static_cast<unsigned long long>(size_)));
        return;
      case Kind::streamed: {
        std::ostringstream s;
        stream_(s, data_);
        out.append(s.str());
        return;
      }
    }
  }

 private:
  template <class P>
  static void stream_as(std::ostream& s, const void* object) {
    s << *static_cast<const P*>(object);
  }

  enum class Kind : unsigned char { c_string, text, signed_integer, unsigned_integer, streamed };
  const void* data_;                            // the text (null: none), or the streamed object
  std::uint64_t size_;                          // the text's length, or the integer
  void (*stream_)(std::ostream&, const void*);  // how the streamed object is written
  Kind kind_;
};

/// The pieces one after the other.
inline std::string cat_pieces(std::initializer_list<MessagePiece> pieces) {
  std::string out;
  for (const MessagePiece& p : pieces) p.append_to(out);
  return out;
}

/// Builds a message from any streamable pieces: detail::cat("got ", n, " expected ", m).
template <class... Parts>
std::string cat(const Parts&... parts) {
  return cat_pieces({MessagePiece(parts)...});
}

/// Something that knows its rank (a DeviceMesh, a Communicator): errors name it.
template <class W>
concept HasRank = requires(const W& w) {
  { w.rank() } -> std::convertible_to<int>;
};

/// check's failure: one body for every list of pieces, kept out of the checking functions.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_checked(const char* op, int rank,
                                                                 std::initializer_list<MessagePiece> pieces) {
  throw Error(op, cat_pieces(pieces), rank);
}

/// Throws dtensor::Error(op, message) unless ok; the message is built only on failure.
///   detail::check(n >= 0, "split", "negative size ", n);
template <class... Parts>
inline void check(bool ok, const char* op, const Parts&... parts) {
  if (!ok) [[unlikely]]
    throw_checked(op, Error::no_rank, {MessagePiece(parts)...});
}

/// The same, naming the rank of `where` (a mesh): detail::check(ok, "matmul", x.mesh(), "a ", ...).
template <HasRank Where, class... Parts>
inline void check(bool ok, const char* op, const Where& where, const Parts&... parts) {
  if (!ok) [[unlikely]]
    throw_checked(op, where.rank(), {MessagePiece(parts)...});
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
