// dtensor/optim/offload_adamw.hpp — AdamW whose moments live in a file on local disk (ZeRO-Infinity's
// NVMe offload of the optimizer state), staged through a bounded host buffer.
//
//   optim::OffloadedAdamW<float, 3> opt(fsdp.params(), {.lr = 3e-4},
//                                       {.dir = "/local/nvme", .host_buffer_bytes = 64 << 20}, &mesh.comm());
//   opt.step();            // the same update as optim::AdamW, bit for bit
//   opt.stats();           // bytes read and written, I/O time, and how much of it step() waited for
//
// The two moments of every parameter are one file per optimizer and rank in `dir`, created at
// construction with room for all of them reserved (posix_fallocate: a full disk is found there,
// not in the middle of a step) and removed when the optimizer goes. A step walks the state in
// chunks that fit half of the host buffer: while chunk i is updated, chunk i+1 is read into the
// other half (prefetch) and chunk i-1 is still being written from it until the read needs it
// (write-behind), so the disk's time hides behind the update's as far as the two overlap. Host
// memory for the state is host_buffer_bytes whatever the model's size, or less when the whole
// state is smaller (the ledger: host optimizer_state); the file's bytes are on the ledger under
// the space "disk".
//
// Chunks split a parameter only at multiples of 64 elements from its start: the host kernel
// vectorizes its loop, and those splits keep every element in the same part of the loop (vector
// body or tail) as the whole-parameter call, so the results equal AdamW's exactly.
//
// Errors (dtensor::Error naming the directory, the bytes and the ranks): a directory that is
// missing, not writable, or without room for the state. With a communicator every rank checks
// and all of them throw when any failed (naming the failed ranks), so none goes on alone; the
// file of a rank that did create one is removed first. The file is scratch, never a checkpoint:
// a resume reads the checkpoint (which this optimizer does not write its moments to yet).
// Host memory only (the moments are updated by the host kernels).
#pragma once

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/comm/failed_ranks.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/core/scratch_file.hpp"
#include "dtensor/optim/adamw.hpp"

namespace dtensor::optim {

struct OffloadOptions {
  std::string dir;                                      // an existing, writable directory on local disk
  std::size_t host_buffer_bytes = std::size_t(64) << 20;  // the staging buffer (two halves)
};

/// What the disk did, over every step so far.
struct OffloadStats {
  std::size_t bytes_read = 0, bytes_written = 0;
  double io_seconds = 0;    // the reads' and writes' own time (on their threads)
  double wait_seconds = 0;  // the time step() waited for them: I/O the update did not hide
  double step_seconds = 0;
  std::size_t chunks = 0;   // per step
  std::size_t file_bytes = 0;
  /// The share of the I/O time hidden behind the update (1: all of it).
  double overlap() const { return io_seconds > 0 ? std::max(0.0, 1 - wait_seconds / io_seconds) : 1; }
};

template <class T, std::size_t N>
class OffloadedAdamW : public Optimizer<T, N, host_space> {
  using Base = Optimizer<T, N, host_space>;
  using Clock = std::chrono::steady_clock;

 public:
  /// `comm`: the ranks that construct together (they agree on a bad directory); null: this rank alone.
  OffloadedAdamW(ParamList<T, N, host_space> params, AdamWOptions o, OffloadOptions off, Communicator* comm = nullptr)
      : Base("OffloadedAdamW", std::move(params), o.lr), o_(o), off_(std::move(off)) {
    detail::check_hyper("OffloadedAdamW", "beta1", o.beta1, 0, 1 - 1e-12);
    detail::check_hyper("OffloadedAdamW", "beta2", o.beta2, 0, 1 - 1e-12);
    detail::check_hyper("OffloadedAdamW", "eps", o.eps, 0, 1);
    detail::check_hyper("OffloadedAdamW", "weight_decay", o.weight_decay, 0, 1e6);
    // Half the buffer holds a chunk's two moments; chunks end at multiples of 64 elements.
    capacity_ = off_.host_buffer_bytes / (4 * sizeof(T)) / kAlign * kAlign;
    std::string error;
    if (capacity_ == 0)
      error = dtensor::detail::cat("host_buffer_bytes ", off_.host_buffer_bytes, " is less than ", 4 * sizeof(T) * kAlign,
                                   " (two chunks of ", kAlign, " elements' two moments)");
    else
      plan_chunks();
    const int rank = comm ? comm->rank() : 0;
    if (error.empty()) {
      file_ = std::make_unique<dtensor::detail::ScratchFile>(off_.dir, "adamw-state", rank, "OffloadedAdamW");
      error = file_->error();
      if (error.empty()) error = file_->reserve(2 * sizeof(T) * total_, "the optimizer state");
    }
    agree(comm, error);
    MemoryTagScope tag(MemoryTag::optimizer_state);
    // No more than the largest chunk needs: a state smaller than the buffer holds only its own bytes.
    std::size_t largest = 0;
    for (const auto& ch : chunks_) largest = std::max(largest, ch.elements);
    for (auto& b : half_) b = Tensor<T, 1, host_space>::uninitialized(Shape<1>{Extent(2 * largest)});
    dtensor::detail::ledger_record<disk_ledger>(MemoryTag::optimizer_state, std::int64_t(file_->bytes()));
    stats_.chunks = chunks_.size();
    stats_.file_bytes = file_->bytes();
  }
  OffloadedAdamW(const OffloadedAdamW&) = delete;
  OffloadedAdamW& operator=(const OffloadedAdamW&) = delete;
  ~OffloadedAdamW() {
    if (file_ && file_->error().empty())
      dtensor::detail::ledger_record<disk_ledger>(MemoryTag::optimizer_state, -std::int64_t(file_->bytes()));
  }

  void step() {
    detail::check_reduced("OffloadedAdamW::step", this->params_);
    const auto begin = Clock::now();
    ++t_;
    std::future<double> read, write;  // the chunk being read ahead, the one being written behind
    struct Drain {                    // no I/O outlives the buffers it uses, even on an error
      std::future<double>*a, *b;
      ~Drain() {
        for (auto* f : {a, b})
          if (f->valid()) f->wait();
      }
    } drain{&read, &write};
    auto wait = [&](std::future<double>& f) {
      if (!f.valid()) return;
      const auto t0 = Clock::now();
      stats_.io_seconds += f.get();
      stats_.wait_seconds += seconds(t0);
    };
    auto start_io = [&](bool reading, std::size_t c) {
      return std::async(std::launch::async, [this, reading, c] {
        const auto t0 = Clock::now();
        const auto& ch = chunks_[c];
        T* buf = half_[c % 2].data();
        const std::size_t bytes = 2 * ch.elements * sizeof(T);
        if (reading) file_->read(buf, bytes, ch.file_offset);
        else file_->write(buf, bytes, ch.file_offset);
        return seconds(t0);
      });
    };
    if (!chunks_.empty()) read = start_io(true, 0);
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      wait(read);
      stats_.bytes_read += 2 * chunks_[c].elements * sizeof(T);
      if (c + 1 < chunks_.size()) {
        wait(write);  // chunk c-1, written from the half chunk c+1 is read into
        read = start_io(true, c + 1);
      }
      update(c);
      if (c + 1 == chunks_.size()) wait(write);
      write = start_io(false, c);
      stats_.bytes_written += 2 * chunks_[c].elements * sizeof(T);
    }
    wait(write);
    stats_.step_seconds += seconds(begin);
  }

  long steps() const noexcept { return t_; }
  const OffloadStats& stats() const noexcept { return stats_; }
  const std::string& file() const { return file_->path(); }

 private:
  static constexpr std::size_t kAlign = 64;

  /// A part of parameter k ([begin, begin + count) of its elements) in a chunk.
  struct Piece {
    std::size_t k, begin, count;
  };
  struct Chunk {
    std::vector<Piece> pieces;
    std::size_t elements = 0, file_offset = 0;
  };

  static double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  void plan_chunks() {
    Chunk cur;
    auto close = [&] {
      if (cur.elements == 0) return;
      cur.file_offset = 2 * sizeof(T) * total_;
      total_ += cur.elements;
      chunks_.push_back(std::move(cur));
      cur = {};
    };
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      const std::size_t n = this->params_[k].value.size();
      std::size_t pos = 0;
      while (pos < n) {
        const std::size_t room = capacity_ - cur.elements;
        std::size_t take = std::min(room, n - pos);
        if (take < n - pos) take = take / kAlign * kAlign;  // split only at multiples of 64 from the start
        if (take == 0) {
          close();
          continue;
        }
        cur.pieces.push_back({k, pos, take});
        cur.elements += take;
        pos += take;
        if (cur.elements == capacity_) close();
      }
    }
    close();
  }

  /// AdamW on chunk c's pieces; its moments are in half c % 2: the m of all pieces, then the v.
  void update(std::size_t c) {
    const auto& ch = chunks_[c];
    T* m = half_[c % 2].data();
    T* v = m + ch.elements;
    std::size_t at = 0;
    for (const auto& p : ch.pieces) {
      const auto& ref = this->params_[p.k];
      auto value = nn::detail::flat_view<host_space>(ref.value.subspan(p.begin, p.count));
      auto mv = nn::detail::flat_view<host_space>(std::span<T>(m + at, p.count));
      auto vv = nn::detail::flat_view<host_space>(std::span<T>(v + at, p.count));
      ref.visit_grad([&](auto g) {  // in T, or a narrower type widened per element
        using G = typename decltype(g)::element_type;
        auto grad = nn::detail::flat_view<host_space>(std::span<const G>(g.subspan(p.begin, p.count)));
        kernels::adamw_update(value, grad, mv, vv,
                              {.lr = this->lr_, .beta1 = o_.beta1, .beta2 = o_.beta2, .eps = o_.eps,
                               .weight_decay = ref.decay ? o_.weight_decay : 0.0, .step = t_});
      });
      at += p.count;
    }
  }

  /// Every rank learns whether any failed; all throw then, naming the failed ranks and this one's reason.
  void agree(Communicator* comm, const std::string& error) {
    const std::string ranks = dtensor::detail::failed_ranks(comm, !error.empty());
    const int rank = comm ? comm->rank() : 0;
    if (ranks.empty()) return;
    if (file_) file_->remove();
    throw Error("OffloadedAdamW",
                dtensor::detail::cat("offload directory \"", off_.dir, "\": ",
                                     error.empty() ? std::string("this rank's is usable, but") : error + ";",
                                     " failed on rank(s) ", ranks, " of ", comm ? comm->size() : 1, " (", 2 * sizeof(T) * total_,
                                     " bytes of AdamW moments on this rank)"),
                rank);
  }

  AdamWOptions o_;
  OffloadOptions off_;
  std::size_t capacity_ = 0, total_ = 0;  // elements per half; elements of the whole state
  std::vector<Chunk> chunks_;
  std::unique_ptr<dtensor::detail::ScratchFile> file_;
  Tensor<T, 1, host_space> half_[2];
  OffloadStats stats_;
  long t_ = 0;
};

}  // namespace dtensor::optim
