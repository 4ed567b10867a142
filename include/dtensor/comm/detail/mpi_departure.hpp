// dtensor/comm/detail/mpi_departure.hpp — internals of the MPI backend: how a rank that returns
// from the function given to mpi::run tells the others, so that a rank waiting for it in an
// operation it will never join fails at once, naming it, instead of at the timeout (300 s by
// default). Included by dtensor/comm/mpi.hpp and mpi_request.hpp only.
//
// MPI cannot tell that a process has left its function: its peers wait in a collective it will
// never call. So each process counts the collectives it issues on each communicator (Tally), by
// an id every member computes alike (MPI_COMM_WORLD is 1; a split's id mixes its parent's id,
// the parent's collective count at the split and the color). When mpi::run's function returns,
// the rank sends every other rank a notice on a channel of its own (a duplicate of
// MPI_COMM_WORLD): its counts. A rank waiting in collective #k of a communicator reads the
// notices while it polls; a departed member that issued fewer than k collectives there will
// never join, and the wait fails with an Error naming it. A departed member that did issue #k
// (it finished its part; the others' completion is under way) is no reason to fail, nor is a
// departed rank that is not a member. A point-to-point operation with a departed peer fails
// one second after the notice (a message already sent has arrived by then).
//
// The notices cost nothing while ranks run (no message until a rank leaves; a probe per
// millisecond of waiting). At the end every rank waits for the others' notices before
// MPI_Finalize: a barrier, which MPI_Finalize is in practice anyway.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/comm/detail/mpi_types.hpp"

namespace dtensor::mpi::detail {

/// The collectives this process issued on each tracked communicator, by communicator id.
class Tally {
 public:
  static Tally& get() {
    static Tally t;
    return t;
  }

  /// The id of `comm`: set by name() on a split, 1 for MPI_COMM_WORLD, 0 (untracked) otherwise.
  std::uint64_t id_of(MPI_Comm comm) {
    std::lock_guard lock(mu_);
    if (!ensure_keyval()) return 0;
    void* value = nullptr;
    int flag = 0;
    if (MPI_Comm_get_attr(comm, keyval_, &value, &flag) == MPI_SUCCESS && flag)
      return std::uint64_t(reinterpret_cast<std::uintptr_t>(value));
    if (comm != MPI_COMM_WORLD) return 0;
    set(comm, world_id);
    return world_id;
  }
  /// Gives a new communicator its id (every member passes the same one).
  void name(MPI_Comm comm, std::uint64_t id) {
    std::lock_guard lock(mu_);
    if (ensure_keyval()) set(comm, id);
  }
  /// Counts one collective on `id`; returns its number (1 for the first).
  std::uint64_t issue(std::uint64_t id) {
    std::lock_guard lock(mu_);
    return ++issued_[id];
  }
  std::uint64_t issued(std::uint64_t id) {
    std::lock_guard lock(mu_);
    return issued_[id];
  }
  /// The id of the group that split(color) of the communicator `parent` makes, after
  /// `parent_count` collectives on the parent: the same on every member of the new group.
  static std::uint64_t child_id(std::uint64_t parent, std::uint64_t parent_count, int color) {
    std::uint64_t h = 14695981039346656037ull;
    for (std::uint64_t v : {parent, parent_count, std::uint64_t(std::uint32_t(color))})
      for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
    return h < 2 ? h + 2 : h;  // 0 means untracked, 1 is the world
  }
  /// (id, count) pairs of every communicator this process tracked, freed ones included.
  std::vector<std::uint64_t> snapshot() {
    std::lock_guard lock(mu_);
    std::vector<std::uint64_t> out;
    for (const auto& [id, n] : issued_) out.insert(out.end(), {id, n});
    return out;
  }

  static constexpr std::uint64_t world_id = 1;

 private:
  bool ensure_keyval() {
    if (keyval_ != MPI_KEYVAL_INVALID) return true;
    return MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &keyval_, nullptr) == MPI_SUCCESS;
  }
  void set(MPI_Comm comm, std::uint64_t id) {
    // The attribute is pointer-sized: the id itself, not a pointer.
    MPI_Comm_set_attr(comm, keyval_, reinterpret_cast<void*>(std::uintptr_t(id)));
    issued_.try_emplace(id, 0);  // a member that never issues on it still reports 0 there
  }

  std::mutex mu_;
  int keyval_ = MPI_KEYVAL_INVALID;
  std::map<std::uint64_t, std::uint64_t> issued_;
};

/// The channel of departure notices, open while mpi::run's function runs.
class Departures {
 public:
  using Clock = std::chrono::steady_clock;
  /// How long a point-to-point operation may still complete after its peer's notice.
  static constexpr std::chrono::milliseconds p2p_grace{1000};

  static Departures& get() {
    static Departures d;
    return d;
  }
  bool active() const noexcept { return active_.load(std::memory_order_acquire); }

  /// Collective over MPI_COMM_WORLD: every process calls it at the start of mpi::run.
  void open() {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &chan_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(chan_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm_rank(chan_, &rank_);
    MPI_Comm_size(chan_, &size_);
    active_.store(true, std::memory_order_release);
  }

  /// This rank has returned from mpi::run's function: tells every other rank what it issued,
  /// then waits until every other rank has left too (their notices), and closes the channel.
  void leave() {
    if (!active()) return;
    const std::vector<std::uint64_t> mine = Tally::get().snapshot();
    std::vector<MPI_Request> sends;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request q = MPI_REQUEST_NULL;
      check(MPI_Isend(mine.data(), int(mine.size()), MPI_UINT64_T, r, tag, chan_, &q), "MPI_Isend");
      sends.push_back(q);
    }
    // A rank still working reads this notice when it next waits; here we wait for all of theirs.
    for (int idle = 0; int(departed_.size()) < size_ - 1;) {
      if (receive()) idle = 0;
      else if (++idle < 1000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    check(MPI_Waitall(int(sends.size()), sends.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    active_.store(false, std::memory_order_release);
    MPI_Comm_free(&chan_);
  }

  /// Why the operation `info` (issued as collective number info.seq of its communicator, or a
  /// send or recv with info.peer) can never complete, given the notices received so far; empty
  /// if it still can.
  std::string blocked(const OpInfo& info) {
    while (receive()) {
    }
    if (departed_.empty()) return {};
    if (info.comm_id != 0 && info.seq != 0) {
      for (const auto& [who, tallies] : departed_) {
        const auto it = tallies.find(info.comm_id);
        if (it != tallies.end() && it->second < info.seq)
          return dtensor::detail::cat("world rank ", who,
                                      " returned from the function given to mpi::run without calling this collective",
                                      " (collective #", info.seq, " of this group, counting the collective check's; it",
                                      " issued ", it->second, "), so the others cannot complete it");
      }
      return {};
    }
    if (info.peer < 0 || info.comm == MPI_COMM_NULL) return {};
    const int peer = world_rank_of(info.comm, info.peer);
    const auto when = noticed_.find(peer);
    if (when == noticed_.end() || Clock::now() - when->second < p2p_grace) return {};
    return dtensor::detail::cat("world rank ", peer, " returned from the function given to mpi::run without ",
                                std::string_view(info.op) == "recv" ? "sending" : "receiving",
                                " this message (peer ", info.peer, " of this group)");
  }

 private:
  static constexpr int tag = 7;

  static void check(int rc, const char* call) {
    if (rc != MPI_SUCCESS)
      throw Error("mpi::run", dtensor::detail::cat(call, " failed on the departure channel: ", error_string(rc)),
                  Error::no_rank, rc);
  }

  /// Receives one notice if one has arrived.
  bool receive() {
    int flag = 0;
    MPI_Status st;
    check(MPI_Iprobe(MPI_ANY_SOURCE, tag, chan_, &flag, &st), "MPI_Iprobe");
    if (!flag) return false;
    int n = 0;
    check(MPI_Get_count(&st, MPI_UINT64_T, &n), "MPI_Get_count");
    std::vector<std::uint64_t> pairs(std::size_t(n < 0 ? 0 : n));
    check(MPI_Recv(pairs.data(), n, MPI_UINT64_T, st.MPI_SOURCE, tag, chan_, MPI_STATUS_IGNORE), "MPI_Recv");
    auto& tallies = departed_[st.MPI_SOURCE];
    for (std::size_t i = 0; i + 1 < pairs.size(); i += 2) tallies[pairs[i]] = pairs[i + 1];
    noticed_[st.MPI_SOURCE] = Clock::now();
    return true;
  }

  static int world_rank_of(MPI_Comm comm, int rank) {
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int out = MPI_UNDEFINED;
    if (MPI_Comm_group(comm, &group) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS)
      MPI_Group_translate_ranks(group, 1, &rank, world, &out);
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
    return out;
  }

  std::atomic<bool> active_{false};
  MPI_Comm chan_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::map<int, std::map<std::uint64_t, std::uint64_t>> departed_;  // world rank -> its counts
  std::map<int, Clock::time_point> noticed_;
};

}  // namespace dtensor::mpi::detail
