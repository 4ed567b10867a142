// dtensor/sim/activation_offload.hpp — activation offload in the dry run: the bytes on each tier,
// the transfers per step at a stated bandwidth, and how much of them the next block's compute hides.
//
//   sim::ActivationOffloadInput in{.saved_per_block = s, .blocks = 12, .microbatches = 8, .held = 4,
//                                  .forward_seconds = f, .backward_seconds = b};
//   auto r = sim::activation_offload(in, {.bytes_per_second = 25e9});   // PCIe to host (or a disk's rate)
//   r.tier_bytes; r.compute_saved_bytes; r.exposed_seconds; r.hidden();  r.to_string();
//
// The model of nn::ActivationOffload (nn/activation_offload.hpp), per rank:
//   tier     every micro-batch in flight keeps all its blocks' saved state there: held × blocks ×
//            saved_per_block (the runtime's ledger: the tier's peak, tested equal);
//   compute  two blocks' saved state (the one written behind while the next computes, or the one
//            in use while the previous one is read ahead) instead of held × blocks of them;
//   traffic  each block written once after its forward and read once before its backward: 2 ×
//            microbatches × blocks × saved_per_block a step (an upper bound: the runtime skips the
//            read of a block whose backward directly follows its write, stats().kept);
//   overlap  block l's write runs under block l+1's forward, block l-1's read under block l's
//            backward: per micro-batch (blocks − 1) × (max(0, t − forward) + max(0, t − backward))
//            is exposed, t = saved_per_block / bytes_per_second (the last block's write runs under
//            the head; the last block's read is not needed).
// Not modelled: contention of the transfers with the compute for memory bandwidth, and the
// pinned-memory staging of a device tier (the runtime's device path stages through host memory).
#pragma once

#include <algorithm>
#include <sstream>
#include <string>

#include "dtensor/core/error.hpp"

namespace dtensor::sim {

/// One rank's blocks and what they save, with their compute times (a cost model's or measured).
struct ActivationOffloadInput {
  double saved_per_block = 0;   // bytes one block saves for its backward, per micro-batch
  int blocks = 1;               // the blocks of this rank (its stages') that offload
  int microbatches = 1;         // micro-batches per step
  int held = 1;                 // micro-batches in flight at once (the schedule's peak: 1F1B p - rank)
  double forward_seconds = 0;   // one block's forward, one micro-batch
  double backward_seconds = 0;  // one block's backward (input and weight gradients), one micro-batch
};

struct ActivationOffloadLink {
  double bytes_per_second = 25e9;  // PCIe 4 x16 achieved to host memory; a local NVMe drive: ~6e9
};

struct ActivationOffloadReport {
  double tier_bytes = 0;           // on the host or the disk at the peak
  double compute_saved_bytes = 0;  // saved activations left in compute memory at the peak
  double compute_drop = 0;         // what the offload takes off the compute memory's peak
  double bytes_per_step = 0;       // written plus read
  double io_seconds = 0;           // the transfers' own time per step
  double exposed_seconds = 0;      // of it, not hidden behind a block's compute
  /// The share of the transfer time hidden behind the compute (1: all of it).
  double hidden() const { return io_seconds > 0 ? 1 - exposed_seconds / io_seconds : 1; }
  std::string to_string() const {
    std::ostringstream s;
    auto gib = [](double b) { return b / double(1 << 30); };
    s.precision(4);
    s << "activation offload: tier " << gib(tier_bytes) << " GiB, compute keeps " << gib(compute_saved_bytes)
      << " GiB of saved activations (" << gib(compute_drop) << " GiB less at the peak); per step " << gib(bytes_per_step)
      << " GiB moved in " << io_seconds << " s, " << exposed_seconds << " s of it exposed (" << 100 * hidden()
      << "% hidden)";
    return s.str();
  }
};

/// The model at the top of this file.
inline ActivationOffloadReport activation_offload(const ActivationOffloadInput& in, const ActivationOffloadLink& link) {
  if (!(in.saved_per_block >= 0) || in.blocks < 1 || in.microbatches < 1 || in.held < 1 || in.held > in.microbatches ||
      !(in.forward_seconds >= 0) || !(in.backward_seconds >= 0) || !(link.bytes_per_second > 0))
    throw Error("sim::activation_offload",
                dtensor::detail::cat("saved per block ", in.saved_per_block, " B, blocks ", in.blocks, ", micro-batches ",
                                     in.microbatches, ", held ", in.held, ", forward ", in.forward_seconds,
                                     " s, backward ", in.backward_seconds, " s, ", link.bytes_per_second,
                                     " B/s: need bytes and times >= 0, blocks >= 1, 1 <= held <= micro-batches, "
                                     "a positive bandwidth"));
  ActivationOffloadReport r;
  const double s = in.saved_per_block, blocks = in.blocks, m = in.microbatches;
  r.tier_bytes = double(in.held) * blocks * s;
  r.compute_saved_bytes = std::min(2.0, double(in.held) * blocks) * s;
  r.compute_drop = r.tier_bytes - r.compute_saved_bytes;
  r.bytes_per_step = 2 * m * blocks * s;
  r.io_seconds = r.bytes_per_step / link.bytes_per_second;
  const double t = s / link.bytes_per_second;
  const double exposed_per_block = std::max(0.0, t - in.forward_seconds) + std::max(0.0, t - in.backward_seconds);
  // The last block's write runs under the head and its read is skipped: the other blocks - 1 show.
  r.exposed_seconds = m * (blocks - 1) * exposed_per_block;
  return r;
}

}  // namespace dtensor::sim
