// dtensor/parallel/sync/traffic.hpp — which synchronization a data dimension runs, and the
// all-reduce bytes it costs per training step (the dry run's figure for each strategy).
//
//   auto kind = sync::parse_sync("diloco");                         // ddp, local-sgd, diloco, async, fedavg
//   double b = sync::payload_bytes_per_step(kind, elements, 4, {.inner_steps = 50});
//   double wire = sync::ring_bytes(b, replicas);                   // what one rank sends: 2(n-1)/n of it
//
// Per rank and step, for E local elements of S bytes over n replicas (payload; a ring all-reduce
// sends and receives 2(n − 1)/n of it):
//   ddp, async    E·S            one gradient all-reduce every step (async: issued s steps earlier)
//   local-sgd     E·S / H        one parameter average every H steps
//   diloco        E·S' / H       S' = 2 with bf16_reduce, else S; fragments change the peak, not the mean
//   fedavg        (E + 1)·S / L  one weighted average (values and weight) per round of L local steps
//
// sync_step_cost adds time: per strategy (SyncSetting: H, fragments F, overlap τ, staleness s,
// bf16) the mean and peak payload per step, the all-reduce seconds and the exposed seconds, from
// DDP's timing in the dry run (SyncTiming); plan_at_scale --sync-table prints it per strategy.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"

namespace dtensor::parallel::sync {

enum class SyncKind { ddp, local_sgd, diloco, async, fedavg };

inline std::string_view to_string(SyncKind k) {
  switch (k) {
    case SyncKind::ddp: return "ddp";
    case SyncKind::local_sgd: return "local-sgd";
    case SyncKind::diloco: return "diloco";
    case SyncKind::async: return "async";
    case SyncKind::fedavg: return "fedavg";
  }
  return "?";
}

inline SyncKind parse_sync(std::string_view s) {
  for (SyncKind k : {SyncKind::ddp, SyncKind::local_sgd, SyncKind::diloco, SyncKind::async, SyncKind::fedavg})
    if (s == to_string(k)) return k;
  throw Error("parse_sync", "unknown synchronization \"" + std::string(s) + "\" (ddp, local-sgd, diloco, async, fedavg)");
}

struct SyncCost {
  int inner_steps = 1;        // H (local-sgd, diloco) or local steps per round (fedavg)
  bool bf16_reduce = false;   // diloco's outer all-reduce in bfloat16
};

/// The all-reduce payload one rank contributes per step, averaged over a round (bytes).
inline double payload_bytes_per_step(SyncKind k, std::size_t elements, std::size_t element_bytes, SyncCost c = {}) {
  if (c.inner_steps < 1) throw Error("payload_bytes_per_step", "inner_steps must be >= 1");
  const double e = double(elements), s = double(element_bytes), h = double(c.inner_steps);
  switch (k) {
    case SyncKind::ddp:
    case SyncKind::async: return e * s;
    case SyncKind::local_sgd: return e * s / h;
    case SyncKind::diloco: return e * (c.bf16_reduce ? 2.0 : s) / h;
    case SyncKind::fedavg: return (e + 1) * s / h;
  }
  return 0;
}

/// One strategy with its settings, for the dry run's per-strategy comparison (plan_at_scale
/// --sync-table, docs/beyond-sync.md).
struct SyncSetting {
  SyncKind kind = SyncKind::ddp;
  int inner_steps = 1;      // H (local-sgd, diloco) or L local steps per round (fedavg)
  int fragments = 1;        // Streaming DiLoCo: F staggered pieces
  int overlap_steps = 0;    // Streaming DiLoCo: τ, the steps a piece's all-reduce hides behind
  int staleness = 0;        // async: s
  bool bf16_reduce = false; // diloco: the outer all-reduce in bfloat16
};

/// DDP's step on the replica dimension, from the dry run: its gradient all-reduce of E·S bytes
/// takes `reduce_seconds`, of which `exposed_seconds` are not hidden behind the backward pass;
/// `compute_seconds` is the rest of the step (what a later-waited all-reduce can hide behind).
struct SyncTiming {
  double reduce_seconds = 0, exposed_seconds = 0, compute_seconds = 0;
};

/// Per rank and step, averaged over a round: the all-reduce payload (mean, and the most one step
/// carries), the all-reduce time and the part of it the step waits for.
struct SyncStepCost {
  double payload_bytes = 0, peak_payload_bytes = 0;
  double comm_seconds = 0, exposed_seconds = 0;
  double step_seconds = 0;  // compute + exposed
};

/// The model: an all-reduce's time is linear in its bytes (DDP's E·S in reduce_seconds; the
/// latency of the smaller messages is not modelled). The outer syncs of local SGD, DiLoCo and
/// FedAvg run after the optimizer step, blocking; Streaming DiLoCo's τ and async's s let a sync
/// be waited for τ (s) steps after its issue, hiding behind that much compute.
inline SyncStepCost sync_step_cost(const SyncSetting& k, std::size_t elements, std::size_t element_bytes, SyncTiming t) {
  if (k.inner_steps < 1 || k.fragments < 1 || k.fragments > k.inner_steps || k.overlap_steps < 0 ||
      k.overlap_steps >= k.inner_steps || k.staleness < 0 || elements == 0 || element_bytes == 0)
    throw Error("sync_step_cost", "needs H >= 1, 1 <= F <= H, 0 <= tau < H, s >= 0 and elements; got H = " +
                                      std::to_string(k.inner_steps) + ", F = " + std::to_string(k.fragments) + ", tau = " +
                                      std::to_string(k.overlap_steps) + ", s = " + std::to_string(k.staleness) +
                                      ", elements = " + std::to_string(elements));
  const double full = double(elements) * double(element_bytes), h = double(k.inner_steps);
  auto seconds = [&](double bytes) { return t.reduce_seconds * bytes / full; };  // linear in the payload
  const double c = t.compute_seconds;
  auto hidden = [](double busy, double behind) { return busy > behind ? busy - behind : 0.0; };
  SyncStepCost r;
  switch (k.kind) {
    case SyncKind::ddp:
      r = {full, full, t.reduce_seconds, t.exposed_seconds};
      break;
    case SyncKind::async:  // issued at t, waited for at t + s: s whole steps of compute in front
      r = {full, full, t.reduce_seconds, k.staleness == 0 ? t.exposed_seconds : hidden(t.reduce_seconds, k.staleness * c)};
      break;
    case SyncKind::local_sgd:
      r = {full / h, full, t.reduce_seconds / h, t.reduce_seconds / h};
      break;
    case SyncKind::diloco: {
      const double sync = double(elements) * (k.bf16_reduce ? 2.0 : double(element_bytes));  // all F pieces
      const double piece = sync / double(k.fragments);
      r = {sync / h, piece, seconds(sync) / h, double(k.fragments) * hidden(seconds(piece), k.overlap_steps * c) / h};
      break;
    }
    case SyncKind::fedavg: {  // values and the weight, once per round of L local steps
      const double round = (double(elements) + 1) * double(element_bytes);
      r = {round / h, round, seconds(round) / h, seconds(round) / h};
      break;
    }
  }
  r.step_seconds = c + r.exposed_seconds;
  return r;
}

/// The bytes one rank sends in a ring all-reduce of `payload` bytes over n ranks.
inline double ring_bytes(double payload, int n) { return n <= 1 ? 0.0 : 2.0 * double(n - 1) / double(n) * payload; }

}  // namespace dtensor::parallel::sync
