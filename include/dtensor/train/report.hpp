// dtensor/train/report.hpp — the summary of a training run (train::fit's FitReport), printed on
// rank 0: the steps, time, losses and tokens/s; the process's memory peaks by tag; the largest
// rank's step peak by tag and its peaks by phase; the collectives of one step by kind and group
// (with the bytes inside and across hosts when the mesh spans several).
//
//   const auto r = train::fit(trainer, fo, data);
//   train::print_report(r, train::offload_notes(trainer) + mine);   // lines after the summary line
//
// No communication: fit() reduced what is the largest rank's already. Scripts and tests read
// these lines ("summary:", "final losses at step", "train loss fell", "memory peaks in", "step
// peak per rank", "memory peak per rank by phase", "collectives of one training step"): keep them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>

#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/train/loop.hpp"

namespace dtensor::train {

/// printf into a string (a summary line of a program's own, for print_report's `after_summary`).
template <class... A>
std::string formatted(const char* f, A... a) {
  const int n = std::snprintf(nullptr, 0, f, a...);
  std::string s(std::size_t(std::max(n, 0)), '\0');
  std::snprintf(s.data(), s.size() + 1, f, a...);
  return s;
}

/// This rank's offload figures as summary lines (empty without offload; no communication):
/// the optimizer's moments in files (TrainerOptions::offload_optimizer_dir: their size, the
/// chunks a step through the staging buffer, the I/O and how much of it the update hid) and the
/// FSDP master shards in mapped files (offload_params_dir).
template <class Tr>
std::string offload_notes(Tr& trainer) {
  std::string s;
  const TrainerOptions& o = trainer.options();
  if (!o.offload_optimizer_dir.empty()) {
    const auto st = trainer.offload_stats();
    s += formatted(
        "offload (rank 0): AdamW moments %.2f MiB in %s, %zu chunks a step through %zu KiB of host buffer; "
        "read %.2f MiB, wrote %.2f MiB in %.3f s of I/O (%.0f MiB/s), %.0f%% of it hidden behind the update\n",
        double(st.file_bytes) / (1 << 20), o.offload_optimizer_dir.c_str(), st.chunks, o.offload_buffer_bytes >> 10,
        double(st.bytes_read) / (1 << 20), double(st.bytes_written) / (1 << 20), st.io_seconds,
        st.io_seconds > 0 ? double(st.bytes_read + st.bytes_written) / (1 << 20) / st.io_seconds : 0.0,
        100 * st.overlap());
  }
  if (!o.offload_params_dir.empty()) {  // the FSDP master shards in mapped files
    std::size_t disk = 0;
    for (std::size_t i = 0; i < trainer.stages().size(); ++i) disk += trainer.pipeline().fsdp(i).memory().disk;
    s += formatted(
        "offload (rank 0): master values %.4f MiB (%zu bytes) in files in %s, prefetched a unit ahead, "
        "written behind after each step\n",
        double(disk) / (1 << 20), disk, o.offload_params_dir.c_str());
  }
  return s;
}

/// Prints `r` on rank 0 (other ranks print nothing); `after_summary` (the program's own lines,
/// each ending in a newline) goes right after the summary line.
inline void print_report(const FitReport& r, const std::string& after_summary = {}) {
  if (r.rank != 0 || r.steps_run == 0) return;
  const char* space = r.space.c_str();
  std::printf("\nsummary: %d steps in %.1f s; final train loss %.4f, validation loss %.4f; %.0f tokens/s", r.steps_run,
              r.elapsed, r.train_loss, r.val_loss, r.tokens_per_second);
  if (r.tokens_per_second_after_first > 0)  // what a long run sees: the first step's one-time set-up left out
    std::printf(" (%.0f after the first step)", r.tokens_per_second_after_first);
  std::printf("\n");
  std::fputs(after_summary.c_str(), stdout);
  // All the digits: a resumed run is compared with a straight one by these (examples/CMakeLists.txt).
  std::printf("final losses at step %d: train %.17g validation %.17g\n", r.last_step, r.train_loss, r.val_loss);
  std::printf("train loss %s from %.4f (step %d) to %.4f\n", r.train_loss < r.first_loss ? "fell" : "did not fall",
              r.first_loss, r.first_step, r.train_loss);
  // The ledger's process-wide peaks (every rank thread of this process), by what the bytes hold:
  // scripts/gpu-check.sh reads this line for the GPU's memory use.
  std::printf("memory peaks in %s space (this process):", space);
  for (std::size_t t = 0; t < memory_tag_count; ++t) {
    const auto peak = memory_totals().peak(r.space, MemoryTag(t));
    if (peak > 0) std::printf(" %s %.1f MiB", std::string(name_of(MemoryTag(t))).c_str(), double(peak) / (1 << 20));
  }
  std::printf("\n");
  std::printf("step peak per rank (the largest rank's, step %d, %s space):", r.peak_step, space);
  for (std::size_t t = 0; t <= memory_tag_count && t < r.step_peaks.size(); ++t)
    if (r.step_peaks[t] > 0)
      std::printf(" %s %.1f MiB", t == memory_tag_count ? "total" : std::string(name_of(MemoryTag(t))).c_str(),
                  double(r.step_peaks[t]) / (1 << 20));
  std::printf("\n");
  // What a user acts on: which phase peaks (construction: the model built as shards, FSDP and
  // the optimizer; forward: saved activations, gathered units; backward: unsharded gradients;
  // optimizer: its state), and with what.
  std::printf("memory peak per rank by phase (the largest rank's, %s space, MiB):", space);
  for (std::size_t ph = 0; ph < r.phases.size(); ++ph) {
    const auto& p = r.phases[ph];
    std::printf("%s %s total %.1f", ph == 0 ? "" : ";", p.name.c_str(), double(p.total) / (1 << 20));
    for (std::size_t t = 0; t < memory_tag_count; ++t)
      if (p.peak[t] > 0)
        std::printf(" %s %.1f", std::string(name_of(MemoryTag(t))).c_str(), double(p.peak[t]) / (1 << 20));
  }
  std::printf("\n");
  std::printf(
      "collectives of one training step on rank 0 (schedule, gradient syncs, clipping, AdamW, ZeRO gathers):\n");
  std::size_t inside_bytes = 0, across_bytes = 0;
  for (const auto& [k, v] : r.collectives) {
    std::printf("  %-32s x%-5zu %10zu bytes", k.c_str(), v.first, v.second);
    if (const auto it = r.host_split.find(k); it != r.host_split.end()) {
      const auto [inside, across] = it->second;
      if (inside > 0 && across > 0) std::printf("  %zu inside a host, %zu across hosts", inside, across);
      else std::printf("  %s", across > 0 ? "across hosts" : "inside a host");
      inside_bytes += inside;
      across_bytes += across;
    }
    std::printf("\n");
  }
  if (r.hosts > 1)
    std::printf("bytes of one step on rank 0: %zu inside a host, %zu across hosts\n", inside_bytes, across_bytes);
}

}  // namespace dtensor::train
