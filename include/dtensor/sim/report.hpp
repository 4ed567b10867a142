// dtensor/sim/report.hpp — what one rank allocates, sends and computes, phase by phase.
//
//   sim::Recorder rec;                       // before anything the report should count
//   rec.phase("parameters");  ...make the model...
//   rec.phase("forward");     ...forward...
//   rec.phase("backward", /*overlapped=*/true);  ...backward (its communication may hide)...
//   sim::RankReport report = rec.finish("stage 0", /*ranks=*/1024);
//   std::cout << report.to_table();
//   report.peak(MemoryTag::activations);  report.flops();  report.wire().sent;
//
// A Recorder is a scope on the calling thread (a rank): it reads the allocation ledger
// (core/memory_ledger.hpp), the CommLog (comm/comm_log.hpp) and the meta kernels' CostLog
// (kernels/meta/cost_log.hpp), and splits them into the phases the program names. Memory is
// counted from the Recorder's construction: bytes held before it are not seen. The same
// Recorder reads a real run on the host ("host" space) as a dry run on meta tensors, which is
// how the dry run is checked against the threads backend. Sizes print in decimal units
// (1 GB = 1e9 B), as the papers the tests compare with.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/kernels/meta/cost_log.hpp"

namespace dtensor::sim {

using TagBytes = std::array<std::int64_t, memory_tag_count>;

/// One phase of a rank's step.
struct PhaseReport {
  std::string name;
  bool overlapped = false;  // prefetched gathers and ring steps may run behind its compute (sim/cost_model.hpp)
  TagBytes start{}, peak{}, end{};  // bytes held per tag: when it began, at most, when it ended
  std::int64_t peak_total = 0;      // the most bytes held at once, all tags together
  std::vector<CommRecord> collectives;
  std::vector<kernels::meta::CostRecord> ops;

  std::int64_t flops() const {
    std::int64_t n = 0;
    for (const auto& op : ops) n += op.flops;
    return n;
  }
  WireBytes wire() const { return sum_wire(collectives, [](const CommRecord& r) { return r.wire(); }); }

  /// The sum of wire_of(x) over `items` (collectives here, phases in RankReport).
  template <class Items, class WireOf>
  static WireBytes sum_wire(const Items& items, WireOf wire_of) {
    WireBytes total;
    for (const auto& item : items) {
      const WireBytes one = wire_of(item);
      total.sent += one.sent;
      total.received += one.received;
    }
    return total;
  }
};

namespace detail {
/// "1.23 GB", "512 B": decimal units.
inline std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (bytes >= 1000 && u < 5) bytes /= 1000, ++u;
  std::ostringstream s;
  s << std::setprecision(u == 0 ? 0 : 2) << std::fixed << bytes << ' ' << units[u];
  return s.str();
}
/// "1.23e+12" for FLOP counts.
inline std::string scientific(double v) {
  std::ostringstream s;
  s << std::setprecision(3) << std::scientific << v;
  return s.str();
}
}  // namespace detail

/// "1.5 GiB": byte counts as the reports print them (the examples' summaries use it too).
using detail::human_bytes;

/// What one rank class does in a step (see the synopsis).
struct RankReport {
  std::string name;
  std::int64_t ranks = 1;  // how many ranks of the world do exactly this
  std::vector<PhaseReport> phases;

  /// The most bytes of `tag` held at once during the step.
  std::int64_t peak(MemoryTag tag) const {
    std::int64_t p = 0;
    for (const auto& ph : phases) p = std::max(p, ph.peak[std::size_t(tag)]);
    return p;
  }
  /// The most bytes held at once, all tags together.
  std::int64_t peak_total() const {
    std::int64_t p = 0;
    for (const auto& ph : phases) p = std::max(p, ph.peak_total);
    return p;
  }
  /// The most bytes held at once during the step itself: every phase but the construction
  /// phase "parameters" (building the trainer; construction_peak_total, judged apart).
  std::int64_t step_peak_total() const {
    std::int64_t p = 0;
    for (const auto& ph : phases)
      if (ph.name != construction_phase) p = std::max(p, ph.peak_total);
    return p;
  }
  /// The most bytes held while the model was built ("parameters"; 0 without that phase).
  std::int64_t construction_peak_total() const {
    std::int64_t p = 0;
    for (const auto& ph : phases)
      if (ph.name == construction_phase) p = std::max(p, ph.peak_total);
    return p;
  }
  static constexpr std::string_view construction_phase = "parameters";
  std::int64_t flops() const {
    std::int64_t n = 0;
    for (const auto& ph : phases) n += ph.flops();
    return n;
  }
  WireBytes wire() const { return PhaseReport::sum_wire(phases, [](const PhaseReport& p) { return p.wire(); }); }
  std::size_t collectives() const {
    std::size_t n = 0;
    for (const auto& ph : phases) n += ph.collectives.size();
    return n;
  }
  const PhaseReport& phase(std::string_view phase_name) const {
    for (const auto& ph : phases)
      if (ph.name == phase_name) return ph;
    throw Error("RankReport::phase", dtensor::detail::cat("no phase '", phase_name, "' in the report of ", name));
  }

  /// The report as text tables: memory by tag and phase, collectives (grouped by phase, kind,
  /// group and size), FLOPs by op, and the step's totals.
  std::string to_table() const {
    std::ostringstream s;
    s << "== " << name << " (" << ranks << " rank" << (ranks == 1 ? "" : "s") << ")\n";
    s << "memory (peak per phase)";
    for (const auto& ph : phases) s << " | " << ph.name;
    s << " | step peak\n";
    for (std::size_t t = 0; t < memory_tag_count; ++t) {
      if (peak(MemoryTag(t)) == 0) continue;
      s << "  " << std::left << std::setw(21) << name_of(MemoryTag(t)) << std::right;
      for (const auto& ph : phases) s << " | " << detail::human_bytes(double(ph.peak[t]));
      s << " | " << detail::human_bytes(double(peak(MemoryTag(t)))) << "\n";
    }
    s << "  " << std::left << std::setw(21) << "all (at once)" << std::right;
    for (const auto& ph : phases) s << " | " << detail::human_bytes(double(ph.peak_total));
    s << " | " << detail::human_bytes(double(peak_total())) << "\n";

    s << "collectives: phase | kind | group (ranks) | size per call | calls | sent | received\n";
    for (const auto& ph : phases) {
      // Calls alike (kind, group, size) print once, with their count.
      std::map<std::tuple<std::string_view, std::string, int, std::size_t>, std::pair<CommRecord, std::size_t>> calls;
      for (const auto& r : ph.collectives)
        if (r.kind != CollectiveKind::split) {
          auto& [first, count] = calls.try_emplace({name_of(r.kind), r.group, r.group_size, r.bytes}, r, 0).first->second;
          ++count;
        }
      for (const auto& [key, call] : calls) {
        const auto& [r, count] = call;
        const auto w = r.wire();
        s << "  " << ph.name << " | " << name_of(r.kind) << " | " << r.group << " (" << r.group_size << ") | "
          << detail::human_bytes(double(r.bytes)) << " | " << count << " | "
          << detail::human_bytes(double(w.sent * count)) << " | " << detail::human_bytes(double(w.received * count))
          << "\n";
      }
    }
    s << "compute: phase | op | calls | FLOP | bytes read | bytes written\n";
    for (const auto& ph : phases) {
      std::map<std::string, kernels::meta::CostRecord> by_op;
      std::map<std::string, std::size_t> calls;
      for (const auto& op : ph.ops) {
        auto& sum = by_op[op.op];
        sum.flops += op.flops;
        sum.bytes_read += op.bytes_read;
        sum.bytes_written += op.bytes_written;
        ++calls[op.op];
      }
      for (const auto& [op, sum] : by_op)
        s << "  " << ph.name << " | " << op << " | " << calls[op] << " | " << detail::scientific(double(sum.flops))
          << " | " << detail::human_bytes(double(sum.bytes_read)) << " | "
          << detail::human_bytes(double(sum.bytes_written)) << "\n";
    }
    const auto w = wire();
    s << "step: " << detail::scientific(double(flops())) << " FLOP, " << collectives() << " collectives, sent "
      << detail::human_bytes(double(w.sent)) << ", received " << detail::human_bytes(double(w.received))
      << ", peak memory in the step " << detail::human_bytes(double(step_peak_total())) << " (building the model "
      << detail::human_bytes(double(construction_peak_total())) << ")\n";
    return s.str();
  }
};

/// Records a rank's phases (see the synopsis). Lives on one thread, as the scopes it reads.
class Recorder {
 public:
  /// `space`: the memory space whose ledger counts ("meta" in a dry run, "host" in a real one).
  explicit Recorder(std::string_view space = "meta") : space_(space) {}
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Ends the current phase (if any) and starts `name`. May be called from inside scopes opened
  /// after the Recorder (an observer inside the trainer's step, models/training_plan.hpp): the
  /// Recorder's own ledger and logs live as long as it does, and a phase is a stretch of them.
  void phase(std::string name, bool overlapped = false) {
    close_phase();
    PhaseReport p;
    p.name = std::move(name);
    p.overlapped = overlapped;
    for (std::size_t t = 0; t < memory_tag_count; ++t) p.start[t] = memory_.current(space_, MemoryTag(t));
    phases_.push_back(std::move(p));
    memory_.reset_peaks();
    comm_from_ = comm_.size();
    cost_from_ = cost_.records().size();
    open_ = true;
  }

  /// Ends the current phase and returns the report; the Recorder records nothing more.
  RankReport finish(std::string name, std::int64_t ranks = 1) {
    close_phase();
    return RankReport{std::move(name), ranks, std::move(phases_)};
  }

 private:
  void close_phase() {
    if (!open_) return;
    PhaseReport& p = phases_.back();
    for (std::size_t t = 0; t < memory_tag_count; ++t) {
      p.peak[t] = memory_.peak(space_, MemoryTag(t));  // the peaks restarted with the phase
      p.end[t] = memory_.current(space_, MemoryTag(t));
    }
    p.peak_total = memory_.peak(space_);
    const auto& comm = comm_.records();
    p.collectives.assign(comm.begin() + std::ptrdiff_t(comm_from_), comm.end());
    const auto& cost = cost_.records();
    p.ops.assign(cost.begin() + std::ptrdiff_t(cost_from_), cost.end());
    open_ = false;
  }

  std::string space_;
  // From construction to destruction (scopes opened later nest inside them): what every phase
  // starts from, and the records each phase takes its stretch of.
  MemoryLedger memory_;
  CommLog comm_;
  kernels::meta::CostLog cost_;
  std::size_t comm_from_ = 0, cost_from_ = 0;
  std::vector<PhaseReport> phases_;
  bool open_ = false;
};

}  // namespace dtensor::sim
