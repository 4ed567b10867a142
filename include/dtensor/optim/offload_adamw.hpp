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
// a checkpoint saves the moments through held_moments() (below), which reads them into host
// memory for the save, and a resume writes them back with HeldMoments::store().
// Host memory only (the moments are updated by the host kernels). The file, the ranks' agreement
// and the prefetch/write-behind walk are optim/detail/offload_file.hpp's, shared with the other
// offloads.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/detail/offload_file.hpp"

namespace dtensor::optim {

struct OffloadOptions {
  std::string dir;                                      // an existing, writable directory on local disk
  std::size_t host_buffer_bytes = std::size_t(64) << 20;  // the staging buffer (two halves)
};

template <class T, std::size_t N>
class OffloadedAdamW : public Optimizer<T, N, host_space> {
  using Base = Optimizer<T, N, host_space>;

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
      file_ = std::make_unique<detail::OffloadFile>(off_.dir, 2 * sizeof(T) * total_, rank, "adamw-state");
      error = file_->error();
    }
    detail::agree_on_offload(comm, error, {file_.get()}, "OffloadedAdamW", off_.dir,
                             dtensor::detail::cat(2 * sizeof(T) * total_, " bytes of AdamW moments on this rank"));
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
    ++t_;
    detail::stream_chunks(chunks_.size(), [this](std::size_t c) { return io(true, c); }, [this](std::size_t c) { update(c); },
                          [this](std::size_t c) { return io(false, c); }, stats_);
  }

  long steps() const noexcept { return t_; }
  /// What a resume restores with the moments (checkpoint/training_state.hpp).
  void set_steps(long t) {
    if (t < 0) throw Error("OffloadedAdamW::set_steps", dtensor::detail::cat("step count ", t, " is negative"));
    t_ = t;
  }
  const OffloadStats& stats() const noexcept { return stats_; }
  const std::string& file() const { return file_->path(); }

  /// The moments read from the file into host memory, with AdamW's interface for a checkpoint
  /// (params(), exp_avg(k), exp_avg_sq(k), steps(), set_steps(): checkpoint::adamw_slots and
  /// the pipeline's save and load take it where they take an AdamW). store() writes them back
  /// (after a load). While it lives, the rank holds its whole moments in host memory (the
  /// ledger's host optimizer_state): a checkpoint costs what AdamW in memory would, for its
  /// duration. Not while step() runs.
  class HeldMoments {
   public:
    explicit HeldMoments(OffloadedAdamW& opt) : opt_(&opt) {
      MemoryTagScope tag(MemoryTag::optimizer_state);
      m_ = Tensor<T, 1, host_space>::uninitialized(Shape<1>{Extent(opt.total_)});
      v_ = Tensor<T, 1, host_space>::uninitialized(Shape<1>{Extent(opt.total_)});
      at_.resize(opt.params_.size() + 1, 0);
      for (std::size_t k = 0; k < opt.params_.size(); ++k) at_[k + 1] = at_[k] + opt.params_[k].value.size();
      walk(true);
    }
    auto& params() noexcept { return opt_->params(); }
    std::span<T> exp_avg(std::size_t k) { return {m_.data() + at_[k], at_[k + 1] - at_[k]}; }
    std::span<T> exp_avg_sq(std::size_t k) { return {v_.data() + at_[k], at_[k + 1] - at_[k]}; }
    long steps() const noexcept { return opt_->steps(); }
    void set_steps(long t) { opt_->set_steps(t); }
    /// Writes the held moments to the optimizer's file.
    void store() { walk(false); }

   private:
    /// Chunk by chunk through the optimizer's first buffer half: the file's layout (a chunk's m
    /// of every piece, then its v) to and from the per-parameter order held here.
    void walk(bool reading) {
      auto& o = *opt_;
      T* buf = o.half_[0].data();
      for (const auto& ch : o.chunks_) {
        const std::size_t bytes = 2 * ch.elements * sizeof(T);
        if (reading) o.file_->read(buf, bytes, ch.file_offset);
        std::size_t at = 0;
        for (const auto& p : ch.pieces) {
          T* m = m_.data() + at_[p.k] + p.begin;
          T* v = v_.data() + at_[p.k] + p.begin;
          if (reading) {
            std::copy_n(buf + at, p.count, m);
            std::copy_n(buf + ch.elements + at, p.count, v);
          } else {
            std::copy_n(m, p.count, buf + at);
            std::copy_n(v, p.count, buf + ch.elements + at);
          }
          at += p.count;
        }
        if (!reading) o.file_->write(buf, bytes, ch.file_offset);
      }
    }

    OffloadedAdamW* opt_;
    Tensor<T, 1, host_space> m_, v_;
    std::vector<std::size_t> at_;  // parameter k's moments start at at_[k]
  };
  HeldMoments held_moments() { return HeldMoments(*this); }

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

  /// Reads or writes chunk c's two moments in its buffer half (on stream_chunks' I/O thread).
  std::size_t io(bool reading, std::size_t c) {
    const auto& ch = chunks_[c];
    T* buf = half_[c % 2].data();
    const std::size_t bytes = 2 * ch.elements * sizeof(T);
    if (reading) file_->read(buf, bytes, ch.file_offset);
    else file_->write(buf, bytes, ch.file_offset);
    return bytes;
  }

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

  AdamWOptions o_;
  OffloadOptions off_;
  std::size_t capacity_ = 0, total_ = 0;  // elements per half; elements of the whole state
  std::vector<Chunk> chunks_;
  std::unique_ptr<detail::OffloadFile> file_;
  Tensor<T, 1, host_space> half_[2];
  OffloadStats stats_;
  long t_ = 0;
};

}  // namespace dtensor::optim
