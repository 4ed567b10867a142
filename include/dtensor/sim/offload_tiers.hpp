// dtensor/sim/offload_tiers.hpp — where a rank's bytes live under offload (device, host, NVMe),
// and what moving them costs per step: ZeRO-Offload's and ZeRO-Infinity's tiers for a dry run.
//
//   auto states = sim::zero_state_bytes(psi, /*shards=*/64, /*stage=*/3, /*param_bytes=*/2);  // the papers' forms
//   sim::TierInput in{.states = states, .activations_peak = a, .saved_activations = s, .blocks = 96};
//   auto r = sim::offload_tiers(in, {.offload = sim::parse_offload("optimizer,params")});
//   r.bytes.device; r.bytes.host; r.bytes.disk;   // per rank
//   r.disk_seconds; r.pcie_seconds;               // the step's transfers at the stated bandwidths
//   std::cout << r.to_string();
//   auto in2 = sim::tier_input_of(report, peak_in_flight, /*separate_master=*/true);  // a dry run's rank class
//   sim::exposed_transfer_seconds(r, compute_seconds);  // what prefetch and write-behind cannot hide
//
// The model states of one rank between steps (Rajbhandari et al., ZeRO, 2020, and ZeRO-Infinity,
// 2021: K = 12 bytes of fp32 optimizer state per parameter in mixed precision) split in four:
// the model's parameters in its dtype, the gradients the optimizer reads, the fp32 master values
// and AdamW's two fp32 moments. zero_state_bytes() gives the papers' forms for this library's
// fully_shard<float> (docs/fsdp.md, "Memory per rank": stage 3 keeps no separate bf16 copy; an
// fp32 model's master is its parameter); from_ledger() reads them from a dry run's ledger instead.
//
// What each offload moves (the library's own mechanisms; docs/offload.md):
//   optimizer    the moments to disk (optim::OffloadedAdamW), the master values and the fp32
//                gradient shard to the host, the update on the host (ZeRO-Offload's split).
//                Per step: the moments read and written (disk), the gradient shard down and the
//                updated shard up (PCIe).
//   params       the master values (stage 3: the parameter shard itself) to disk. Per step: read
//                and written by the update, and read before each unit's forward and backward
//                (the all-gather's source) — 4 passes.
//   activations  the saved activations of every block to the host after its forward; the device
//                keeps the rest of the peak and two blocks' saved bytes (the one in use and the
//                next one prefetched). Per step: down and up once (PCIe).
// A disk offload adds the host staging buffer (buffer_bytes, its two halves) to the host.
// Every byte is on exactly one tier: device + host + disk = the total without offload + buffer.
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/sim/report.hpp"

namespace dtensor::sim {

/// What is offloaded (a comma list of optimizer, params, activations).
struct OffloadSet {
  bool optimizer = false, params = false, activations = false;
  bool any() const { return optimizer || params || activations; }
  bool disk() const { return optimizer || params; }
  std::string to_string() const {
    std::string s;
    for (auto [on, name] : {std::pair{optimizer, "optimizer"}, {params, "params"}, {activations, "activations"}})
      if (on) s += (s.empty() ? "" : ",") + std::string(name);
    return s.empty() ? "none" : s;
  }
};

/// "optimizer,params" → the set; an unknown or empty item is an Error naming it.
inline OffloadSet parse_offload(std::string_view list) {
  OffloadSet s;
  std::size_t at = 0;
  while (at <= list.size()) {
    const auto end = std::min(list.find(',', at), list.size());
    const auto item = list.substr(at, end - at);
    if (item == "optimizer") s.optimizer = true;
    else if (item == "params") s.params = true;
    else if (item == "activations") s.activations = true;
    else
      throw Error("sim::parse_offload", dtensor::detail::cat("'", item, "' in '", list,
                                                             "' is not one of optimizer, params, activations"));
    at = end + 1;
  }
  return s;
}

/// One rank's model states between steps, in bytes.
struct ModelStateBytes {
  double params = 0;   // the model's parameters held between steps (its dtype)
  double grads = 0;    // the gradients the optimizer reads (the fp32 shard under ZeRO-2/3)
  double master = 0;   // fp32 master values apart from the parameters (0 when they are the master)
  double moments = 0;  // AdamW's two fp32 moments
  double total() const { return params + grads + master + moments; }
};

/// The papers' bytes for `psi` parameters over `shards` ranks at ZeRO `stage` (0: DDP) with the
/// model in `param_bytes` (4: fp32, 2: bf16) and fp32 master, gradient shard and moments, as
/// fully_shard<float> holds them: fp32 16 / 8+8/N / 4+12/N / 16/N, bf16 16 / 4+12/N / 2+14/N / 16/N.
inline ModelStateBytes zero_state_bytes(double psi, int shards, int stage, int param_bytes) {
  if (!(psi >= 0) || shards < 1 || stage < 0 || stage > 3 || (param_bytes != 2 && param_bytes != 4))
    throw Error("sim::zero_state_bytes", dtensor::detail::cat("psi ", psi, ", shards ", shards, ", stage ", stage,
                                                              ", param_bytes ", param_bytes,
                                                              ": need psi >= 0, shards >= 1, stage 0..3, 2 or 4 bytes"));
  const double p = param_bytes, n = stage == 0 ? 1 : double(shards);
  ModelStateBytes s;
  s.moments = 8 * psi / n;
  if (stage == 3) {  // the fp32 master shard is the parameter between steps; the gradient shard fp32
    s.master = 4 * psi / n;
    s.grads = 4 * psi / n;
    return s;
  }
  s.params = p * psi;
  s.master = p == 4 ? 0 : 4 * psi / n;  // an fp32 model's shard is a view of its parameters
  // Stage 0/1: the full gradients in the model's type; stage 2: the shard (bf16: ZeRO's own bf16 one).
  s.grads = stage == 2 ? p * psi / n : p * psi;
  return s;
}

/// Bytes per tier.
struct TierBytes {
  double device = 0, host = 0, disk = 0;
  double total() const { return device + host + disk; }
};

/// One rank: its model states, its activations and the blocks they are saved by.
struct TierInput {
  ModelStateBytes states;
  double activations_peak = 0;   // the most activation bytes held at once in the step
  double saved_activations = 0;  // what the forward leaves saved for the backward (part of the peak)
  int blocks = 1;                // the blocks that save them (activation offload moves one at a time)
  double other = 0;              // everything else the device holds at the peak (buffers, workspace)
};

struct TierOptions {
  OffloadSet offload;
  double buffer_bytes = 64.0 * (1 << 20);  // the host staging buffer of a disk offload
  double disk_bytes_per_second = 6e9;      // one PCIe 4 NVMe drive's sequential rate, per rank
  double pcie_bytes_per_second = 25e9;     // host <-> device, per GPU and direction (PCIe 4 x16, achieved)
};

struct TierReport {
  TierBytes bytes;
  double disk_bytes_per_step = 0, pcie_bytes_per_step = 0;
  double disk_seconds = 0, pcie_seconds = 0;
  OffloadSet offload;

  std::string to_string() const {
    std::ostringstream s;
    auto gib = [](double b) { return b / double(1 << 30); };
    s.precision(4);
    s << "offload " << offload.to_string() << ": device " << gib(bytes.device) << " GiB, host " << gib(bytes.host)
      << " GiB, disk " << gib(bytes.disk) << " GiB per rank; per step disk " << gib(disk_bytes_per_step) << " GiB ("
      << disk_seconds << " s), PCIe " << gib(pcie_bytes_per_step) << " GiB (" << pcie_seconds << " s)";
    return s.str();
  }
};

/// The tiers of one rank under `o` (see the top of this file).
inline TierReport offload_tiers(const TierInput& in, const TierOptions& o) {
  const auto& st = in.states;
  if (in.blocks < 1 || !(in.saved_activations >= 0) || in.saved_activations > in.activations_peak ||
      !(o.buffer_bytes >= 0) || !(o.disk_bytes_per_second > 0) || !(o.pcie_bytes_per_second > 0))
    throw Error("sim::offload_tiers",
                dtensor::detail::cat("blocks ", in.blocks, ", saved activations ", in.saved_activations, " of peak ",
                                     in.activations_peak, ", buffer ", o.buffer_bytes, ", disk ", o.disk_bytes_per_second,
                                     " B/s, PCIe ", o.pcie_bytes_per_second,
                                     " B/s: need blocks >= 1, saved <= peak, positive bandwidths"));
  TierReport r;
  r.offload = o.offload;
  auto& b = r.bytes;
  b.device = st.params + in.activations_peak + in.other;
  // The states the optimizer reads: on the device unless the optimizer runs on the host.
  if (o.offload.optimizer) {
    b.disk += st.moments;
    b.host += st.grads;
    r.disk_bytes_per_step += 2 * st.moments;                         // read and written by the update
    r.pcie_bytes_per_step += st.grads + st.moments / 2;  // the gradients down, the updated fp32 shard up
  } else {
    b.device += st.moments + st.grads;
  }
  if (o.offload.params) {
    b.disk += st.master;
    r.disk_bytes_per_step += 4 * st.master;  // update read + write, forward and backward reads
  } else if (o.offload.optimizer) {
    b.host += st.master;
  } else {
    b.device += st.master;
  }
  if (o.offload.disk()) b.host += o.buffer_bytes;
  if (o.offload.activations) {
    const double kept = std::min(in.saved_activations, 2 * in.saved_activations / in.blocks);
    const double moved = in.saved_activations - kept;
    b.device -= moved;
    b.host += moved;
    r.pcie_bytes_per_step += 2 * moved;
  }
  r.disk_seconds = r.disk_bytes_per_step / o.disk_bytes_per_second;
  r.pcie_seconds = r.pcie_bytes_per_step / o.pcie_bytes_per_second;
  return r;
}

/// A dry run's rank class (plan_at_scale) as the tiers' input. The states between steps from its
/// report: the optimizer_state tag's bytes split into master and moments as from_ledger does
/// (`separate_master`: fully_shard<float> with a master apart from the model's values), and the
/// parameters and gradients the optimizer phase holds ("optimizer": what the update reads; ZeRO-3
/// has released the full values by then). The rest of `peak_in_flight` (the step's peak with its
/// in-flight micro-batches) is activations and buffers: activations_peak, none of it counted as
/// saved (activation offload is modelled by its own inputs).
inline TierInput tier_input_of(const RankReport& r, double peak_in_flight, bool separate_master) {
  TierInput in;
  const double states = double(r.peak(MemoryTag::optimizer_state));
  in.states.master = separate_master ? states / 3 : 0;
  in.states.moments = states - in.states.master;
  for (const auto& ph : r.phases)
    if (ph.name == "optimizer") {
      in.states.params = double(ph.peak[std::size_t(MemoryTag::parameters)]);
      in.states.grads = double(ph.peak[std::size_t(MemoryTag::gradients)]);
    }
  in.activations_peak = std::max(0.0, peak_in_flight - in.states.total());
  return in;
}

/// The part of the step's transfers that compute cannot hide: prefetch (reads before each unit's
/// use) and write-behind run beside `compute_seconds` of the step's compute, the disk and PCIe
/// links at once, so the exposed time is what the longer of the two exceeds it by (0: all hidden).
/// An upper bound on the hiding: the optimizer's own update waits for its first chunk.
inline double exposed_transfer_seconds(const TierReport& r, double compute_seconds) {
  return std::max(0.0, std::max(r.disk_seconds, r.pcie_seconds) - std::max(0.0, compute_seconds));
}

/// A rank's model states from a dry run's (or a real run's) ledger, held between steps in the
/// space `space`: parameters and gradients by tag, and the optimizer_state tag split into the fp32
/// master (4 bytes of each 12 under fully_shard<float>, where the ledger counts master values as
/// optimizer state) and the moments (8 of 12); `separate_master` false: the tag holds moments only
/// (AdamW straight on the parameters, DDP).
inline ModelStateBytes from_ledger(const MemoryLedger& ledger, std::string_view space, bool separate_master) {
  ModelStateBytes s;
  s.params = double(ledger.current(space, MemoryTag::parameters));
  s.grads = double(ledger.current(space, MemoryTag::gradients));
  const double states = double(ledger.current(space, MemoryTag::optimizer_state));
  s.master = separate_master ? states / 3 : 0;
  s.moments = states - s.master;
  return s;
}

}  // namespace dtensor::sim
