// dtensor/optim/detail/offload_file.hpp — the disk tier of offload (issue 27), one piece of code
// per idea, for every offloaded state (optim::OffloadedAdamW's moments today; parameters and
// activations may reuse it):
//
//   detail::OffloadFile file(dir, bytes, comm.rank(), "adamw-state");  // reserved up front, removed with it
//   detail::agree_on_offload(&comm, file.error(), {&file}, "OffloadedAdamW", dir, "8192 bytes of AdamW moments");
//   detail::stream_chunks(chunks, read, update, write, stats);          // prefetch c+1, write c-1 behind
//   detail::FileMapping map(file);  // or the file's bytes as memory: map.data(), prefetch / release / write_behind
//
// OffloadFile: one scratch file per rank and state, all its bytes reserved at creation
// (posix_fallocate: a full disk is found there, not in the middle of a step), closed and deleted
// with the object. A failure leaves nothing on disk and an error() naming the directory.
//
// agree_on_offload: every rank of the communicator learns whether any rank failed to make its
// file; when one did, every rank removes its own files and throws a dtensor::Error naming the
// directory, this rank's reason and the failed ranks — no rank goes on alone, no file is left
// that a resume could mistake for state.
//
// stream_chunks: the double-buffered walk over a file's chunks. read(c) and write(c) move chunk c
// between the file and buffer half c % 2 on a helper thread (returning the bytes moved); process(c)
// runs on the calling thread between them. While chunk c is processed, chunk c + 1 is read into
// the other half (prefetch) and chunk c - 1 is written from it until the read needs it
// (write-behind), so the disk's time hides behind the processing as far as the two overlap. Pass
// no_write for a read-only pass. No I/O outlives the call, even when one throws.
//
// FileMapping: the file's bytes mapped into memory (MAP_SHARED), for state that other code reads
// and writes in place through pointers it keeps (FSDP's master shards: the optimizer's views
// point at them). The kernel's page cache is then the staging buffer: prefetch(at, n) starts
// reading a range ahead of its use (MADV_WILLNEED), release(at, n) drops it from this process's
// memory after use (MADV_DONTNEED: the pages stay the file's; the next touch reads them back) and
// write_behind() starts writing the dirty pages to the disk without waiting (sync_file_range).
// Pages the file holds are clean or written back, so the kernel can evict them under pressure:
// the state does not need to fit in the host's memory.
//
// The API is deliberately small and stable (another area builds on it): change it only together
// with every user.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <future>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/comm/failed_ranks.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/core/scratch_file.hpp"  // ScratchFile, disk_ledger

namespace dtensor::optim {

/// What the disk did, over every pass so far.
struct OffloadStats {
  std::size_t bytes_read = 0, bytes_written = 0;
  double io_seconds = 0;    // the reads' and writes' own time (on their threads)
  double wait_seconds = 0;  // the time the caller waited for them: I/O the processing did not hide
  double step_seconds = 0;
  std::size_t chunks = 0;   // per pass
  std::size_t file_bytes = 0;
  /// The share of the I/O time hidden behind the processing (1: all of it).
  double overlap() const { return io_seconds > 0 ? std::max(0.0, 1 - wait_seconds / io_seconds) : 1; }
};

namespace detail {

/// A scratch file (core/scratch_file.hpp's, the activation offload's too) of `bytes` reserved
/// (zero) bytes in `dir`, named after `what` and the rank, removed with the object. An empty
/// error() means it was made; otherwise nothing is on disk. Reads and writes past `bytes` are an
/// Error (a caller's offset bug would otherwise grow the file past its reservation).
class OffloadFile {
 public:
  OffloadFile(const std::string& dir, std::size_t bytes, int rank, std::string_view what)
      : file_(dir, what, rank, "offload file"), error_(file_.error()), bytes_(bytes) {
    if (error_.empty()) {
      error_ = file_.reserve(bytes, what);
      if (!error_.empty()) file_.remove();
    }
  }

  const std::string& error() const noexcept { return error_; }
  const std::string& path() const noexcept { return file_.path(); }
  std::size_t bytes() const noexcept { return bytes_; }
  int fd() const noexcept { return file_.fd(); }

  void read(void* dst, std::size_t n, std::size_t at) const {
    within(n, at, "reading ");
    file_.read(dst, n, at);
  }
  void write(const void* src, std::size_t n, std::size_t at) const {
    within(n, at, "writing ");
    file_.write(src, n, at);
  }
  /// Closes and deletes the file (also what a failure leaves: nothing).
  void remove() noexcept { file_.remove(); }

 private:
  void within(std::size_t n, std::size_t at, const char* doing) const {
    if (at + n > bytes_)
      throw Error("offload file", dtensor::detail::cat(doing, n, " bytes at ", at, " of ", path(), ": past its ",
                                                       bytes_, " bytes"));
  }

  dtensor::detail::ScratchFile file_;
  std::string error_;
  std::size_t bytes_ = 0;
};

/// An OffloadFile's bytes as memory (see the top of this file). Unmapped with the object, which
/// must go before the file.
class FileMapping {
 public:
  FileMapping() = default;
  explicit FileMapping(const OffloadFile& file) : fd_(file.fd()), bytes_(file.bytes()) {
    if (bytes_ == 0) return;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED)
      throw Error("offload file", dtensor::detail::cat("mapping the ", bytes_, " bytes of ", file.path(), " failed: ",
                                                       std::strerror(errno)));
    data_ = p;
  }
  FileMapping(FileMapping&& o) noexcept : data_(std::exchange(o.data_, nullptr)), fd_(o.fd_), bytes_(o.bytes_) {}
  FileMapping& operator=(FileMapping&& o) noexcept {
    if (this != &o) {
      unmap();
      data_ = std::exchange(o.data_, nullptr), fd_ = o.fd_, bytes_ = o.bytes_;
    }
    return *this;
  }
  ~FileMapping() { unmap(); }

  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  /// Starts reading bytes [at, at + n) ahead of their use (advice: never fails the caller).
  void prefetch(std::size_t at, std::size_t n) const noexcept { advise(at, n, MADV_WILLNEED); }
  /// Drops bytes [at, at + n) from this process's memory; their values stay in the file.
  void release(std::size_t at, std::size_t n) const noexcept { advise(at, n, MADV_DONTNEED); }
  /// Starts writing the dirty pages to the disk (returns at once).
  void write_behind() const noexcept {
#ifdef __linux__
    if (data_) (void)::sync_file_range(fd_, 0, off_t(bytes_), SYNC_FILE_RANGE_WRITE);
#else
    if (data_) (void)::msync(data_, bytes_, MS_ASYNC);
#endif
  }

 private:
  void advise(std::size_t at, std::size_t n, int how) const noexcept {
    if (!data_ || n == 0) return;
    // Whole pages only: a page is shared with the neighbouring range at the ends.
    const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
    std::size_t lo = (at + page - 1) / page * page, hi = std::min(bytes_, at + n) / page * page;
    if (how == MADV_WILLNEED) lo = at / page * page, hi = std::min(bytes_, (at + n + page - 1) / page * page);
    if (hi > lo) (void)::madvise(static_cast<char*>(data_) + lo, hi - lo, how);
  }
  void unmap() noexcept {
    if (data_) ::munmap(data_, bytes_);
    data_ = nullptr;
  }

  void* data_ = nullptr;
  int fd_ = -1;
  std::size_t bytes_ = 0;
};

/// Every rank of `comm` (null: this rank alone) learns whether any failed (a non-empty `error`
/// on it); when one did, every rank removes `files` and throws, from `op`, an Error naming the
/// directory, this rank's reason, the failed ranks and `what` (the state's bytes on this rank).
/// Collective: one all-reduce of one int per rank.
inline void agree_on_offload(Communicator* comm, const std::string& error, const std::vector<OffloadFile*>& files,
                             std::string_view op, std::string_view dir, std::string_view what) {
  const std::string ranks = dtensor::detail::failed_ranks(comm, !error.empty());
  if (ranks.empty()) return;
  for (auto* f : files)
    if (f) f->remove();
  throw Error(std::string(op), dtensor::detail::cat("offload directory \"", dir, "\": ",
                                                    error.empty() ? std::string("this rank's is usable, but") : error + ";",
                                                    " failed on rank(s) ", ranks, " of ", comm ? comm->size() : 1, " (",
                                                    what, ")"),
              comm ? comm->rank() : 0);
}

/// The write of stream_chunks' read-only pass.
struct NoWrite {
  std::size_t operator()(std::size_t) const { return 0; }
};
inline constexpr NoWrite no_write{};

/// Walks chunks [0, n) (see the top of this file): read(c) and write(c) on helper threads, each
/// returning the bytes it moved; process(c) on this thread. Adds to `stats` (not chunks or
/// file_bytes): bytes, the I/O's own time, the time waited for it, the walk's time.
template <class Read, class Process, class Write>
void stream_chunks(std::size_t n, Read&& read, Process&& process, Write&& write, OffloadStats& stats) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  constexpr bool writes = !std::is_same_v<std::remove_cvref_t<Write>, NoWrite>;
  (void)write;  // a read-only pass never calls it
  const auto begin = Clock::now();
  struct Done {
    std::size_t bytes;
    double seconds;
  };
  std::future<Done> reading, writing;  // the chunk being read ahead, the one being written behind
  struct Drain {                       // no I/O outlives the buffers it uses, even on an error
    std::future<Done>*a, *b;
    ~Drain() {
      for (auto* f : {a, b})
        if (f->valid()) f->wait();
    }
  } drain{&reading, &writing};
  auto wait = [&](std::future<Done>& f, std::size_t& bytes) {
    if (!f.valid()) return;
    const auto t0 = Clock::now();
    const Done d = f.get();
    stats.wait_seconds += seconds(t0);
    stats.io_seconds += d.seconds;
    bytes += d.bytes;
  };
  auto start = [&](auto& io, std::size_t c) {
    return std::async(std::launch::async, [&io, c, seconds] {
      const auto t0 = Clock::now();
      const std::size_t bytes = io(c);
      return Done{bytes, seconds(t0)};
    });
  };
  if (n > 0) reading = start(read, 0);
  for (std::size_t c = 0; c < n; ++c) {
    wait(reading, stats.bytes_read);
    if (c + 1 < n) {
      wait(writing, stats.bytes_written);  // chunk c-1, written from the half chunk c+1 is read into
      reading = start(read, c + 1);
    }
    process(c);
    if constexpr (writes) {
      wait(writing, stats.bytes_written);  // one write in flight at a time
      writing = start(write, c);
    }
  }
  wait(writing, stats.bytes_written);
  stats.step_seconds += seconds(begin);
}

}  // namespace detail
}  // namespace dtensor::optim
