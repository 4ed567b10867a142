// dtensor/checkpoint/detail/files.hpp — the POSIX file operations a checkpoint needs, each
// failure a dtensor::Error naming the path and the system's reason.
//
//   OutFile f(path);  f.write(bytes, n);  f.sync_and_close();   // data durable before it counts
//   sync_directory(dir);                                        // the names in it durable too
//   InFile in(path);  in.read_at(offset, n, buffer);            // short read: truncated file
//   replace_directory(staging, dir);                            // atomic where the kernel allows
//
// A checkpoint is committed by one rename of a fully written, fsynced staging directory. When
// `dir` already holds a checkpoint, Linux's renameat2(RENAME_EXCHANGE) swaps the two at once and
// the old one is removed afterwards; where the file system cannot exchange, the old checkpoint
// is first renamed to `dir.previous` (load falls back to it when `dir` is missing, so a crash
// between the two renames still leaves a loadable checkpoint).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "dtensor/core/error.hpp"

namespace dtensor::checkpoint::detail {

namespace fs = std::filesystem;

[[noreturn]] inline void io_fail(const char* op, const std::string& what, const fs::path& path, int err = errno) {
  throw Error(op, dtensor::detail::cat(what, " ", path.string(), ": ", std::strerror(err)));
}

class OutFile {
 public:
  explicit OutFile(const fs::path& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail("checkpoint::save", "cannot create", path);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) io_fail("checkpoint::save", "cannot write", path_);
      p += w;
      n -= std::size_t(w);
      written_ += std::size_t(w);
    }
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  std::size_t written() const noexcept { return written_; }
  /// fsync, then close: the bytes are on the device when this returns.
  void sync_and_close() {
    if (::fsync(fd_) != 0) io_fail("checkpoint::save", "cannot fsync", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io_fail("checkpoint::save", "cannot close", path_);
  }

 private:
  fs::path path_;
  int fd_ = -1;
  std::size_t written_ = 0;
};

class InFile {
 public:
  explicit InFile(const fs::path& path, const char* op = "checkpoint::load") : path_(path), op_(op) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) io_fail(op, "cannot open", path);
  }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  InFile(InFile&& o) noexcept : path_(std::move(o.path_)), op_(o.op_), fd_(o.fd_) { o.fd_ = -1; }
  ~InFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  /// Reads up to n bytes at `offset`; returns how many there were (fewer: the file ends).
  std::size_t read_at(std::uint64_t offset, std::size_t n, void* out) const {
    auto* p = static_cast<char*>(out);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd_, p + got, n - got, off_t(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) io_fail(op_, "cannot read", path_);
      if (r == 0) break;
      got += std::size_t(r);
    }
    return got;
  }
  const fs::path& path() const noexcept { return path_; }

 private:
  fs::path path_;
  const char* op_;
  int fd_ = -1;
};

/// A whole (small, text) file.
inline std::string read_text(const fs::path& path, const char* op) {
  InFile f(path, op);
  std::string s;
  char buf[1 << 16];
  for (std::uint64_t at = 0;;) {
    const std::size_t n = f.read_at(at, sizeof buf, buf);
    s.append(buf, n);
    at += n;
    if (n < sizeof buf) return s;
  }
}

/// Makes the entries of `dir` (names created, renamed, removed) durable.
inline void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("checkpoint::save", "cannot open directory", dir);
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  if (rc != 0) io_fail("checkpoint::save", "cannot fsync directory", dir, err);
}

/// Where a checkpoint is assembled before it replaces `dir`, and where an old one waits while
/// the file system cannot exchange directories.
inline fs::path staging_path(const fs::path& dir) { return fs::path(dir.string() + ".partial"); }
inline fs::path previous_path(const fs::path& dir) { return fs::path(dir.string() + ".previous"); }

inline void remove_tree(const fs::path& p, const char* op) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return;  // also when a parent is not a directory
  fs::remove_all(p, ec);
  if (ec) throw Error(op, dtensor::detail::cat("cannot remove ", p.string(), ": ", ec.message()));
}

/// Puts the complete checkpoint `staging` at `dir` (see the top of this file).
inline void replace_directory(const fs::path& staging, const fs::path& dir) {
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (std::rename(staging.c_str(), dir.c_str()) != 0) io_fail("checkpoint::save", "cannot rename to", dir);
    sync_directory(parent);
    return;
  }
#if defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    sync_directory(parent);
    remove_tree(staging, "checkpoint::save");  // now the old checkpoint
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) io_fail("checkpoint::save", "cannot exchange with", dir);
#endif
  const fs::path previous = previous_path(dir);
  remove_tree(previous, "checkpoint::save");
  if (std::rename(dir.c_str(), previous.c_str()) != 0) io_fail("checkpoint::save", "cannot rename", dir);
  if (std::rename(staging.c_str(), dir.c_str()) != 0) io_fail("checkpoint::save", "cannot rename to", dir);
  sync_directory(parent);
  remove_tree(previous, "checkpoint::save");
}

}  // namespace dtensor::checkpoint::detail
