// dtensor/optim/memory_budget.hpp — a memory budget a training run respects: checked on the
// ledger before training and over its first step, every rank agreeing (issue 27; docs/offload.md).
//
//   optim::MemoryBudget budget{.space = "host", .bytes = 256 << 20, .ranks_sharing = world->size()};
//   budget.buffer_for_offload(64 << 20);           // the staging buffer that fits beside what is held
//   budget.check(*world, "after building the model and optimizer", "--offload optimizer moves ...");
//   { MemoryLedger step; train_step(); budget.check_step(*world, step, held_before); }
//
// The ledger (core/memory_ledger.hpp) counts the bytes of every Tensor of the process by space.
// A budget is per process: its ranks_sharing ranks (all of them on the threads backend, one under
// mpirun) draw from it together. check() compares the process's bytes held now; check_step()
// the most it can have held during a step: what it held before plus every local rank's own
// peak in the step (each rank's ledger scope sees its own thread's allocations; their sum bounds
// the process's peak from above). Either throws a dtensor::Error on every rank when any rank's
// process is over — they agree through one all-reduce, so no rank trains on alone and nothing
// hangs — naming the space, the budget, the bytes held (by tag), the ranks over and a hint.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory_ledger.hpp"

namespace dtensor::optim {

struct MemoryBudget {
  std::string space = "host";  // the ledger's space name: host, cuda
  std::int64_t bytes = 0;      // 0: no budget
  int ranks_sharing = 1;       // the ranks of this process (they share the budget)

  bool active() const noexcept { return bytes > 0; }

  /// The bytes the process holds in the space now (every tag).
  std::int64_t held() const { return memory_totals().current(space); }

  /// A disk offload's staging buffer per rank: a quarter of what the budget leaves beside what
  /// the process holds now, shared by its ranks (three quarters for the step's gradient buckets
  /// and activations, which in the trainer come to about the parameters' bytes), at most
  /// `wanted`, and at least `minimum` (a budget too small for even that is then found by check()).
  std::size_t buffer_for_offload(std::size_t wanted, std::size_t minimum) const {
    if (!active()) return wanted;
    const std::int64_t free = std::max<std::int64_t>(0, bytes - held());
    const auto share = std::size_t(free / 4 / std::max(1, ranks_sharing));
    return std::clamp(share, minimum, std::max(minimum, wanted));
  }

  /// Every rank of `comm` together: throws on all of them when any process holds more than the
  /// budget now. `when` names the moment, `hint` what would fit.
  void check(Communicator& comm, std::string_view when, std::string_view hint) const {
    if (!active()) return;
    agree(comm, held(), when, hint);
  }

  /// After a step run inside `step` (this rank's ledger scope): the process held at most
  /// `held_before` plus the sum of its ranks' step peaks; throws on every rank when that is over.
  void check_step(Communicator& comm, const MemoryLedger& step, std::int64_t held_before, std::string_view hint) const {
    if (!active()) return;
    std::vector<std::int64_t> peaks(std::size_t(comm.size()), 0);
    peaks[std::size_t(comm.rank())] = std::max<std::int64_t>(0, step.peak(space));
    comm.all_reduce(std::span<std::int64_t>(peaks), ReduceOp::sum);
    // The ranks of this process: all of them when they share it (threads), this one otherwise.
    std::int64_t mine = 0;
    if (ranks_sharing == comm.size())
      for (auto p : peaks) mine += p;
    else
      mine = peaks[std::size_t(comm.rank())] * ranks_sharing;
    agree(comm, held_before + mine, "in the first training step", hint);
  }

 private:
  void agree(Communicator& comm, std::int64_t process_bytes, std::string_view when, std::string_view hint) const {
    std::vector<std::int64_t> over(std::size_t(comm.size()), 0);
    over[std::size_t(comm.rank())] = process_bytes > bytes ? process_bytes : 0;
    comm.all_reduce(std::span<std::int64_t>(over), ReduceOp::sum);
    std::string ranks;
    std::int64_t most = 0;
    for (std::size_t r = 0; r < over.size(); ++r)
      if (over[r] > 0) {
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        most = std::max(most, over[r]);
      }
    if (ranks.empty()) return;
    std::string tags;
    for (std::size_t t = 0; t < memory_tag_count; ++t)
      if (const auto b = memory_totals().current(space, MemoryTag(t)); b > 0)
        tags += dtensor::detail::cat(tags.empty() ? "" : ", ", name_of(MemoryTag(t)), " ", mib(b));
    throw Error("memory budget",
                dtensor::detail::cat(space, " memory ", when, ": ", mib(most), " held, over the budget of ", mib(bytes),
                                     " per process (", ranks_sharing, " rank(s) each), on rank(s) ", ranks, " of ",
                                     comm.size(), "; this process holds now: ", tags.empty() ? "nothing" : tags,
                                     hint.empty() ? "" : "; ", hint),
                comm.rank());
  }

  static std::string mib(std::int64_t b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.3f MiB", double(b) / (1 << 20));
    return s;
  }
};

}  // namespace dtensor::optim
