// dtensor/core/scratch_file.hpp — a scratch file on local disk that offloaded state lives in
// (optim::OffloadedAdamW's moments, nn::ActivationOffload's saved activations), and the ledger's
// name for its bytes.
//
//   detail::ScratchFile f(dir, "adamw-state", rank);   // dir/dtensor-adamw-state.rank0.<pid>.<n>.tmp
//   if (!f.error().empty()) ...                         // missing or read-only dir: nothing was made
//   f.reserve(bytes, "the optimizer state");            // grows it with the bytes reserved: "" or why not
//   f.write(src, n, at);  f.read(dst, n, at);           // pwrite / pread, whole or an Error
//
// The file is created exclusively (O_EXCL, a name unique to the process and the object) and its
// name removed at once (the descriptor keeps it: reads, writes and mappings go through it), so
// nothing is left on disk once the object or the process ends, even killed with SIGKILL; no
// later run or resume can find it. path() is the name it had, for messages. reserve() uses posix_fallocate, so a full disk is found when the room is taken, not in
// the middle of a write. read() and write() may run on several threads at once (pread/pwrite
// at disjoint offsets).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"

namespace dtensor {

/// The allocation ledger's name for bytes held in files on local disk (offloaded state).
struct disk_ledger {
  static constexpr std::string_view name = "disk";
};

namespace detail {

/// A scratch file, removed with the object. An empty error() means it was made; otherwise
/// nothing is left on disk. `owner` names the Error of a failed read or write.
class ScratchFile {
 public:
  ScratchFile(const std::string& dir, std::string_view what, int rank, std::string owner)
      : owner_(std::move(owner)), dir_(dir) {
    static std::atomic<unsigned> serial{0};
    path_ = dir + "/dtensor-" + std::string(what) + ".rank" + std::to_string(rank) + "." + std::to_string(::getpid()) +
            "." + std::to_string(serial++) + ".tmp";
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      error_ = "offload directory " + dir + " does not exist (or is not a directory)";
      return;
    }
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      error_ = "cannot create " + path_ + " (" + std::strerror(errno) + "): the offload directory must be writable";
      return;
    }
    if (::unlink(path_.c_str()) != 0) {  // the descriptor alone holds it from here on
      error_ = "cannot unlink " + path_ + " (" + std::strerror(errno) + ") after creating it";
      ::close(fd_);
      fd_ = -1;
    }
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile() { remove(); }

  const std::string& error() const noexcept { return error_; }
  const std::string& path() const noexcept { return path_; }
  /// The bytes reserved so far.
  std::size_t bytes() const noexcept { return bytes_; }
  /// The descriptor (for a mapping of the file); -1 once removed or if it was never made.
  int fd() const noexcept { return fd_; }

  /// Grows the file to `total` bytes, all of them reserved; "" or why not (the file is kept as
  /// it was). `what` names the state in the message.
  std::string reserve(std::size_t total, std::string_view what) {
    if (total <= bytes_) return {};
    int r = ::posix_fallocate(fd_, off_t(bytes_), off_t(total - bytes_));
    if (r == EOPNOTSUPP || r == EINVAL) r = ::ftruncate(fd_, off_t(total)) == 0 ? 0 : errno;  // no reservation there
    if (r != 0)
      return cat("cannot reserve ", total - bytes_, " bytes for ", what, " in ", dir_, " (", std::strerror(r), ")");
    bytes_ = total;
    return {};
  }

  void read(void* dst, std::size_t n, std::size_t at) const { io(true, dst, n, at); }
  void write(const void* src, std::size_t n, std::size_t at) const { io(false, const_cast<void*>(src), n, at); }

  /// Closes the file, which frees its bytes (its name was removed at creation).
  void remove() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }

 private:
  void io(bool reading, void* buf, std::size_t n, std::size_t at) const {
    auto* p = static_cast<char*>(buf);
    while (n > 0) {
      const ssize_t k = reading ? ::pread(fd_, p, n, off_t(at)) : ::pwrite(fd_, p, n, off_t(at));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        throw Error(owner_, cat(reading ? "reading " : "writing ", n, " bytes at ", at, " of ", path_,
                                " failed: ", k < 0 ? std::strerror(errno) : "end of file"));
      p += k;
      n -= std::size_t(k);
      at += std::size_t(k);
    }
  }

  std::string owner_, dir_, path_, error_;
  std::size_t bytes_ = 0;
  int fd_ = -1;
};

}  // namespace detail
}  // namespace dtensor
