// dtensor/comm/communicator.hpp — the process-group interface every backend implements.
//
//   CommPtr world = ...;                               // threads::run, mpi::world(), nccl
//   world->all_reduce(std::span<float>(x), ReduceOp::sum);      // blocking
//   Work w = world->all_gather_async(send, recv);      // asynchronous; w.wait() later
//   CommPtr row = world->split(color, key);            // a sub-group (collective)
//   CommPtr known = world->split(color, key, n);       // ... of n ranks, this one at key
//
// The public functions here are the only way into a backend: they check the arguments (and
// throw a dtensor::Error naming the op, the sizes and the rank), record the call in the
// enclosing CommLog, optionally check that every rank issued the same collective (see
// set_check_collectives), and then call the backend's protected do_* function. Backends see
// untyped buffers, element counts and a DType. Inside a trace scope each call is also timed,
// from issue to completion, through the observer hook comm owns (comm/observer.hpp; trace/
// installs one: trace/collective_span.hpp).
//
// Buffer conventions (counts are in elements of T):
//   all_gather      send: n            recv: n * size()   (rank r's block at r * n)
//   reduce_scatter  send: n * size()   recv: n            (this rank gets block rank())
//   all_reduce      send: n            recv: n            (send and recv may be the same)
//   all_to_all      send: n * size()   recv: n * size()   (block j goes to / came from rank j)
//   all_to_all_v    per-peer counts and displacements, in elements
//   all_to_all with StridedBlocks   send: blocks where StridedBlocks says   recv: as all_to_all
//   broadcast       buf: n on every rank, root's contents win
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/config.hpp"
#include "dtensor/comm/observer.hpp"
#include "dtensor/comm/work.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/placement/layout.hpp"

namespace dtensor {

class Communicator;
using CommPtr = std::shared_ptr<Communicator>;

namespace detail {
/// What ranks compare when set_check_collectives(true) is on. Before a collective: the op, the
/// element type and count (hence the bytes), the reduction and the root. Before an operation
/// of the layers above (check_agreement): for a redistribution, its element type, global
/// extents, mesh shape and layouts as numbers (of_redistribution: packed into `text`, hashed
/// word by word, formatted only when a comparison fails); for anything else, a hash of its
/// description, whose first characters show in the message. One record type for all, of one
/// size, so that a rank in one check and a rank in the other still exchange equal byte counts
/// (what MPI needs) and see that they differ.
struct Fingerprint {
  static constexpr std::uint8_t agreement = 0xff;       // `kind` of a check_agreement record (text)
  static constexpr std::uint8_t redistribution = 0xfe;  // `kind` of a redistribution's (numbers)

  std::uint8_t kind = 0;
  std::uint8_t dtype = 0;
  std::uint8_t op = 0;
  std::uint8_t pad = 0;
  std::int32_t root = -1;
  std::uint64_t count = 0;
  std::uint64_t hash = 0;
  std::int32_t world_rank = -1;  // who sent it, for the message only
  std::uint32_t length = 0;
  char text[120] = {};

  static Fingerprint of_collective(CollectiveKind k, DType t, ReduceOp op, std::size_t count, int root) {
    Fingerprint f;
    f.kind = std::uint8_t(k);
    f.dtype = std::uint8_t(t);
    f.op = std::uint8_t(op);
    f.root = root;
    f.count = count;
    return f;
  }
  static Fingerprint of_agreement(std::string_view what) {
    Fingerprint f;
    f.kind = agreement;
    f.hash = 14695981039346656037ull;  // FNV-1a over the whole description
    for (char ch : what) f.hash = (f.hash ^ std::uint8_t(ch)) * 1099511628211ull;
    f.length = std::uint32_t(std::min(what.size(), sizeof f.text));
    std::memcpy(f.text, what.data(), f.length);
    return f;
  }
  /// A redistribution's fingerprint, built from numbers alone: the always-on check makes one
  /// per redistribution that communicates, so no text is formatted here (formatting the
  /// description was most of the check's own cost, docs/errors.md). `text` holds the element
  /// type, rank R, mesh rank N, the R extents (int64), the N mesh extents (int32), then per mesh
  /// dimension of the source and then the target layout: placement kind, tensor dimension,
  /// reduction, split priority (a byte each). The hash covers all of it, fitting or not.
  template <std::size_t R, std::size_t N>
  static Fingerprint of_redistribution(DType t, const Shape<R>& global, const std::array<int, N>& mesh,
                                       const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
    std::array<std::uint8_t, redistribution_bytes(R, N)> b{};
    b[0] = std::uint8_t(t);
    b[1] = std::uint8_t(R);
    b[2] = std::uint8_t(N);
    std::size_t at = 3;
    for (Extent e : global) at = put(b.data(), at, e);
    for (int m : mesh) at = put(b.data(), at, std::int32_t(m));
    for (const LayoutDesc<N>* l : {&from, &to})
      for (std::size_t i = 0; i < N; ++i) {
        const PlacementDesc& p = l->placements[i];
        b[at++] = std::uint8_t(p.kind);
        b[at++] = std::uint8_t(std::int8_t(p.dim));
        b[at++] = std::uint8_t(p.op);
        b[at++] = std::uint8_t(std::int8_t(l->priority[i]));
      }
    Fingerprint f;
    f.kind = redistribution;
    f.dtype = std::uint8_t(t);
    f.count = R;
    f.hash = 14695981039346656037ull;
    for (std::size_t i = 0; i < b.size(); i += 8) {  // eight bytes a step
      std::uint64_t w = 0;
      std::memcpy(&w, b.data() + i, std::min<std::size_t>(8, b.size() - i));
      f.hash = (f.hash ^ w) * 1099511628211ull + 0x9e3779b97f4a7c15ull;
    }
    f.length = std::uint32_t(b.size());
    std::memcpy(f.text, b.data(), std::min(b.size(), sizeof f.text));
    return f;
  }
  static constexpr std::size_t redistribution_bytes(std::size_t r, std::size_t n) { return 3 + 8 * r + 4 * n + 8 * n; }
  template <class V>
  static std::size_t put(std::uint8_t* b, std::size_t at, V v) {
    std::memcpy(b + at, &v, sizeof v);
    return at + sizeof v;
  }

  bool same_call(const Fingerprint& o) const {
    return kind == o.kind && dtype == o.dtype && op == o.op && root == o.root && count == o.count && hash == o.hash;
  }
  /// "all_reduce(16 x float32, sum)", or the agreement's description.
  std::string describe() const {
    if (kind == agreement) return std::string(text, length) + (length == sizeof text ? "..." : "");
    if (kind == redistribution) return describe_redistribution();
    std::string s = cat(name_of(CollectiveKind(kind)), "(", count, " x ", name_of(DType(dtype)));
    if (CollectiveKind(kind) == CollectiveKind::all_reduce || CollectiveKind(kind) == CollectiveKind::reduce_scatter)
      s += cat(", ", name_of(ReduceOp(op)));
    if (root >= 0) s += cat(", root ", root);
    return s + ")";
  }
  /// "float32 [4, 4] on mesh [2, 2]: (S(0), R) -> (R, R)" from of_redistribution's numbers.
  std::string describe_redistribution() const {
    const auto* b = reinterpret_cast<const std::uint8_t*>(text);
    const std::size_t r = b[1], n = b[2];
    if (length != redistribution_bytes(r, n) || length > sizeof text)
      return cat("a redistribution of ", name_of(DType(dtype)), " (", length,
                 " bytes of description, more than a fingerprint holds; compared in full)");
    std::size_t at = 3;
    std::string s = cat(name_of(DType(b[0])), " [");
    for (std::size_t i = 0; i < r; ++i, at += 8) {
      Extent e;
      std::memcpy(&e, b + at, 8);
      s += cat(i ? ", " : "", e);
    }
    s += "] on mesh [";
    for (std::size_t i = 0; i < n; ++i, at += 4) {
      std::int32_t m;
      std::memcpy(&m, b + at, 4);
      s += cat(i ? ", " : "", m);
    }
    s += "]: ";
    std::vector<PlacementDesc> p(n);
    std::vector<int> priority(n);
    for (int side = 0; side < 2; ++side) {
      for (std::size_t i = 0; i < n; ++i, at += 4) {
        p[i] = {PlacementKind(b[at]), int(std::int8_t(b[at + 1])), ReduceOp(b[at + 2])};
        priority[i] = int(std::int8_t(b[at + 3]));
      }
      s += layout_string(p, priority) + (side == 0 ? " -> " : "");
    }
    return s;
  }
  /// Folds this record into a running hash of a communicator's calls (the always-on check).
  std::uint64_t folded_into(std::uint64_t h) const {
    for (std::uint64_t v : {std::uint64_t(kind) | std::uint64_t(dtype) << 8 | std::uint64_t(op) << 16 |
                                std::uint64_t(std::uint32_t(root)) << 32,
                            std::uint64_t(count), hash})
      h = (h ^ v) * 1099511628211ull + 0x9e3779b97f4a7c15ull;
    return h;
  }
};

/// The always-on form of the collective check (Communicator::set_verify_every). Each rank folds
/// every collective's fingerprint (and every check_agreement's: a redistribution's layouts and
/// extents) into a running hash and keeps the last `verify_window` fingerprints; every
/// verify_every-th call, and at every barrier, the ranks all-gather that record and compare. The
/// full check costs one small all-gather per collective (about 10% of the README's main job in
/// Release, docs/errors.md); this costs one per 16 and a few nanoseconds per call, and still
/// turns every disagreement about an op, an element type, a count, a root, a layout or a global
/// extent into an Error on every rank, naming the first call that differed, within 16 calls —
/// after the data of those calls has moved, where the full check stops before.
inline constexpr int verify_window = 16;
struct VerifyRecord {
  std::uint64_t calls = 0;  // fingerprints folded so far
  std::uint64_t hash = 14695981039346656037ull;
  std::int32_t world_rank = -1;
  std::uint32_t pad = 0;
  Fingerprint last[verify_window];  // call n at last[n % verify_window]
};

/// The always-on check's verdict on every rank's record (`all`, in rank order; `mine` this
/// rank's): empty when all made the same calls, else `heading` and a table naming the first call
/// that differed and what each rank called there. The previous comparison passed and at most
/// verify_window calls have been folded since, so that call is still in every window.
inline std::string verify_mismatch(const VerifyRecord* const* all, int n, const VerifyRecord& mine,
                                   std::string_view label, std::string heading) {
  bool same = true;
  for (int r = 0; r < n; ++r) same = same && all[r]->calls == mine.calls && all[r]->hash == all[0]->hash;
  if (same) return {};
  std::uint64_t first = mine.calls;
  const std::uint64_t oldest = mine.calls > std::uint64_t(verify_window) ? mine.calls - verify_window : 0;
  for (std::uint64_t c = oldest; c < mine.calls && first == mine.calls; ++c)
    for (int r = 0; r < n; ++r)
      if (!all[r]->last[c % verify_window].same_call(all[0]->last[c % verify_window])) first = c;
  std::string table = std::move(heading);
  if (first == mine.calls) {
    table += "\n  different numbers of calls or an earlier difference:";
    for (int r = 0; r < n; ++r) table += cat(" rank ", r, ": ", all[r]->calls, " calls;");
  } else {
    table += cat("\n  call #", first + 1, " of group '", label, "':");
    for (int r = 0; r < n; ++r) {
      const auto& f = all[r]->last[first % verify_window];
      table += cat("\n  rank ", r);
      if (all[r]->world_rank != r) table += cat(" (world rank ", all[r]->world_rank, ")");
      table += ": " + f.describe();
    }
  }
  return table;
}

/// The operation of the layers above that the calling thread is inside (a redistribution: its
/// element type, global extents, mesh and layouts; Fingerprint::of_redistribution), or null.
/// With agreement before data (Communicator::agrees_before_data, on by default in every build)
/// every collective issued inside it carries this fingerprint, and the ranks of the collective's
/// group compare it, with the collective's own arguments, before any rank reads a received
/// byte. Per thread: a rank of the threads backend is a thread, an MPI rank a process.
inline thread_local const Fingerprint* call_context = nullptr;
/// Sets call_context for a scope (nested scopes restore the outer one).
class CallContextScope {
 public:
  explicit CallContextScope(const Fingerprint* f) noexcept : saved_(call_context) { call_context = f; }
  ~CallContextScope() { call_context = saved_; }
  CallContextScope(const CallContextScope&) = delete;
  CallContextScope& operator=(const CallContextScope&) = delete;

 private:
  const Fingerprint* saved_;
};
/// What a backend without a shared rendezvous exchanges before each collective (agreement
/// before data): the call's fingerprint and its context, described only when ranks differ.
struct CallRecord {
  Fingerprint call;
  Fingerprint context;     // kind 0 and hash 0: no context
  std::uint64_t then = 0;  // 1: the always-on check's all-gather follows this call on this rank
  bool has_context() const noexcept { return context.kind != 0 || context.hash != 0; }
  std::uint64_t hash() const noexcept {
    return context.folded_into(call.folded_into(14695981039346656037ull)) ^ (then * 0x9e3779b97f4a7c15ull);
  }
  std::string describe() const {
    std::string s = has_context() ? call.describe() + " in " + context.describe() : call.describe();
    if (then) s += ", then the always-on check's comparison (DTENSOR_VERIFY_EVERY / set_verify_every)";
    return s;
  }
};
}  // namespace detail

/// Where the send blocks of an all-to-all lie when they are not back to back: block j (the one
/// for rank j) is `rows` runs of `run` contiguous elements, `row_stride` elements apart, and
/// starts at element j * `block_stride`. Shard(d) -> Shard(e) of a row-major piece sends rank
/// j slice j of dimension e: a run is that slice times the extents after e, and there is one
/// row per index of the dimensions before e. A backend that can describe such blocks (MPI
/// derived datatypes, the threads backend's copies) sends them without a packing copy.
struct StridedBlocks {
  std::size_t rows = 0, run = 0, row_stride = 0, block_stride = 0;

  std::size_t block_elements() const noexcept { return rows * run; }
  /// Elements of the send buffer that `n` blocks span (from its start to the last element read).
  std::size_t extent(int n) const noexcept {
    return block_elements() == 0 ? 0 : std::size_t(n - 1) * block_stride + (rows - 1) * row_stride + run;
  }
};

namespace detail {
/// Block `j` of `send` (StridedBlocks `b`, elements of `element_bytes`) written contiguously at
/// `dst`, one copy(dst, src, bytes) per run: the packing fallback and the threads backend's
/// direct reads share it.
template <class Copy>
void copy_strided_block(void* dst, const void* send, const StridedBlocks& b, int j, std::size_t element_bytes,
                        Copy&& copy) {
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(send) + std::size_t(j) * b.block_stride * element_bytes;
  const std::size_t run_bytes = b.run * element_bytes;
  for (std::size_t row = 0; row < b.rows; ++row, out += run_bytes)
    copy(out, in + row * b.row_stride * element_bytes, run_bytes);
}
}  // namespace detail

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// This rank in the communicator that all others were split from (the "world").
  int world_rank() const noexcept { return world_rank_; }
  virtual std::string_view backend() const = 0;

  /// A name for logs and errors: the mesh sets it to the mesh dimension ("tp", "dp*tp").
  const std::string& label() const noexcept { return label_; }
  void set_label(std::string l) { label_ = std::move(l); }

  /// How long a rank waits for the others before the collective fails.
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// At least 1 ms and at most max_timeout (config.hpp); anything else is an Error.
  void set_timeout(std::chrono::milliseconds t) { timeout_ = detail::checked_timeout(t, named("set_timeout")); }

  /// With this on, ranks exchange a fingerprint (op, dtype, count, reduction, root) before
  /// each collective and every rank throws, listing what each called, if they differ. Costs
  /// one small all-gather per collective (bench/bench_check_collectives.cpp). On by default in
  /// debug builds and in the test suite (config.hpp).
  bool check_collectives() const noexcept { return check_; }
  void set_check_collectives(bool on) noexcept { check_ = on; }

  /// The always-on form of the check, for when check_collectives() is off (every build type):
  /// every `n` calls (collectives and check_agreement) and at every barrier, ranks compare a
  /// running hash of their calls, and all throw, naming the first call that differed, if any
  /// did (detail::VerifyRecord). 1 .. 16, or 0 to turn it off; 16 by default (CommDefaults).
  /// Like every setting of a group, all its ranks must use the same.
  int verify_every() const noexcept { return verify_every_; }
  void set_verify_every(int n) {
    if (n < 0 || n > detail::verify_window)
      fail("set_verify_every", detail::cat(n, " is not in 0 .. ", detail::verify_window, " (0: off)"));
    verify_every_ = n;
  }

  /// Agreement before data (on by default in every build type; DTENSOR_AGREE_BEFORE_DATA=0 or
  /// set_agree_before_data(false) turns it off): the ranks of a collective compare what each
  /// asked (op, element type, count, reduction, root, and the redistribution it is part of:
  /// detail::call_context) before any rank uses a received byte, and all throw, naming the
  /// call, the ranks and what each asked, if they differ. The threads backend compares in the
  /// rendezvous every collective makes anyway; MPI runs one fused 16-byte all-reduce before the
  /// collective (and the full exchange of what each asked only when they differ); NCCL does not
  /// (exchanges_agreement).
  bool agrees_before_data() const noexcept { return agree_; }
  void set_agree_before_data(bool on) noexcept { agree_ = on; }

  /// With the check on, throws on every rank unless all ranks of this group passed the same
  /// `what` — the layers above describe an operation that is collective over the group (a
  /// redistribution: its layouts, global extents and element type). Does nothing with the
  /// check off. Not recorded in the CommLog: it is a check, not part of the operation.
  void check_agreement(std::string_view op, std::string_view what) {
    if (check_) check_fingerprints(detail::Fingerprint::of_agreement(what), op, "ranks disagree (collective check):");
    else if (verifying()) fold(detail::Fingerprint::of_agreement(what), op);
  }
  /// Whether check_agreement looks at its description (callers skip building it otherwise).
  bool checks_agreement() const noexcept { return check_ || verify_every_ > 0; }
  /// check_agreement with a fingerprint built from numbers (Fingerprint::of_redistribution):
  /// nothing is formatted unless the ranks differ.
  void check_agreement(std::string_view op, const detail::Fingerprint& f) {
    if (check_) check_fingerprints(f, op, "ranks disagree (collective check):");
    else if (verifying()) fold(f, op);
  }

  // ---------------------------------------------------------------- group management
  /// Ranks with the same color form a new communicator, ordered by key (then by rank).
  /// Collective over this communicator. A negative color returns nullptr for that rank.
  CommPtr split(int color, int key) {
    const auto span = record(CollectiveKind::split, 0, DType::uint8, ReduceOp::sum, -1);
    auto c = do_split(color, key);
    detail::collective_finished(span);
    if (c) {
      c->timeout_ = timeout_;
      c->check_ = check_;
      c->verify_every_ = verify_every_;
      c->agree_ = agree_;
    }
    return c;
  }
  /// split(color, key) where the caller also knows the group it will get: `group_size` ranks,
  /// this one at index `key` (a mesh computes both from its shape and this rank's coordinate).
  /// Backends with peers run the ordinary split and check that the group is the expected one;
  /// the sim backend (comm/sim.hpp), which has no peers to meet, makes it from these numbers
  /// alone. Recorded in the CommLog as split is.
  CommPtr split(int color, int key, int group_size) {
    if (color < 0 || group_size < 1 || key < 0 || key >= group_size)
      fail("split", detail::cat("color ", color, ", key ", key, " in a group of ", group_size,
                                ": a known group needs color >= 0 and 0 <= key < group size"));
    record(CollectiveKind::split, 0, DType::uint8, ReduceOp::sum, -1);
    auto c = do_split_known(color, key, group_size);
    if (!c || c->size() != group_size || c->rank() != key)
      fail("split", detail::cat("color ", color, ", key ", key, ": expected a group of ", group_size,
                                " ranks with this rank at ", key, ", got ",
                                c ? detail::cat(c->size(), " ranks with this rank at ", c->rank()) : "no group",
                                ": the ranks disagree about the mesh (its shape, or which dimensions a group spans); "
                                "were they given different settings? (agree on them first: require_same_settings, "
                                "distributed/settings_agreement.hpp)"));
    c->timeout_ = timeout_;
    c->check_ = check_;
    c->verify_every_ = verify_every_;
    c->agree_ = agree_;
    return c;
  }

  // ---------------------------------------------------------------- collectives
  // Asynchronous forms: wait on the Work before touching the buffers.
  template <Element T> Work all_gather_async(std::span<const T> s, std::span<T> r) { return start_all_gather(s, r, true); }
  template <Element T> Work reduce_scatter_async(std::span<const T> s, std::span<T> r, ReduceOp op) { return start_reduce_scatter(s, r, op, true); }
  template <Element T> Work all_reduce_async(std::span<const T> s, std::span<T> r, ReduceOp op) { return start_all_reduce(s, r, op, true); }
  template <Element T> Work all_to_all_async(std::span<const T> s, std::span<T> r) { return start_all_to_all(s, r, true); }
  /// All-to-all whose send blocks lie where `blocks` says (recv as for all_to_all). Ranks may
  /// mix this with the plain form in one collective: what travels is the same.
  template <Element T>
  Work all_to_all_async(std::span<const T> s, const StridedBlocks& blocks, std::span<T> r) {
    return start_all_to_all_strided(s, blocks, r, true);
  }
  /// Counts and displacements are in elements, one per rank of the group.
  template <Element T>
  Work all_to_all_v_async(std::span<const T> send, std::span<const std::size_t> sc, std::span<const std::size_t> sd,
                          std::span<T> recv, std::span<const std::size_t> rc, std::span<const std::size_t> rd) {
    return start_all_to_all_v(send, sc, sd, recv, rc, rd, true);
  }
  template <Element T> Work broadcast_async(std::span<T> buf, int root) { return start_broadcast(buf, root, true); }
  template <Element T> Work send_async(std::span<const T> buf, int peer, int tag = 0) { return start_send(buf, peer, tag, true); }
  template <Element T> Work recv_async(std::span<T> buf, int peer, int tag = 0) { return start_recv(buf, peer, tag, true); }
  /// Sends to dst and receives from src at once: the step of a ring, which cannot deadlock.
  template <Element T>
  Work send_recv_async(std::span<const T> send, int dst, std::span<T> recv, int src, int tag = 0) {
    check_peer("send_recv", dst);
    check_peer("send_recv", src);
    const auto span = record(CollectiveKind::send_recv, std::max(send.size(), recv.size()) * sizeof(T), dtype_of<T>,
                             ReduceOp::sum, dst);
    Work s = do_send(send.data(), send.size(), dtype_of<T>, dst, tag, true);
    Work r = do_recv(recv.data(), recv.size(), dtype_of<T>, src, tag, true);
    return traced(span, join(std::move(s), std::move(r)), true);
  }

  // Blocking forms: issued with async = false (a backend may run them inline), waited on at once.
  template <Element T> void all_gather(std::span<const T> s, std::span<T> r) { start_all_gather(s, r, false).wait(); }
  template <Element T> void reduce_scatter(std::span<const T> s, std::span<T> r, ReduceOp op) { start_reduce_scatter(s, r, op, false).wait(); }
  template <Element T> void all_reduce(std::span<const T> s, std::span<T> r, ReduceOp op) { start_all_reduce(s, r, op, false).wait(); }
  template <Element T> void all_reduce(std::span<T> buf, ReduceOp op) { start_all_reduce(std::span<const T>(buf), buf, op, false).wait(); }
  template <Element T> void all_to_all(std::span<const T> s, std::span<T> r) { start_all_to_all(s, r, false).wait(); }
  template <Element T> void all_to_all(std::span<const T> s, const StridedBlocks& blocks, std::span<T> r) {
    start_all_to_all_strided(s, blocks, r, false).wait();
  }
  template <Element T> void broadcast(std::span<T> buf, int root) { start_broadcast(buf, root, false).wait(); }
  template <Element T> void send(std::span<const T> buf, int peer, int tag = 0) { start_send(buf, peer, tag, false).wait(); }
  template <Element T> void recv(std::span<T> buf, int peer, int tag = 0) { start_recv(buf, peer, tag, false).wait(); }
  template <Element T> void send_recv(std::span<const T> s, int dst, std::span<T> r, int src, int tag = 0) {
    send_recv_async(s, dst, r, src, tag).wait();  // both halves asynchronous: a ring must not deadlock
  }
  template <Element T>
  void all_to_all_v(std::span<const T> send, std::span<const std::size_t> sc, std::span<const std::size_t> sd,
                    std::span<T> recv, std::span<const std::size_t> rc, std::span<const std::size_t> rd) {
    start_all_to_all_v(send, sc, sd, recv, rc, rd, false).wait();
  }
  void barrier() {
    const auto span = pre(CollectiveKind::barrier, 0, DType::uint8, ReduceOp::sum, 0, -1);
    // A barrier is where ranks are known to be in step: compare what is pending (the always-on check).
    // (A backend that carries the record in every rendezvous compares in the barrier's own.)
    if (!check_ && verifying() && verified_ != verify_->calls && !carries_verify()) verify("barrier");
    do_barrier();
    detail::collective_finished(span);
  }

  /// Throws a dtensor::Error for `op` on this rank (used by the layers above for bad input):
  /// "op[group label] on rank r (world rank w): what".
  [[noreturn]] void fail(std::string_view op, const std::string& what) const {
    throw Error(named(op), what, rank_, 0, world_rank_);
  }

 protected:
  Communicator(int rank, int size, int world_rank) : rank_(rank), size_(size), world_rank_(world_rank) {
    timeout_ = comm_defaults().timeout;
    check_ = comm_defaults().check_collectives;
    verify_every_ = comm_defaults().verify_every;
    agree_ = comm_defaults().agree_before_data;
  }

  /// How this backend makes agreement before data happen: agrees_in_rendezvous, it compares the
  /// call and detail::call_context in a rendezvous of its own (threads); exchanges_agreement,
  /// pre() exchanges a hash of them first (agree_before: MPI, whose collectives carry host
  /// memory cheaply). Neither (the default): not done — the sim backend has no peers, and NCCL
  /// would stage each 16 bytes through the device (its full and always-on checks remain).
  virtual bool agrees_in_rendezvous() const noexcept { return false; }
  virtual bool exchanges_agreement() const noexcept { return false; }
  /// Whether this backend compares the always-on check's record in the rendezvous every
  /// collective makes anyway (threads: record_to_carry, posted with the arguments), instead of
  /// an all-gather of its own every verify_every calls: the comparison then costs no extra
  /// synchronisation and happens at every collective, before its data moves. check_agreement
  /// calls that no collective follows are still compared by an all-gather once verify_every of
  /// them are pending, so that the first difference is always in the window.
  virtual bool carries_verify() const noexcept { return false; }
  /// For carries_verify backends, when a collective is issued: the record its rendezvous
  /// compares (with every call up to and including this one folded in), or null when the
  /// always-on check is off (or the full check, which compares before every call, is on).
  const detail::VerifyRecord* record_to_carry() {
    if (check_ || !verifying()) return nullptr;
    verified_ = verify_->calls;
    return verify_.get();
  }

  // The backend's part. `async` false means the caller will wait at once (a backend may then
  // run the operation inline). Counts are per block as in the table at the top.
  virtual CommPtr do_split(int color, int key) = 0;
  /// The split of a group the caller knows (split(color, key, group_size)): the ordinary split
  /// unless the backend can make it without meeting its peers.
  virtual CommPtr do_split_known(int color, int key, int /*group_size*/) { return do_split(color, key); }
  virtual Work do_all_gather(const void* send, void* recv, std::size_t count, DType, bool async) = 0;
  virtual Work do_reduce_scatter(const void* send, void* recv, std::size_t count, DType, ReduceOp, bool async) = 0;
  virtual Work do_all_reduce(const void* send, void* recv, std::size_t count, DType, ReduceOp, bool async) = 0;
  virtual Work do_all_to_all(const void* send, void* recv, std::size_t count, DType, bool async) = 0;
  virtual Work do_all_to_all_v(const void* send, const std::size_t* send_counts, const std::size_t* send_displs,
                               void* recv, const std::size_t* recv_counts, const std::size_t* recv_displs, DType,
                               bool async) = 0;
  virtual Work do_broadcast(void* buf, std::size_t count, DType, int root, bool async) = 0;
  virtual Work do_send(const void* buf, std::size_t count, DType, int peer, int tag, bool async) = 0;
  virtual Work do_recv(void* buf, std::size_t count, DType, int peer, int tag, bool async) = 0;
  virtual void do_barrier() = 0;
  /// The strided all-to-all. This fallback packs the blocks (host memory) and runs the plain
  /// all-to-all; backends that can read strided blocks directly override it.
  virtual Work do_all_to_all_strided(const void* send, const StridedBlocks& blocks, void* recv, DType t, bool async) {
    const std::size_t element_bytes = size_of(t);
    auto packed = std::make_shared<std::vector<std::byte>>(std::size_t(size_) * blocks.block_elements() * element_bytes);
    for (int j = 0; j < size_; ++j)
      detail::copy_strided_block(packed->data() + std::size_t(j) * blocks.block_elements() * element_bytes, send,
                                 blocks, j, element_bytes,
                                 [](std::byte* d, const std::byte* s, std::size_t n) { std::memcpy(d, s, n); });
    Work w = do_all_to_all(packed->data(), recv, blocks.block_elements(), t, async);
    if (w.done()) return w;
    return keep_alive(std::move(w), std::move(packed));
  }

  /// A Work that keeps `held` alive until `w` completes (buffers an asynchronous call reads).
  static Work keep_alive(Work w, std::shared_ptr<const void> held) {
    struct Holding final : detail::WorkState {
      Work w;
      std::shared_ptr<const void> held;
      Holding(Work x, std::shared_ptr<const void> h) : w(std::move(x)), held(std::move(h)) {}
      void wait() override { w.wait(); }
      bool test() override { return w.test(); }
    };
    return Work(std::make_shared<Holding>(std::move(w), std::move(held)));
  }

  /// One Work that completes when both have.
  static Work join(Work a, Work b) {
    struct Both final : detail::WorkState {
      Work a, b;
      Both(Work x, Work y) : a(std::move(x)), b(std::move(y)) {}
      void wait() override {
        a.wait();
        b.wait();
      }
      bool test() override { return a.test() && b.test(); }
    };
    if (a.done()) return b;
    if (b.done()) return a;
    return Work(std::make_shared<Both>(std::move(a), std::move(b)));
  }

 private:
  // The checks, the log entry and the backend call, shared by the asynchronous and blocking forms.
  // Each typed form hands its buffers, counts and DType to one function that is not a template and
  // is not inlined: one body per collective, not one per element type inlined at every call site.
  template <Element T>
  Work start_all_gather(std::span<const T> send, std::span<T> recv, bool async) {
    return start_all_gather(send.data(), send.size(), recv.data(), recv.size(), dtype_of<T>, async);
  }
  [[gnu::noinline]] Work start_all_gather(const void* send, std::size_t send_count, void* recv, std::size_t recv_count,
                                          DType t, bool async) {
    expect_count("all_gather", "recv", recv_count, send_count * std::size_t(size_), send_count);
    const auto span = pre(CollectiveKind::all_gather, recv_count * size_of(t), t, ReduceOp::sum, send_count, -1);
    return traced(span, do_all_gather(send, recv, send_count, t, async), async);
  }
  template <Element T>
  Work start_reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op, bool async) {
    return start_reduce_scatter(send.data(), send.size(), recv.data(), recv.size(), dtype_of<T>, op, async);
  }
  [[gnu::noinline]] Work start_reduce_scatter(const void* send, std::size_t send_count, void* recv,
                                              std::size_t recv_count, DType t, ReduceOp op, bool async) {
    expect_count("reduce_scatter", "send", send_count, recv_count * std::size_t(size_), recv_count);
    const auto span = pre(CollectiveKind::reduce_scatter, send_count * size_of(t), t, op, recv_count, -1);
    return traced(span, do_reduce_scatter(send, recv, recv_count, t, op, async), async);
  }
  template <Element T>
  Work start_all_reduce(std::span<const T> send, std::span<T> recv, ReduceOp op, bool async) {
    return start_all_reduce(send.data(), send.size(), recv.data(), recv.size(), dtype_of<T>, op, async);
  }
  [[gnu::noinline]] Work start_all_reduce(const void* send, std::size_t send_count, void* recv, std::size_t recv_count,
                                          DType t, ReduceOp op, bool async) {
    expect_count("all_reduce", "recv", recv_count, send_count, send_count);
    const auto span = pre(CollectiveKind::all_reduce, send_count * size_of(t), t, op, send_count, -1);
    return traced(span, do_all_reduce(send, recv, send_count, t, op, async), async);
  }
  template <Element T>
  Work start_all_to_all(std::span<const T> send, std::span<T> recv, bool async) {
    return start_all_to_all(send.data(), send.size(), recv.data(), recv.size(), dtype_of<T>, async);
  }
  [[gnu::noinline]] Work start_all_to_all(const void* send, std::size_t send_count, void* recv, std::size_t recv_count,
                                          DType t, bool async) {
    if (send_count % std::size_t(size_) != 0)
      fail("all_to_all", detail::cat("send has ", send_count, " elements, not a multiple of the group size ", size_));
    expect_count("all_to_all", "recv", recv_count, send_count, send_count / std::size_t(size_));
    const auto span = pre(CollectiveKind::all_to_all, send_count * size_of(t), t, ReduceOp::sum, send_count, -1);
    return traced(span, do_all_to_all(send, recv, send_count / std::size_t(size_), t, async), async);
  }
  template <Element T>
  Work start_all_to_all_strided(std::span<const T> send, const StridedBlocks& b, std::span<T> recv, bool async) {
    return start_all_to_all_strided(send.data(), send.size(), b, recv.data(), recv.size(), dtype_of<T>, async);
  }
  [[gnu::noinline]] Work start_all_to_all_strided(const void* send, std::size_t send_count, const StridedBlocks& b,
                                                  void* recv, std::size_t recv_count, DType t, bool async) {
    const std::size_t block = b.block_elements();
    if (b.rows > 1 && b.run > b.row_stride)
      fail("all_to_all", detail::cat("strided blocks: runs of ", b.run, " elements overlap at a row stride of ",
                                     b.row_stride));
    if (b.extent(size_) > send_count)
      fail("all_to_all", detail::cat("strided blocks (", b.rows, " rows of ", b.run, " elements, row stride ",
                                     b.row_stride, ", block stride ", b.block_stride, ") span ", b.extent(size_),
                                     " elements for ", size_, " ranks, but send has ", send_count));
    expect_count("all_to_all", "recv", recv_count, block * std::size_t(size_), block);
    const auto span = pre(CollectiveKind::all_to_all, recv_count * size_of(t), t, ReduceOp::sum, recv_count, -1);
    return traced(span, do_all_to_all_strided(send, b, recv, t, async), async);
  }
  template <Element T>
  Work start_all_to_all_v(std::span<const T> send, std::span<const std::size_t> send_counts,
                          std::span<const std::size_t> send_displs, std::span<T> recv,
                          std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs, bool async) {
    check_v("send", send.size(), send_counts, send_displs);
    check_v("recv", recv.size(), recv_counts, recv_displs);
    std::size_t total = 0;
    for (auto c : send_counts) total += c;
    std::size_t rtotal = 0;
    for (auto c : recv_counts) rtotal += c;
    const auto span =
        pre(CollectiveKind::all_to_all_v, std::max(total, rtotal) * sizeof(T), dtype_of<T>, ReduceOp::sum, 0, -1);
    return traced(span,
                  do_all_to_all_v(send.data(), send_counts.data(), send_displs.data(), recv.data(), recv_counts.data(),
                                  recv_displs.data(), dtype_of<T>, async),
                  async);
  }
  template <Element T>
  Work start_broadcast(std::span<T> buf, int root, bool async) {
    return start_broadcast(buf.data(), buf.size(), dtype_of<T>, root, async);
  }
  [[gnu::noinline]] Work start_broadcast(void* buf, std::size_t count, DType t, int root, bool async) {
    check_peer("broadcast", root);
    const auto span = pre(CollectiveKind::broadcast, count * size_of(t), t, ReduceOp::sum, count, root);
    return traced(span, do_broadcast(buf, count, t, root, async), async);
  }
  template <Element T>
  Work start_send(std::span<const T> buf, int peer, int tag, bool async) {
    return start_send(buf.data(), buf.size(), dtype_of<T>, peer, tag, async);
  }
  [[gnu::noinline]] Work start_send(const void* buf, std::size_t count, DType t, int peer, int tag, bool async) {
    check_peer("send", peer);
    const auto span = record(CollectiveKind::send, count * size_of(t), t, ReduceOp::sum, peer);
    return traced(span, do_send(buf, count, t, peer, tag, async), async);
  }
  template <Element T>
  Work start_recv(std::span<T> buf, int peer, int tag, bool async) {
    return start_recv(buf.data(), buf.size(), dtype_of<T>, peer, tag, async);
  }
  [[gnu::noinline]] Work start_recv(void* buf, std::size_t count, DType t, int peer, int tag, bool async) {
    check_peer("recv", peer);
    const auto span = record(CollectiveKind::recv, count * size_of(t), t, ReduceOp::sum, peer);
    return traced(span, do_recv(buf, count, t, peer, tag, async), async);
  }
  // Logs a call in the enclosing CommLogs and reports it to this thread's observer, if any
  // (comm/observer.hpp): traced() hands it the backend's Work, to see it complete.
  detail::ObservedCollective record(CollectiveKind k, std::size_t bytes, DType t, ReduceOp op, int peer) const {
    const CommRecord r{k, label_, size_, bytes, t, op, peer};
    CommLog::record(r);
    return detail::collective_issued(r);
  }
  static Work traced(const detail::ObservedCollective& span, Work w, bool async) {
    return detail::collective_started(span, std::move(w), async);
  }
  // Before every collective: log it, and compare fingerprints across ranks when asked to.
  detail::ObservedCollective pre(CollectiveKind k, std::size_t bytes, DType t, ReduceOp op, std::size_t count,
                                 int root) {
    const auto span = record(k, bytes, t, op, -1);
    if (check_) {
      check_fingerprints(detail::Fingerprint::of_collective(k, t, op, count, root), name_of(k),
                         "ranks issued different collectives (collective check):");
      return span;
    }
    if (agree_ && size_ > 1 && exchanges_agreement()) {
      // Whether the always-on check's all-gather follows on this rank (this call completes its
      // period, or a barrier compares what is pending): ranks that compare at different periods
      // (their own DTENSOR_VERIFY_EVERY) are told so here, before MPI pairs that all-gather with
      // another rank's collective (MPI_ERR_TRUNCATE, or silently when the sizes happen to match).
      const bool then = verifying() && (k == CollectiveKind::barrier ||
                                        (verify_->calls + 1) % std::uint64_t(verify_every_) == 0);
      agree_before(detail::Fingerprint::of_collective(k, t, op, count, root), name_of(k), then);
    }
    if (verifying()) fold(detail::Fingerprint::of_collective(k, t, op, count, root), name_of(k), true);
    return span;
  }

  // ---------------------------------------------------------------- the always-on check
  /// Whether this group verifies: on, more than one rank, and peers to meet (the sim backend
  /// has none: its all-gather moves nothing).
  bool verifying() {
    if (verify_every_ == 0 || size_ == 1) return false;
    if (!verify_) {
      if (backend() == "sim") return false;
      verify_ = std::make_unique<detail::VerifyRecord>();
      verify_->world_rank = world_rank_;
    }
    return true;
  }
  /// Adds one call's fingerprint; every verify_every-th, compares with the other ranks. On a
  /// carries_verify backend a collective (`collective`) is compared in its own rendezvous, and
  /// the all-gather runs only when verify_every check_agreement calls are pending without one.
  void fold(const detail::Fingerprint& f, std::string_view op, bool collective = false) {
    auto& v = *verify_;
    v.last[v.calls % detail::verify_window] = f;
    v.hash = f.folded_into(v.hash);
    ++v.calls;
    if (carries_verify()) {
      if (!collective && v.calls - verified_ >= std::uint64_t(verify_every_)) verify(op);
    } else if (v.calls % std::uint64_t(verify_every_) == 0) {
      verify(op);
    }
  }
  /// All-gathers the record and throws on every rank, naming the first differing call, unless
  /// all ranks made the same calls. Errors name `op`, the operation this rank was about to run.
  void verify(std::string_view op) {
    detail::VerifyRecord& mine = *verify_;
    mine.world_rank = world_rank_;
    verified_ = mine.calls;

    std::vector<detail::VerifyRecord> all(static_cast<std::size_t>(size_));
    try {
      do_all_gather(&mine, all.data(), sizeof mine, DType::uint8, false).wait();
    } catch (const Error& e) {
      throw Error(named(op), e.message(), rank_, e.backend_code(), world_rank_);
    }
    // The previous comparison passed, so the first difference is among the calls since then,
    // all still in the window (verify_every <= verify_window).
    std::vector<const detail::VerifyRecord*> ptrs(all.size());
    for (std::size_t r = 0; r < all.size(); ++r) ptrs[r] = &all[r];
    std::string table = detail::verify_mismatch(
        ptrs.data(), size_, mine, label_,
        detail::cat("ranks issued different collectives (the always-on check, which compares every ", verify_every_,
                    " calls: the data of the calls since the last comparison has moved; set_check_collectives(true) "
                    "or DTENSOR_CHECK_COLLECTIVES=1 stops before it does):"));
    if (!table.empty()) fail(op, table);
  }
  /// Agreement before data on a backend without a shared rendezvous: one all-reduce (max) of
  /// (h, ~h), h a hash of the call and its context; equal on every rank exactly when every rank
  /// holds the same h (a rank whose h is not the largest sees the first word differ, one whose h
  /// is the largest the second), so every rank reaches the same verdict. Only then, on every
  /// rank, the records themselves are all-gathered for the message.
  void agree_before(const detail::Fingerprint& call, std::string_view op, bool then_verifies = false) {
    detail::CallRecord mine{call, detail::call_context ? *detail::call_context : detail::Fingerprint{},
                            then_verifies ? 1u : 0u};
    mine.call.world_rank = world_rank_;
    const auto h = std::int64_t(mine.hash());
    const std::int64_t words[2] = {h, ~h};
    std::int64_t most[2] = {0, 0};
    try {
      do_all_reduce(words, most, 2, DType::int64, ReduceOp::max, false).wait();
    } catch (const Error& e) {
      throw Error(named(op), e.message(), rank_, e.backend_code(), world_rank_);
    }
    if (most[0] == words[0] && most[1] == words[1]) return;
    std::vector<detail::CallRecord> all(static_cast<std::size_t>(size_));
    try {
      do_all_gather(&mine, all.data(), sizeof mine, DType::uint8, false).wait();
    } catch (const Error& e) {
      throw Error(named(op), e.message(), rank_, e.backend_code(), world_rank_);
    }
    std::string table = detail::cat("ranks asked for different collectives (agreement before data: nothing has "
                                    "been exchanged; DTENSOR_AGREE_BEFORE_DATA=0 turns the check off):");
    for (int r = 0; r < size_; ++r) {
      const auto& c = all[std::size_t(r)];
      table += detail::cat("\n  rank ", r);
      if (c.call.world_rank != r) table += detail::cat(" (world rank ", c.call.world_rank, ")");
      table += ": " + c.describe();
    }
    fail(op, table);
  }
  /// All-gathers this rank's fingerprint and throws on every rank, one line per rank, unless
  /// every rank's is the same call. Errors name `op`, the operation this rank was about to run
  /// (also when the exchange itself fails: a peer that failed, a timeout).
  void check_fingerprints(detail::Fingerprint mine, std::string_view op, std::string_view headline) {
    mine.world_rank = world_rank_;
    std::vector<detail::Fingerprint> all(static_cast<std::size_t>(size_));  // not size_t(size_): a vexing parse
    try {
      do_all_gather(&mine, all.data(), sizeof mine, DType::uint8, false).wait();
    } catch (const Error& e) {
      throw Error(named(op), e.message(), rank_, e.backend_code(), world_rank_);
    }
    bool same = true;
    for (const auto& f : all) same = same && f.same_call(all[0]);
    if (same) return;
    std::string table(headline);
    for (int r = 0; r < size_; ++r) {
      const auto& f = all[std::size_t(r)];
      table += detail::cat("\n  rank ", r);
      if (f.world_rank != r) table += detail::cat(" (world rank ", f.world_rank, ")");
      table += ": " + f.describe();
    }
    fail(op, table);
  }
  /// "op[label]": how errors name an operation on this group.
  std::string named(std::string_view op) const { return std::string(op) + (label_.empty() ? "" : "[" + label_ + "]"); }
  void expect_count(const char* op, const char* which, std::size_t got, std::size_t want, std::size_t n) const {
    if (got != want)
      fail(op, detail::cat(which, " has ", got, " elements, expected ", want, " (", n, " per block x ", size_,
                           " ranks)"));
  }
  void check_peer(const char* op, int peer) const {
    if (peer < 0 || peer >= size_) fail(op, detail::cat("peer ", peer, " is not a rank of this group of ", size_));
  }
  void check_v(const char* which, std::size_t total, std::span<const std::size_t> counts,
               std::span<const std::size_t> displs) const {
    if (counts.size() != std::size_t(size_) || displs.size() != std::size_t(size_))
      fail("all_to_all_v", detail::cat(which, " counts/displacements have ", counts.size(), "/", displs.size(),
                                       " entries, expected one per rank (", size_, ")"));
    for (int r = 0; r < size_; ++r)
      if (displs[std::size_t(r)] + counts[std::size_t(r)] > total)
        fail("all_to_all_v", detail::cat(which, " block for rank ", r, " [", displs[std::size_t(r)], ", ",
                                         displs[std::size_t(r)] + counts[std::size_t(r)], ") exceeds the buffer of ",
                                         total, " elements"));
  }

  int rank_, size_, world_rank_;
  std::string label_ = "world";
  std::chrono::milliseconds timeout_;
  bool check_ = false;
  int verify_every_ = 0;
  bool agree_ = true;
  std::unique_ptr<detail::VerifyRecord> verify_;  // the always-on check's state, made at first use
  std::uint64_t verified_ = 0;                    // calls compared by the last verify
};

}  // namespace dtensor
