// dtensor/comm/detail/threads_ops.hpp — the collectives and point-to-point operations of the
// threads backend, as functions of a group, a rank and a sequence number.
//
// A collective is a rendezvous in the group's slot for its sequence number:
//   1. arrive:   post my buffers and arguments; wait (with the timeout) until every rank has.
//   2. validate: every rank checks every rank's arguments, so all reach the same verdict.
//   3. pull:     copy or reduce what *I* need straight from the peers' buffers (zero-copy).
//   4. depart:   wait until no peer still reads my memory, then leave the slot.
// Only step 1 can fail (abort, a peer that has left its function, timeout): once every rank has
// arrived, each has only a bounded amount of copying left, so steps 3-4 ignore aborts and never
// leave while a peer reads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/detail/threads_reduce.hpp"
#include "dtensor/comm/detail/threads_state.hpp"

namespace dtensor::threads::detail {

/// Everything an operation needs, captured at issue time (an asynchronous one runs elsewhere).
struct Ctx {
  std::shared_ptr<Group> group;
  int rank = 0;
  std::uint64_t seq = 0;
  std::chrono::milliseconds timeout{0};
  std::string label;
  std::shared_ptr<const MemOps> mem{};  // null: the buffers are host memory
  // The redistribution (dtensor::detail::call_context) a collective was issued in, with
  // agreement before data on: posted with the arguments and compared in validate().
  bool has_context = false;
  dtensor::detail::Fingerprint context{};
  // The always-on check's record (Communicator::record_to_carry), null when it is off: its
  // count and hash are posted and compared in validate(); the record itself is read only to
  // name the first differing call. An asynchronous collective carries a copy (`verify_copy`),
  // since its rank goes on folding calls while it runs.
  const dtensor::detail::VerifyRecord* verify = nullptr;
  std::shared_ptr<const dtensor::detail::VerifyRecord> verify_copy{};
  int verify_every = 0;

  int world_rank() const { return group->world_ranks[std::size_t(rank)]; }
  std::string op(CollectiveKind k) const { return dtensor::detail::cat(name_of(k), "[", label, "]"); }
  Error error(CollectiveKind k, const std::string& what) const { return Error(op(k), what, rank, 0, world_rank()); }
};

inline const std::byte* bytes_of(const void* p) { return static_cast<const std::byte*>(p); }
inline std::byte* bytes_of(void* p) { return static_cast<std::byte*>(p); }

/// "rank 3" or, in a sub-group, "rank 1 (world rank 5)".
inline std::string rank_name(const Group& g, int r) {
  const int w = g.world_ranks[std::size_t(r)];
  return w == r ? dtensor::detail::cat("rank ", r) : dtensor::detail::cat("rank ", r, " (world rank ", w, ")");
}

/// What a rank passed, for messages: "all_reduce(16 x float32, sum)".
inline std::string describe(const Post& p) {
  using dtensor::detail::cat;
  std::string s(name_of(p.kind));
  switch (p.kind) {
    case CollectiveKind::all_to_all_v: s += cat("(", name_of(p.dtype), ")"); break;
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter: s += cat("(", p.count, " x ", name_of(p.dtype), ", ", name_of(p.op), ")"); break;
    case CollectiveKind::broadcast: s += cat("(", p.count, " x ", name_of(p.dtype), ", root ", p.root, ")"); break;
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all: s += cat("(", p.count, " x ", name_of(p.dtype), ")"); break;
    default: break;
  }
  if (p.context) s += " in redistribute " + p.context->describe();
  return s;
}

/// The fields that must agree between ranks for a given kind of collective.
inline bool agree(const Post& a, const Post& b) {
  if (a.kind != b.kind) return false;
  if (a.context_key != b.context_key) return false;
  switch (a.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter: return a.count == b.count && a.dtype == b.dtype && a.op == b.op;
    case CollectiveKind::broadcast: return a.count == b.count && a.dtype == b.dtype && a.root == b.root;
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all: return a.count == b.count && a.dtype == b.dtype;
    case CollectiveKind::all_to_all_v: return a.dtype == b.dtype;
    default: return true;
  }
}

// ------------------------------------------------------------------------------ phases

/// The first rank that has not arrived in `s` and never will, because it has left the run's
/// function (and has no asynchronous operation pending); -1 when there is none.
inline int first_gone(const Group& g, const Slot& s) {
  for (int r = 0; r < g.size; ++r)
    if (!s.here[std::size_t(r)] && g.world->departures.gone(g.world_ranks[std::size_t(r)])) return r;
  return -1;
}

/// Why a collective fails when rank `r` of its group is gone.
inline std::string gone_reason(const Ctx& c, int r) {
  const Group& g = *c.group;
  return dtensor::detail::cat(rank_name(g, r), " ", g.world->departures.how_left(g.world_ranks[std::size_t(r)]),
                              " the function given to threads::run without calling collective #", c.seq,
                              " of group '", c.label, "' (", g.size, " ranks), so it can never complete");
}

/// Step 1. Posts `mine` in slot `c.seq` and waits for the other ranks. Throws (and leaves the
/// slot) if the run is aborted, a peer has left its function (it can never arrive) or the
/// timeout expires first; a timeout aborts the run.
inline Slot& arrive(const Ctx& c, Post mine) {
  if (c.has_context) {
    mine.context = &c.context;
    mine.context_key = c.context.folded_into(0x9e3779b97f4a7c15ull) | 1;  // never 0: 0 is "none"
  }
  if (c.verify) {
    mine.verify = c.verify;
    mine.verify_calls = c.verify->calls;
    mine.verify_hash = c.verify->hash;
    mine.verify_every = c.verify_every;
  }
  Group& g = *c.group;
  World& w = *g.world;
  const int n = g.size;
  std::unique_lock l(g.mu);
  Slot& s = g.slot(c.seq);
  auto give_up = [&]() {
    std::string why = s.reason;
    g.leave(s);
    l.unlock();
    g.wake.wake();
    throw c.error(mine.kind, why);
  };
  // An abort comes first: its reason names the rank that failed first. Otherwise a peer that
  // has left can never arrive: fail the slot, with its name, for every waiter.
  auto fail_if_aborted_or_peer_gone = [&] {
    if (s.failed) return;
    if (w.aborted()) {
      s.failed = true;
      s.reason = w.reason();
    } else if (const int r = first_gone(g, s); r >= 0) {
      s.failed = true;
      s.reason = gone_reason(c, r);
    }
  };
  fail_if_aborted_or_peer_gone();
  if (s.failed) give_up();

  if (!c.mem && mine.send_bytes > 0 && mine.send_bytes <= eager_limit) {
    // Copying a small send beats making its owner wait for every reader (one rendezvous less).
    if (s.eager.empty()) s.eager.resize(std::size_t(n) * eager_limit);
    std::byte* copy = s.eager.data() + std::size_t(c.rank) * eager_limit;
    std::memcpy(copy, mine.send, mine.send_bytes);
    mine.send = copy;
    mine.lent = false;
  }
  if (!c.mem && mine.kind == CollectiveKind::all_reduce) {
    const std::size_t need = mine.count * size_of(mine.dtype);
    if (s.scratch_bytes < need) {
      s.scratch.reset(new std::byte[need]);
      s.scratch_bytes = need;
    }
  }
  s.posts[std::size_t(c.rank)] = mine;
  s.here[std::size_t(c.rank)] = 1;
  if (++s.arrived == n) {
    l.unlock();
    g.wake.wake();
    return s;
  }

  l.unlock();
  if (spin_until([&] { return s.arrived.load() == n || w.aborted(); }, w.size)) {
    if (s.arrived.load() == n) return s;
  }
  const auto deadline = deadline_after(c.timeout);
  for (;;) {
    // Read the word first (WakeWord): a completion after this read wakes the sleep below.
    const auto seen = g.wake.now();
    if (s.arrived.load() == n) return s;  // the common way out: no lock
    l.lock();
    if (s.arrived == n) return s;
    fail_if_aborted_or_peer_gone();
    if (s.failed) give_up();
    if (Clock::now() >= deadline) {
      std::string missing;
      int k = 0;
      for (int r = 0; r < n; ++r)
        if (!s.here[std::size_t(r)]) missing += (k++ ? ", " : "") + rank_name(g, r);
      const Error e = c.error(mine.kind, dtensor::detail::cat("timed out after ", c.timeout.count(),
                                                              " ms in collective #", c.seq, " of group '", c.label,
                                                              "' (", n, " ranks): ", missing, " did not arrive"));
      std::string why = dtensor::detail::cat("rank ", c.world_rank(), " failed: ", e.what());
      // Mark the slot failed before letting go of the lock, so a late rank cannot complete it
      // (and read our buffers) after we have left.
      s.failed = true;
      s.reason = why;
      g.leave(s);
      l.unlock();
      g.wake.wake();
      w.abort(c.world_rank(), std::move(why));
      throw e;
    }
    l.unlock();
    g.wake.wait_until(seen, deadline);
  }
}

/// A barrier inside the slot, after arrival: it never fails.
inline void sync(Group& g, std::atomic<int>& counter) {
  g.count(counter);
  g.wait_all(counter);
}

/// Step 4. `lent`: peers read this rank's own memory, so it waits until all finished reading.
/// With device memory, this rank's own copies must have completed before it counts as done.
/// Neither counting nor leaving takes the group's mutex unless a waiter is parked or this rank
/// is the last to leave.
inline void depart(const Ctx& c, Slot& s, bool lent) {
  if (c.mem) c.mem->fence();
  Group& g = *c.group;
  g.count(s.done_reading);
  if (lent) g.wait_all(s.done_reading);
  g.leave_unlocked(s);
}

/// The always-on check, carried in the rendezvous (Communicator::carries_verify): empty when
/// every rank has folded the same calls (this one included), else a message naming the first
/// call that differed. Every rank posted its record by value (count, hash) and by address; the
/// addresses are read only here, on the failure path, where no rank leaves before all have
/// validated.
inline std::string verify_problem(const Ctx& c, const Slot& s) {
  const Group& g = *c.group;
  const Post& me = s.posts[std::size_t(c.rank)];
  bool on = false, off = false, same = true;
  for (const Post& p : s.posts) {
    (p.verify ? on : off) = true;
    same = same && p.verify_calls == s.posts[0].verify_calls && p.verify_hash == s.posts[0].verify_hash;
  }
  if (!on || (!off && same)) return {};
  using dtensor::detail::cat;
  if (off) {
    std::string why = cat("ranks disagree about the always-on check (set_verify_every / DTENSOR_VERIFY_EVERY; "
                          "collective #", c.seq, " of group '", c.label, "'):");
    for (int r = 0; r < g.size; ++r)
      why += "\n  " + rank_name(g, r) + ": " +
             (s.posts[std::size_t(r)].verify ? cat("every ", s.posts[std::size_t(r)].verify_every, " calls") : "off");
    return why;
  }
  std::vector<const dtensor::detail::VerifyRecord*> all(s.posts.size());
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = s.posts[r].verify;
  return dtensor::detail::verify_mismatch(
      all.data(), g.size, *me.verify, c.label,
      "ranks issued different collectives (the always-on check, compared in the rendezvous of every collective "
      "before its data moves; the local work of the calls since the previous collective has run; "
      "set_check_collectives(true) or DTENSOR_CHECK_COLLECTIVES=1 stops before each call):");
}

/// Step 2. Throws the same error on every rank when ranks passed inconsistent arguments.
inline void validate(const Ctx& c, Slot& s) {
  Group& g = *c.group;
  const int n = g.size;
  const Post& me = s.posts[std::size_t(c.rank)];
  std::string problem;
  bool same = true;
  for (int r = 1; r < n; ++r) same = same && agree(s.posts[0], s.posts[std::size_t(r)]);
  if (!same) {
    problem = dtensor::detail::cat("ranks passed different arguments to collective #", c.seq, " of group '",
                                   c.label, "':");
    for (int r = 0; r < n; ++r) problem += "\n  " + rank_name(g, r) + ": " + describe(s.posts[std::size_t(r)]);
  } else if (me.kind == CollectiveKind::all_to_all_v) {
    // Each pair must agree: what j sends to r is what r expects from j.
    for (int j = 0; j < n; ++j)
      for (int r = 0; r < n; ++r) {
        const std::size_t sent = s.posts[std::size_t(j)].counts[0][r];
        const std::size_t want = s.posts[std::size_t(r)].counts[2][j];
        if (sent != want)
          problem += dtensor::detail::cat("\n  ", rank_name(g, j), " sends ", sent, " elements to rank ", r,
                                          ", which expects ", want);
      }
    if (!problem.empty()) problem = "send and receive counts disagree:" + problem;
  }
  if (problem.empty()) problem = verify_problem(c, s);
  if (problem.empty()) return;
  // Every rank reaches this verdict, but none may leave (and unwind, freeing what peers still
  // read, such as all_to_all_v's count arrays) before all have validated.
  sync(g, s.mid);
  g.leave_unlocked(s);
  throw c.error(me.kind, problem);
}

/// Steps 1 and 2: the slot, once every rank has arrived with consistent arguments.
inline Slot& rendezvous(const Ctx& c, const Post& mine) {
  if (c.mem) c.mem->fence();  // what peers will read must be complete before they may read it
  Slot& s = arrive(c, mine);
  validate(c, s);
  return s;
}

/// Where peers can safely read `bytes` of `send` after arrival. When this rank's own output
/// overlaps it (in-place use) and the send is too large to travel eagerly, it is copied first,
/// into `hold`, so that writing the output cannot change what peers read.
/// `eager` says whether a small send will be copied into the slot anyway.
inline const void* stable_send(const Ctx& c, const void* send, std::size_t bytes, const void* out,
                               std::size_t out_bytes, std::shared_ptr<std::byte>& hold, bool eager = true) {
  const auto* a = bytes_of(send);
  const auto* b = bytes_of(out);
  const bool overlap = bytes && out_bytes && a < b + out_bytes && b < a + bytes;
  if (!overlap || (!c.mem && eager && bytes <= eager_limit)) return send;
  if (c.mem) {
    hold = c.mem->allocate(bytes, send);
    c.mem->copy(hold.get(), send, bytes);
  } else {
    hold = std::shared_ptr<std::byte>(new std::byte[bytes], std::default_delete<std::byte[]>());
    std::memcpy(hold.get(), send, bytes);
  }
  return hold.get();
}

/// Pointers to the same offset in every rank's send, in rank order (reused: no allocation).
inline const void* const* peer_sends(const Slot& s, std::size_t offset) {
  thread_local std::vector<const void*> ptrs;
  ptrs.resize(s.posts.size());
  for (std::size_t r = 0; r < s.posts.size(); ++r) ptrs[r] = bytes_of(s.posts[r].send) + offset;
  return ptrs.data();
}

inline void copy_bytes(const Ctx& c, void* dst, const void* src, std::size_t n) {
  if (!n || dst == src) return;
  if (c.mem) c.mem->copy(dst, src, n);
  else std::memcpy(dst, src, n);
}

inline void reduce_into(const Ctx& c, DType t, ReduceOp op, void* dst, const void* const* srcs, int n,
                        std::size_t count) {
  if (c.mem) c.mem->reduce(t, op, dst, srcs, n, count);
  else reduce(t, op, dst, srcs, n, count);
}

// ------------------------------------------------------------------------------ collectives

inline void all_gather(const Ctx& c, const void* send, void* recv, std::size_t count, DType t) {
  const int n = c.group->size;
  const std::size_t block = count * size_of(t);
  std::shared_ptr<std::byte> hold;
  // In-place (send is my own block of recv) is safe: I never rewrite my block with other data.
  const bool in_place = send == bytes_of(recv) + std::size_t(c.rank) * block;
  Post p{.kind = CollectiveKind::all_gather, .dtype = t, .count = count,
         .send = in_place ? send : stable_send(c, send, block, recv, block * std::size_t(n), hold),
         .send_bytes = block, .lent = true};
  Slot& s = rendezvous(c, p);
  for (int j = 0; j < n; ++j) copy_bytes(c, bytes_of(recv) + std::size_t(j) * block, s.posts[std::size_t(j)].send, block);
  depart(c, s, s.posts[std::size_t(c.rank)].lent);
}

inline void reduce_scatter(const Ctx& c, const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
  const int n = c.group->size;
  const std::size_t block = count * size_of(t);
  std::shared_ptr<std::byte> hold;
  Post p{.kind = CollectiveKind::reduce_scatter, .dtype = t, .op = op, .count = count,
         .send = stable_send(c, send, block * std::size_t(n), recv, block, hold),
         .send_bytes = block * std::size_t(n), .lent = true};
  Slot& s = rendezvous(c, p);
  reduce_into(c, t, op, recv, peer_sends(s, std::size_t(c.rank) * block), n, count);
  depart(c, s, s.posts[std::size_t(c.rank)].lent);
}

/// Small: every rank reduces everything from the eager copies (one rendezvous). Large: rank r
/// reduces slice r of all sends into the slot's scratch, a barrier, then every rank copies the
/// scratch out. Either way send may equal recv, and all ranks get bit-identical results.
inline void all_reduce(const Ctx& c, const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
  const int n = c.group->size;
  const std::size_t es = size_of(t), bytes = count * es;
  Post p{.kind = CollectiveKind::all_reduce, .dtype = t, .op = op, .count = count, .send = send,
         .send_bytes = bytes, .lent = true};
  Slot& s = rendezvous(c, p);
  if (c.mem) {
    // Device memory: each rank reduces the whole buffer in rank order (one kernel), into a
    // temporary when send and recv overlap, because peers still read this rank's send until mid.
    const auto* a = bytes_of(send);
    const auto* b = bytes_of(recv);
    std::shared_ptr<std::byte> tmp;
    void* out = recv;
    if (bytes && a < b + bytes && b < a + bytes) out = (tmp = c.mem->allocate(bytes, recv)).get();
    c.mem->reduce(t, op, out, peer_sends(s, 0), n, count);
    c.mem->fence();
    sync(*c.group, s.mid);
    copy_bytes(c, recv, out, bytes);
    depart(c, s, false);
    return;
  }
  if (!s.posts[std::size_t(c.rank)].lent) {
    reduce(t, op, recv, peer_sends(s, 0), n, count);
  } else {
    // Slices are whole cache lines, so ranks never write the same line of the scratch.
    const std::size_t per_line = std::max<std::size_t>(1, 64 / es);
    const std::size_t slice = (count + std::size_t(n) - 1) / std::size_t(n);
    const std::size_t step = (slice + per_line - 1) / per_line * per_line;
    const std::size_t lo = std::min(count, std::size_t(c.rank) * step), hi = std::min(count, lo + step);
    if (hi > lo) reduce_into(c, t, op, s.scratch.get() + lo * es, peer_sends(s, lo * es), n, hi - lo);
    sync(*c.group, s.mid);  // from here on nobody reads the sends, so recv may be written
    copy_bytes(c, recv, s.scratch.get(), bytes);
  }
  depart(c, s, false);
}

/// all_to_all's pull: block `c.rank` of every rank's send, read where that rank's post says it
/// lies (back to back, or strided), into block j of recv.
inline void pull_blocks(const Ctx& c, const Slot& s, void* recv, std::size_t block_bytes, std::size_t element_bytes) {
  for (int j = 0; j < c.group->size; ++j) {
    const Post& q = s.posts[std::size_t(j)];
    std::byte* dst = bytes_of(recv) + std::size_t(j) * block_bytes;
    if (q.strided)
      dtensor::detail::copy_strided_block(dst, q.send, q.blocks, c.rank, element_bytes,
                                          [&](std::byte* d, const std::byte* src, std::size_t n) { copy_bytes(c, d, src, n); });
    else
      copy_bytes(c, dst, bytes_of(q.send) + std::size_t(c.rank) * block_bytes, block_bytes);
  }
}

inline void all_to_all(const Ctx& c, const void* send, void* recv, std::size_t count, DType t) {
  const int n = c.group->size;
  const std::size_t block = count * size_of(t), total = block * std::size_t(n);
  std::shared_ptr<std::byte> hold;
  Post p{.kind = CollectiveKind::all_to_all, .dtype = t, .count = count,
         .send = stable_send(c, send, total, recv, total, hold), .send_bytes = total, .lent = true};
  Slot& s = rendezvous(c, p);
  pull_blocks(c, s, recv, block, size_of(t));
  depart(c, s, s.posts[std::size_t(c.rank)].lent);
}

/// all_to_all whose send blocks lie where `b` says: peers copy them straight from the strided
/// send (no packing copy). Matches plain all_to_all calls of other ranks.
inline void all_to_all_strided(const Ctx& c, const void* send, const StridedBlocks& b, void* recv, DType t) {
  const int n = c.group->size;
  const std::size_t es = size_of(t), block = b.block_elements() * es, spanned = b.extent(n) * es;
  std::shared_ptr<std::byte> hold;
  Post p{.kind = CollectiveKind::all_to_all, .dtype = t, .count = b.block_elements(),
         .send = stable_send(c, send, spanned, recv, block * std::size_t(n), hold), .send_bytes = spanned,
         .lent = true, .strided = true, .blocks = b};
  Slot& s = rendezvous(c, p);
  pull_blocks(c, s, recv, block, es);
  depart(c, s, s.posts[std::size_t(c.rank)].lent);
}

/// counts: send counts, send displacements, recv counts, recv displacements (elements, per rank).
inline void all_to_all_v(const Ctx& c, const void* send, void* recv, const std::size_t* const (&v)[4], DType t) {
  const int n = c.group->size;
  const std::size_t es = size_of(t);
  std::size_t send_extent = 0, recv_extent = 0;
  for (int r = 0; r < n; ++r) {
    send_extent = std::max(send_extent, v[1][r] + v[0][r]);
    recv_extent = std::max(recv_extent, v[3][r] + v[2][r]);
  }
  std::shared_ptr<std::byte> hold;
  // Never eager: peers also read the count arrays, which live in this rank's memory.
  Post p{.kind = CollectiveKind::all_to_all_v, .dtype = t,
         .send = stable_send(c, send, send_extent * es, recv, recv_extent * es, hold, false),
         .counts = {v[0], v[1], v[2], v[3]}, .lent = true};
  Slot& s = rendezvous(c, p);
  for (int j = 0; j < n; ++j) {
    const Post& q = s.posts[std::size_t(j)];
    copy_bytes(c, bytes_of(recv) + v[3][j] * es, bytes_of(q.send) + q.counts[1][c.rank] * es, v[2][j] * es);
  }
  depart(c, s, true);
}

inline void broadcast(const Ctx& c, void* buf, std::size_t count, DType t, int root) {
  const std::size_t bytes = count * size_of(t);
  const bool is_root = c.rank == root;
  Post p{.kind = CollectiveKind::broadcast, .dtype = t, .root = root, .count = count,
         .send = is_root ? buf : nullptr, .send_bytes = is_root ? bytes : 0, .lent = is_root};
  Slot& s = rendezvous(c, p);
  if (!is_root) copy_bytes(c, buf, s.posts[std::size_t(root)].send, bytes);
  depart(c, s, s.posts[std::size_t(c.rank)].lent);
}

inline void barrier(const Ctx& c) {
  Slot& s = rendezvous(c, Post{.kind = CollectiveKind::barrier});
  depart(c, s, false);
}

/// Ranks of equal color form a group ordered by (key, old rank). The first rank through makes
/// every new group, so each is created once and shared by its members.
inline std::pair<std::shared_ptr<Group>, int> split(const Ctx& c, int color, int key) {
  Group& g = *c.group;
  const int n = g.size;
  Slot& s = rendezvous(c, Post{.kind = CollectiveKind::split, .color = color, .key = key});
  std::pair<std::shared_ptr<Group>, int> mine{nullptr, -1};
  {
    std::lock_guard l(g.mu);
    if (s.made.empty()) {
      s.made.resize(std::size_t(n));
      s.new_rank.assign(std::size_t(n), -1);
      std::vector<int> order(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) order[std::size_t(r)] = r;
      auto ck = [&](int r) {
        const Post& q = s.posts[std::size_t(r)];
        return std::tuple(q.color, q.key, r);
      };
      std::sort(order.begin(), order.end(), [&](int a, int b) { return ck(a) < ck(b); });
      for (std::size_t i = 0; i < order.size();) {
        const int color_i = s.posts[std::size_t(order[i])].color;
        std::size_t j = i;
        while (j < order.size() && s.posts[std::size_t(order[j])].color == color_i) ++j;
        if (color_i >= 0) {
          std::vector<int> members;
          for (std::size_t k = i; k < j; ++k) members.push_back(g.world_ranks[std::size_t(order[k])]);
          auto ng = Group::make(g.world, std::move(members));
          for (std::size_t k = i; k < j; ++k) {
            s.made[std::size_t(order[k])] = ng;
            s.new_rank[std::size_t(order[k])] = int(k - i);
          }
        }
        i = j;
      }
    }
    mine = {s.made[std::size_t(c.rank)], s.new_rank[std::size_t(c.rank)]};
  }
  depart(c, s, false);
  return mine;
}

// ------------------------------------------------------------------------------ point-to-point

/// Why a send or receive fails when its peer is gone (see Departures): it can never match.
inline std::string peer_gone(const Ctx& c, int peer, const char* what, std::size_t count, DType t, int tag) {
  const Group& g = *c.group;
  return dtensor::detail::cat(rank_name(g, peer), " ", g.world->departures.how_left(g.world_ranks[std::size_t(peer)]),
                              " the function given to threads::run without ", what, " this message (", count, " x ",
                              name_of(t), ", tag ", tag, ", group '", c.label, "')");
}

/// Posts a message to `peer` and waits until it has been copied out (a zero-copy rendezvous).
/// `ticket` is the send's place in program order (World::take_ticket).
inline void send(const Ctx& c, const void* buf, std::size_t count, DType t, int peer, int tag, std::uint64_t ticket) {
  Group& g = *c.group;
  World& w = *g.world;
  WakeWord& mine = w.p2p_wake(c.world_rank());
  Message m{.buf = buf, .count = count, .dtype = t, .ticket = ticket};
  if (c.mem) c.mem->fence();  // the receiver reads buf: its contents must be there
  std::unique_lock l(w.p2p_mu);
  if (w.aborted()) throw c.error(CollectiveKind::send, w.reason());
  auto& q = w.mail[MailKey{g.id, c.rank, peer, tag}];
  q.insert(std::find_if(q.begin(), q.end(), [&](const Message* o) { return o->ticket > ticket; }), &m);
  l.unlock();
  w.p2p_wake(g.world_ranks[std::size_t(peer)]).wake();
  const auto deadline = deadline_after(c.timeout);
  auto withdraw = [&] { q.erase(std::find(q.begin(), q.end(), &m)); };
  l.lock();
  while (!m.done) {
    // Once the receiver is copying from our buffer, wait for it, come what may.
    if (!m.taken) {
      if (w.aborted()) {
        withdraw();
        throw c.error(CollectiveKind::send, w.reason());
      }
      if (w.departures.gone(g.world_ranks[std::size_t(peer)])) {
        withdraw();
        throw c.error(CollectiveKind::send, peer_gone(c, peer, "receiving", count, t, tag));
      }
      if (Clock::now() >= deadline) {
        withdraw();
        l.unlock();
        const Error e =
            c.error(CollectiveKind::send,
                    dtensor::detail::cat("timed out after ", c.timeout.count(), " ms: ", rank_name(g, peer),
                                         " did not receive (", count, " x ", name_of(t), ", tag ", tag, ")"));
        w.abort(c.world_rank(), dtensor::detail::cat("rank ", c.world_rank(), " failed: ", e.what()));
        throw e;
      }
    }
    // Read under the lock: the receiver marks `done` under it and moves our word after.
    const auto seen = mine.now();
    const bool taken = m.taken;
    l.unlock();
    mine.wait_until(seen, taken ? Clock::time_point::max() : deadline);
    l.lock();
  }
  if (!m.error.empty()) throw c.error(CollectiveKind::send, m.error);
}

/// Takes the message from `peer` with `tag` whose ticket is this receive's (the k-th receive
/// matches the k-th send), checks that it fits and copies it.
inline void recv(const Ctx& c, void* buf, std::size_t count, DType t, int peer, int tag, std::uint64_t ticket) {
  Group& g = *c.group;
  World& w = *g.world;
  WakeWord& mine = w.p2p_wake(c.world_rank());
  std::unique_lock l(w.p2p_mu);
  auto& q = w.mail[MailKey{g.id, peer, c.rank, tag}];
  const auto deadline = deadline_after(c.timeout);
  auto it = q.end();
  for (;;) {
    if (w.aborted()) throw c.error(CollectiveKind::recv, w.reason());
    it = std::find_if(q.begin(), q.end(), [&](const Message* o) { return o->ticket == ticket; });
    if (it != q.end()) break;
    if (w.departures.gone(g.world_ranks[std::size_t(peer)]))
      throw c.error(CollectiveKind::recv, peer_gone(c, peer, "sending", count, t, tag));
    if (Clock::now() >= deadline) {
      l.unlock();
      const Error e = c.error(CollectiveKind::recv,
                              dtensor::detail::cat("timed out after ", c.timeout.count(), " ms: ", rank_name(g, peer),
                                                   " did not send (", count, " x ", name_of(t), ", tag ", tag, ")"));
      w.abort(c.world_rank(), dtensor::detail::cat("rank ", c.world_rank(), " failed: ", e.what()));
      throw e;
    }
    // Read under the lock: a sender posts under it and moves our word after.
    const auto seen = mine.now();
    l.unlock();
    mine.wait_until(seen, deadline);
    l.lock();
  }
  Message* m = *it;
  q.erase(it);
  m->taken = true;
  l.unlock();
  std::string error;
  if (m->count != count || m->dtype != t)
    error = dtensor::detail::cat("rank ", peer, " sent ", m->count, " x ", name_of(m->dtype), " to rank ", c.rank,
                                 ", which expected ", count, " x ", name_of(t), " (tag ", tag, ")");
  else
    copy_bytes(c, buf, m->buf, count * size_of(t));
  if (c.mem) c.mem->fence();  // the sender may reuse its buffer once we say done
  l.lock();
  m->error = error;
  m->done = true;  // from here on `m` may be gone: the sender returns when it sees this
  l.unlock();
  w.p2p_wake(g.world_ranks[std::size_t(peer)]).wake();
  if (!error.empty()) throw c.error(CollectiveKind::recv, error);
}

}  // namespace dtensor::threads::detail
