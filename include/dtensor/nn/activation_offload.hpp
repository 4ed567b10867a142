// dtensor/nn/activation_offload.hpp — saved activations moved off the compute memory after a
// block's forward and brought back before its backward (PyTorch's save_on_cpu, torchtitan's
// activation offloading), overlapped with the compute.
//
//   auto off = std::make_shared<nn::ActivationOffload>(
//       nn::ActivationOffloadOptions{.tier = nn::OffloadTier::disk, .dir = "/local/nvme"}, &mesh.comm());
//   model.set_activation_offload(off);                   // nn::Stack (a GPT, a pipeline stage): every block
//   model.set_activation_offload(off, [](Extent l) { return l % 2 == 0; });   // or chosen blocks
//   off->stats();                                        // bytes moved, I/O time, the share of it hidden
//
// What moves: every tensor a block's saved state owns (nn::for_each_saved_tensor: the state's
// structs list their members with tensors(); DTensors, optionals, vectors, variants and tuples
// are walked) — the block's inputs, q/k/v/out and the attention statistics, the MLP's hidden
// activations; with nn::Checkpointed, the one input it keeps. Views and empty tensors stay.
//
// When (nn::Stack drives it; one ticket per block and micro-batch, in the Stack's saved state):
//   put(saved)      after block l's forward: its tensors leave the saved state for the entry,
//                   a background thread writes them to the tier (write-behind), and the entry
//                   before it, once written, frees its memory: at most two blocks' saved state
//                   stays in compute memory during the forward.
//   prefetch(t)     when block l's backward starts, block l-1's entry is read back on a background
//                   thread (reverse order); an entry still in memory (the last block's: its write
//                   not yet reaped) is kept as it is, never re-read.
//   get(t, saved)   before block l's backward: waits for its read and moves the tensors back.
// Each micro-batch's saved state holds its own tickets, so pipeline schedules with several
// micro-batches in flight (1F1B, interleaved) offload each independently. The bytes come back
// unchanged: the backward is bit for bit the in-memory one.
//
// Tiers (OffloadTier): `disk` — one scratch file per offloader and rank under `dir` (missing or
// read-only: a dtensor::Error on every rank at construction, nothing left on disk), regions
// reused by size from step to step; `host` — host memory (for a device model: its saved state
// on the host; with a host model it is a copy in the same memory, which only tests the path).
// Device tensors are staged through host memory on the calling thread (to_space); the meta
// space moves nothing and only records the bytes, so a dry run's ledger shows the tiers.
//
// Threads: allocations and frees happen on the calling (rank's) thread — the allocation ledger
// counts a buffer where it is freed — and the background threads only read and write bytes.
// The ledger: the tier's bytes are on it (space "disk" or "host", tag activations), and the
// compute space's activations drop by the same bytes while the entries are out.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dtensor/comm/failed_ranks.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/core/scratch_file.hpp"
#include "dtensor/core/tensor.hpp"

namespace dtensor::nn {

/// Where offloaded activations go.
enum class OffloadTier { host, disk };

struct ActivationOffloadOptions {
  OffloadTier tier = OffloadTier::disk;
  std::string dir{};  // disk: an existing, writable directory on local disk
};

/// What the offloader did, over its whole life.
struct ActivationOffloadStats {
  std::size_t bytes_written = 0, bytes_read = 0;  // to and from the tier
  std::size_t entries = 0;                        // block states offloaded
  std::size_t kept = 0;                           // of them, used again from memory (never read back)
  double io_seconds = 0;    // the reads' and writes' own time (on their threads)
  double wait_seconds = 0;  // the time the compute waited for them: I/O it did not hide
  /// The share of the I/O time hidden behind the compute (1: all of it).
  double hidden() const { return io_seconds > 0 ? std::max(0.0, 1 - wait_seconds / io_seconds) : 1; }
};

namespace detail {
template <class X>
struct is_tensor : std::false_type {};
template <Element T, std::size_t R, MemorySpace S>
struct is_tensor<Tensor<T, R, S>> : std::true_type {};
template <class X>
struct is_std_container : std::false_type {};
template <class U, class A>
struct is_std_container<std::vector<U, A>> : std::true_type {};
template <class X>
struct is_optional_state : std::false_type {};
template <class U>
struct is_optional_state<std::optional<U>> : std::true_type {};
template <class X>
struct is_variant_state : std::false_type {};
template <class... U>
struct is_variant_state<std::variant<U...>> : std::true_type {};
template <class X>
struct is_tuple_state : std::false_type {};
template <class... U>
struct is_tuple_state<std::tuple<U...>> : std::true_type {};
template <class A, class B>
struct is_tuple_state<std::pair<A, B>> : std::true_type {};
}  // namespace detail

/// Calls f(t) for every Tensor in a saved state, in a fixed order: the state's tensors()
/// (a tuple of references to its members), a DTensor's local piece, the engaged alternative of
/// an optional or a variant, the elements of a vector, a tuple's members. Anything else (flags,
/// counts, index lists) holds no tensor and is left alone.
template <class X, class F>
void for_each_saved_tensor(X& x, F&& f) {
  using D = std::remove_cvref_t<X>;
  if constexpr (detail::is_tensor<D>::value) f(x);
  else if constexpr (requires { x.local(); x.mesh(); }) for_each_saved_tensor(x.local(), f);
  else if constexpr (requires { x.tensors(); })
    std::apply([&](auto&... m) { (for_each_saved_tensor(m, f), ...); }, x.tensors());
  else if constexpr (detail::is_optional_state<D>::value) {
    if (x) for_each_saved_tensor(*x, f);
  } else if constexpr (detail::is_variant_state<D>::value)
    std::visit([&](auto& v) { for_each_saved_tensor(v, f); }, x);
  else if constexpr (detail::is_tuple_state<D>::value)
    std::apply([&](auto&... m) { (for_each_saved_tensor(m, f), ...); }, x);
  else if constexpr (detail::is_std_container<D>::value) {
    if constexpr (!std::is_arithmetic_v<typename D::value_type>)
      for (auto& e : x) for_each_saved_tensor(e, f);
  }
}

namespace detail {
/// One evicted tensor: its extents, and its bytes in host memory while they are written or
/// after they were read (empty between: they are only on the tier then).
struct OffloadHeldBase {
  virtual ~OffloadHeldBase() = default;
  virtual void* host_data() = 0;
  virtual void allocate() = 0;  // the host tensor the read fills
  virtual void release() = 0;
};
template <Element T, std::size_t R, MemorySpace Space>
struct OffloadHeld final : OffloadHeldBase {
  Shape<R> shape;
  Tensor<T, R, host_space> host;
  void* host_data() override { return host.data(); }
  void allocate() override {
    if constexpr (!std::is_same_v<Space, meta_space>) host = Tensor<T, R, host_space>::uninitialized(shape);
  }
  void release() override { host = {}; }
};

/// What an offload does to one tensor of a saved state, through one table per tensor type: the
/// walk over a state (a deep template recursion) is instantiated once per state with one
/// visitor (saved_tensors), and ActivationOffload's put and get work on the list it makes,
/// not as templates instantiated per state and tensor type.
struct SavedTensorOps {
  bool moves;                    // false on the meta space: nothing to read or write
  bool (*owned)(const void* t);  // not a view
  std::size_t (*numel)(const void* t);
  std::size_t (*bytes)(const void* t);
  std::unique_ptr<OffloadHeldBase> (*take)(void* t);   // the tensor moved out (its slot left empty)
  void (*restore)(void* slot, OffloadHeldBase& held);  // and back
};
template <class TT>
struct SavedTensorOpsOf {
  using T = typename TT::value_type;
  using Space = typename TT::space;
  static constexpr std::size_t R = TT::rank;
  using Held = OffloadHeld<T, R, Space>;
  static std::unique_ptr<OffloadHeldBase> take(void* p) {
    auto& t = *static_cast<TT*>(p);
    auto h = std::make_unique<Held>();
    h->shape = t.shape();
    if constexpr (std::is_same_v<Space, host_space>) h->host = std::move(t);
    else if constexpr (!std::is_same_v<Space, meta_space>) h->host = to_space<host_space>(t);
    t = TT();  // the compute memory goes (host: already moved into the entry, freed once written)
    return h;
  }
  static void restore(void* p, OffloadHeldBase& held) {
    auto& slot = *static_cast<TT*>(p);
    auto& h = static_cast<Held&>(held);
    if constexpr (std::is_same_v<Space, host_space>) slot = std::move(h.host);
    else if constexpr (std::is_same_v<Space, meta_space>) {
      MemoryTagScope tag(MemoryTag::activations);
      slot = TT::uninitialized(h.shape);
    } else {
      MemoryTagScope tag(MemoryTag::activations);
      slot = to_space<Space>(h.host);
      h.host = {};
    }
  }
  static constexpr SavedTensorOps table{!std::is_same_v<Space, meta_space>,
                                        [](const void* t) { return !static_cast<const TT*>(t)->is_view(); },
                                        [](const void* t) { return std::size_t(static_cast<const TT*>(t)->numel()); },
                                        [](const void* t) { return std::size_t(static_cast<const TT*>(t)->bytes()); },
                                        &take,
                                        &restore};
};
/// A tensor of a saved state and its type's operations (the table's address names the type).
struct SavedTensorRef {
  void* tensor;
  const SavedTensorOps* ops;
};
struct CollectSavedTensors {
  std::vector<SavedTensorRef>* out;
  template <class TT>
  void operator()(TT& t) const {
    out->push_back({&t, &SavedTensorOpsOf<TT>::table});
  }
};
}  // namespace detail

/// Every Tensor of a saved state, in for_each_saved_tensor's order, with its type's operations.
template <class X>
std::vector<detail::SavedTensorRef> saved_tensors(X& x) {
  std::vector<detail::SavedTensorRef> out;
  for_each_saved_tensor(x, detail::CollectSavedTensors{&out});
  return out;
}

/// The bytes of the owned tensors in a saved state (what an offload moves).
template <class X>
std::size_t saved_bytes(X& x) {
  std::size_t n = 0;
  for (const auto& r : saved_tensors(x))
    if (r.ops->owned(r.tensor)) n += r.ops->bytes(r.tensor);
  return n;
}

class ActivationOffload {
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  using HeldBase = detail::OffloadHeldBase;

  /// Where an entry's bytes are on the tier.
  struct Region {
    std::size_t at = 0, bytes = 0;
    std::byte* host = nullptr;  // the host tier's block
  };

  struct Piece {
    std::unique_ptr<HeldBase> held;
    const detail::SavedTensorOps* type = nullptr;  // the tensor's type
    Region region;
    bool moves = true;  // false on the meta space: nothing to read or write
  };

  /// The tier: the scratch file, or host blocks. Touched on the rank's thread only, except
  /// write()/read(), which the background threads call on regions they were given.
  struct Store {
    OffloadTier tier;
    std::unique_ptr<dtensor::detail::ScratchFile> file;
    std::multimap<std::size_t, std::size_t> free;  // size -> offset: the regions of entries come back
    std::size_t end = 0;
    int rank = 0;
    ActivationOffloadStats stats;

    Region allocate(std::size_t bytes, bool moves) {
      Region r{0, bytes, nullptr};
      if (tier == OffloadTier::disk) {
        dtensor::detail::ledger_record<disk_ledger>(MemoryTag::activations, std::int64_t(bytes));
        if (!moves) return r;
        if (auto it = free.find(bytes); it != free.end()) {
          r.at = it->second;
          free.erase(it);
          return r;
        }
        if (auto error = file->reserve(end + bytes, "saved activations"); !error.empty()) {
          dtensor::detail::ledger_record<disk_ledger>(MemoryTag::activations, -std::int64_t(bytes));
          throw Error("nn::ActivationOffload", error, rank);
        }
        r.at = end;
        end += bytes;
      } else {
        dtensor::detail::ledger_record<host_space>(MemoryTag::activations, std::int64_t(bytes));
        if (moves) r.host = new std::byte[bytes];
      }
      return r;
    }
    void release(const Region& r, bool moves) {
      if (tier == OffloadTier::disk) {
        dtensor::detail::ledger_record<disk_ledger>(MemoryTag::activations, -std::int64_t(r.bytes));
        if (moves) free.emplace(r.bytes, r.at);
      } else {
        dtensor::detail::ledger_record<host_space>(MemoryTag::activations, -std::int64_t(r.bytes));
        delete[] r.host;
      }
    }
    void write(const Region& r, const void* src) const {
      if (r.host) std::memcpy(r.host, src, r.bytes);
      else file->write(src, r.bytes, r.at);
    }
    void read(const Region& r, void* dst) const {
      if (r.host) std::memcpy(dst, r.host, r.bytes);
      else file->read(dst, r.bytes, r.at);
    }
  };

 public:
  /// One block's saved state of one micro-batch, while it is out.
  class Entry {
   public:
    explicit Entry(std::shared_ptr<Store> store) : store_(std::move(store)) {}
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    /// A saved state dropped without its backward (an evaluation's forward, an error): the I/O
    /// finishes and the tier's regions come back.
    ~Entry() {
      for (auto* f : {&write_, &read_})
        if (f->valid()) f->wait();
      if (!returned_)
        for (auto& p : pieces_) store_->release(p.region, p.moves);
    }

   private:
    friend class ActivationOffload;
    std::shared_ptr<Store> store_;
    std::vector<Piece> pieces_;   // the tensors taken, in the walk's order
    std::vector<char> visits_;    // per tensor of the walk: taken (1) or left (0)
    std::future<double> write_, read_;
    bool in_memory_ = true;   // the held tensors still hold the bytes (the write not yet reaped)
    bool coming_back_ = false;  // prefetch() ran: read under way, or kept in memory
    bool returned_ = false;     // the tensors went back to the saved state
  };
  using Ticket = std::shared_ptr<Entry>;

  /// Collective over `comm` (null: this rank alone) for the disk tier: every rank creates its
  /// file, and all throw when any could not (naming the directory and the failed ranks).
  /// (A template only so that the work it points ops_ at is compiled where an offloader is made.)
  template <class Options = ActivationOffloadOptions>
    requires std::same_as<Options, ActivationOffloadOptions>
  explicit ActivationOffload(Options o, Communicator* comm = nullptr)
      : opts_(std::move(o)), store_(std::make_shared<Store>()), ops_(&ops_of<Options>) {
    store_->tier = opts_.tier;
    store_->rank = comm ? comm->rank() : 0;
    if (opts_.tier != OffloadTier::disk) return;
    std::string error = opts_.dir.empty() ? std::string("no directory given for the disk tier") : std::string();
    if (error.empty()) {
      store_->file = std::make_unique<dtensor::detail::ScratchFile>(opts_.dir, "activations", store_->rank,
                                                                    "nn::ActivationOffload");
      error = store_->file->error();
    }
    const std::string ranks = dtensor::detail::failed_ranks(comm, !error.empty());
    if (ranks.empty()) return;
    if (store_->file) store_->file->remove();
    throw Error("nn::ActivationOffload",
                dtensor::detail::cat("offload directory \"", opts_.dir, "\": ",
                                     error.empty() ? std::string("this rank's is usable, but") : error + ";",
                                     " failed on rank(s) ", ranks, " of ", comm ? comm->size() : 1,
                                     " (activation offload to disk)"),
                store_->rank);
  }
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;
  ~ActivationOffload() {
    for (auto& t : writing_) reap(*t, false);
  }

  /// After a block's forward: takes the tensors out of `saved` and starts writing them; frees
  /// the memory of the entries whose write finished before (waiting for all but this one).
  template <class Saved>
  Ticket put(Saved& saved) {
    return put_tensors(saved_tensors(saved));
  }
  /// put() on the list of a state's tensors (saved_tensors).
  Ticket put_tensors(const std::vector<detail::SavedTensorRef>& tensors) { return (this->*ops_->put)(tensors); }
  /// Starts bringing an entry back (the one the backward needs next); no-op if already under way.
  void prefetch(const Ticket& t) { (this->*ops_->prefetch)(t); }

  /// Before a block's backward: waits for the entry and moves its tensors back into `saved`
  /// (the same state put() emptied); the tier's regions come back.
  template <class Saved>
  void get(Ticket& t, Saved& saved) {
    get_tensors(t, saved_tensors(saved));
  }
  /// get() on the list of a state's tensors.
  void get_tensors(Ticket& t, const std::vector<detail::SavedTensorRef>& tensors) { (this->*ops_->get)(t, tensors); }

  const ActivationOffloadStats& stats() const noexcept { return store_->stats; }
  const ActivationOffloadOptions& options() const noexcept { return opts_; }
  /// The scratch file (disk tier), "" otherwise.
  std::string file() const { return store_->file ? store_->file->path() : std::string(); }

 private:
  /// The offloader's work (the entries, the threads and futures, the file I/O: 16 kB of a GPT
  /// program's object) as templates, reached through the table the constructor sets: compiled
  /// only where an ActivationOffload is constructed, not in every program that builds a model.
  /// (Virtual functions were not enough: a model's calls through the vtable odr-used them, and
  /// GCC's speculative devirtualization compiled their bodies into the model's forward and
  /// backward: 11 MiB of a user FSDP x TP program's compile memory, docs/benchmarks.md.)
  struct Ops {
    Ticket (ActivationOffload::*put)(const std::vector<detail::SavedTensorRef>&);
    void (ActivationOffload::*prefetch)(const Ticket&);
    void (ActivationOffload::*get)(Ticket&, const std::vector<detail::SavedTensorRef>&);
    std::future<double> (*start_io)(Store*, Entry*, bool);
  };

  template <class>
  Ticket put_impl(const std::vector<detail::SavedTensorRef>& tensors) {
    auto e = std::make_shared<Entry>(store_);
    for (const auto& r : tensors) {
      const bool moves_out = r.ops->owned(r.tensor) && r.ops->numel(r.tensor) != 0;  // views and empty tensors stay
      e->visits_.push_back(moves_out);
      if (!moves_out) continue;
      const std::size_t bytes = r.ops->bytes(r.tensor);
      Piece p;
      p.moves = r.ops->moves;
      auto h = r.ops->take(r.tensor);
      p.type = r.ops;
      p.region = store_->allocate(bytes, p.moves);
      p.held = std::move(h);
      e->pieces_.push_back(std::move(p));
    }
    ++store_->stats.entries;
    e->write_ = ops_->start_io(store_.get(), e.get(), /*write=*/true);
    for (auto& p : e->pieces_) store_->stats.bytes_written += p.moves ? p.region.bytes : 0;
    // Write-behind, bounded: the entries before this one are written now (their writes had
    // this block's forward to run in) and their memory goes.
    for (auto& old : writing_) reap(*old, false);
    writing_.clear();
    writing_.push_back(e);
    return e;
  }

  template <class>
  void prefetch_impl(const Ticket& t) {
    if (!t || t->coming_back_) return;
    auto& e = *t;
    e.coming_back_ = true;
    if (e.in_memory_) {  // its write was not reaped: keep the bytes it still holds, read nothing
      reap(e, true);
      std::erase(writing_, t);
      ++store_->stats.kept;
      return;
    }
    {
      MemoryTagScope tag(MemoryTag::activations);
      for (auto& p : e.pieces_) p.held->allocate();  // on this thread: the ledger counts them here
    }
    e.read_ = ops_->start_io(store_.get(), &e, /*write=*/false);
    for (auto& p : e.pieces_) store_->stats.bytes_read += p.moves ? p.region.bytes : 0;
  }

  template <class X>
  void get_impl(Ticket& t, const std::vector<detail::SavedTensorRef>& tensors) {
    prefetch_impl<X>(t);
    auto& e = *t;
    if (e.read_.valid()) {
      const auto t0 = Clock::now();
      store_->stats.io_seconds += e.read_.get();
      store_->stats.wait_seconds += seconds(t0);
    }
    std::size_t i = 0, visit = 0;
    bool same = true;
    for (const auto& r : tensors) {
      const bool moved = visit < e.visits_.size() && e.visits_[visit];
      ++visit;
      if (!moved) continue;  // stayed (a view, an empty tensor)
      if (!same || i == e.pieces_.size() || e.pieces_[i].type != r.ops || r.ops->numel(r.tensor) != 0) {
        same = false;
        continue;
      }
      r.ops->restore(r.tensor, *e.pieces_[i].held);
      ++i;
    }
    if (!same || i != e.pieces_.size() || visit != e.visits_.size())
      throw Error("nn::ActivationOffload::get",
                  dtensor::detail::cat("the saved state is not the one put() emptied (", visit, " tensors, ", i,
                                       " of them restored; put() took ", e.pieces_.size(), " of ", e.visits_.size(), ")"));
    for (auto& p : e.pieces_) store_->release(p.region, p.moves);
    e.returned_ = true;
    t.reset();
  }

  /// Starts writing an entry's pieces to the tier (or reading them back) on a background thread;
  /// the future holds the seconds the I/O took (std::async and the thread and future machinery
  /// under it: 30 MiB of a user FSDP x TP program's compile memory, docs/benchmarks.md).
  template <class>
  static std::future<double> start_io(Store* store, Entry* ent, bool write) {
    return std::async(std::launch::async, [store, ent, write] {
      const auto t0 = Clock::now();
      for (auto& p : ent->pieces_) {
        if (!p.moves) continue;
        if (write) store->write(p.region, p.held->host_data());
        else store->read(p.region, p.held->host_data());
      }
      return seconds(t0);
    });
  }

  /// Waits for an entry's write; frees the bytes it held unless `keep` (the backward wants them now).
  void reap(Entry& e, bool keep) {
    if (e.write_.valid()) {
      const auto t0 = Clock::now();
      store_->stats.io_seconds += e.write_.get();
      store_->stats.wait_seconds += seconds(t0);
    }
    if (!keep)
      for (auto& p : e.pieces_) p.held->release();
    e.in_memory_ = false;
  }

  template <class X>
  static constexpr Ops ops_of{&ActivationOffload::put_impl<X>, &ActivationOffload::prefetch_impl<X>,
                              &ActivationOffload::get_impl<X>, &start_io<X>};

  ActivationOffloadOptions opts_;
  std::shared_ptr<Store> store_;
  const Ops* ops_;
  std::vector<Ticket> writing_;  // entries whose write has not been reaped (the newest one)
};

}  // namespace dtensor::nn
