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

/// The bytes one rank sends in a ring all-reduce of `payload` bytes over n ranks.
inline double ring_bytes(double payload, int n) { return n <= 1 ? 0.0 : 2.0 * double(n - 1) / double(n) * payload; }

}  // namespace dtensor::parallel::sync
