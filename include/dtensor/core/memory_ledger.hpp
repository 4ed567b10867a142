// dtensor/core/memory_ledger.hpp — how many bytes each memory space holds, by what they hold.
//
//   {
//     dtensor::MemoryTagScope tag(dtensor::MemoryTag::activations);   // what this code allocates
//     dtensor::MemoryLedger ledger;                                    // records on this thread
//     auto y = ops::gelu(x);
//     ledger.peak("host", MemoryTag::activations);   // the most bytes held at once in the scope
//     ledger.current("host");                        // bytes allocated and not yet freed (all tags)
//     std::cout << ledger.to_string();
//   }
//   dtensor::memory_totals().peak("cuda", MemoryTag::parameters);   // process-wide
//
// Every Tensor's storage (core/tensor.hpp) reports its allocation and its release here with the
// tag that was current on the allocating thread (MemoryTag::other outside any MemoryTagScope).
// A MemoryLedger is an RAII scope as CommLog is: it sees what the calling thread allocates and
// frees while it is alive (and so do the scopes enclosing it). Ranks of the threads backend are
// threads, so each rank's ledger is its own. A buffer freed on another thread than the one that
// allocated it counts there (its bytes leave that thread's scopes). The meta space allocates
// nothing but reports the bytes it would have allocated, so a dry run on meta tensors reads the
// same ledger as a real one.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>

namespace dtensor {

/// What an allocation holds.
enum class MemoryTag : std::uint8_t {
  other,
  parameters,
  gradients,
  optimizer_state,
  activations,
  communication,
  workspace,
};
inline constexpr std::size_t memory_tag_count = 7;

constexpr std::string_view name_of(MemoryTag t) {
  switch (t) {
    case MemoryTag::other: return "other";
    case MemoryTag::parameters: return "parameters";
    case MemoryTag::gradients: return "gradients";
    case MemoryTag::optimizer_state: return "optimizer_state";
    case MemoryTag::activations: return "activations";
    case MemoryTag::communication: return "communication";
    case MemoryTag::workspace: return "workspace";
  }
  return "?";
}

namespace detail {
inline MemoryTag& current_memory_tag() noexcept {
  thread_local MemoryTag tag = MemoryTag::other;
  return tag;
}

/// The spaces the ledger knows, by name (a handful: host, cuda, meta, and any a user adds).
inline constexpr std::size_t ledger_space_slots = 8;

/// Index of a space name in a fixed table shared by every ledger. The table keeps copies: a
/// caller may pass a view of a string that dies (sim::Recorder's), which must not dangle here.
inline std::size_t ledger_space_index(std::string_view name) {
  static std::array<std::string, ledger_space_slots> names{};
  static std::mutex m;
  std::lock_guard lock(m);
  for (std::size_t i = 0; i < ledger_space_slots; ++i) {
    if (names[i] == name) return i;
    if (names[i].empty()) {
      names[i] = name;
      return i;
    }
  }
  return ledger_space_slots - 1;  // more spaces than slots: the last slot is shared
}

/// Current and peak bytes per (space, tag), plus per space over all tags.
struct LedgerCounts {
  struct Cell {
    std::int64_t current = 0, peak = 0;
    void add(std::int64_t bytes) {
      current += bytes;
      if (current > peak) peak = current;
    }
  };
  std::array<std::array<Cell, memory_tag_count>, ledger_space_slots> by_tag{};
  std::array<Cell, ledger_space_slots> by_space{};
  void add(std::size_t space, MemoryTag tag, std::int64_t bytes) {
    by_tag[space][std::size_t(tag)].add(bytes);
    by_space[space].add(bytes);
  }
};
}  // namespace detail

/// Sets the tag of what this thread allocates until the end of the scope.
class MemoryTagScope {
 public:
  explicit MemoryTagScope(MemoryTag tag) noexcept : saved_(detail::current_memory_tag()) {
    detail::current_memory_tag() = tag;
  }
  MemoryTagScope(const MemoryTagScope&) = delete;
  MemoryTagScope& operator=(const MemoryTagScope&) = delete;
  ~MemoryTagScope() { detail::current_memory_tag() = saved_; }

 private:
  MemoryTag saved_;
};

/// The tag allocations on this thread get now.
inline MemoryTag current_memory_tag() noexcept { return detail::current_memory_tag(); }

/// Allocations and frees on this thread while the scope lives (see the synopsis). current() is
/// the net bytes allocated in the scope (negative when it freed older buffers); peak() the
/// largest value current() reached.
class MemoryLedger {
 public:
  MemoryLedger() : parent_(top()) { top() = this; }
  ~MemoryLedger() { top() = parent_; }
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  std::int64_t current(std::string_view space) const { return counts_.by_space[detail::ledger_space_index(space)].current; }
  std::int64_t peak(std::string_view space) const { return counts_.by_space[detail::ledger_space_index(space)].peak; }
  std::int64_t current(std::string_view space, MemoryTag tag) const {
    return counts_.by_tag[detail::ledger_space_index(space)][std::size_t(tag)].current;
  }
  std::int64_t peak(std::string_view space, MemoryTag tag) const {
    return counts_.by_tag[detail::ledger_space_index(space)][std::size_t(tag)].peak;
  }
  /// Starts the peaks over from now: each peak becomes its current value (a scope that measures
  /// phases one after another without opening and closing ledgers inside its callees' scopes,
  /// sim::Recorder).
  void reset_peaks() noexcept {
    for (auto& space : counts_.by_tag)
      for (auto& c : space) c.peak = c.current;
    for (auto& c : counts_.by_space) c.peak = c.current;
  }
  /// Number of allocations in the scope.
  std::size_t allocations() const noexcept { return allocations_; }

  /// "host activations: current 4096 B, peak 8192 B" for every (space, tag) that was touched.
  std::string to_string() const {
    std::ostringstream s;
    for (std::string_view space : {"host", "cuda", "meta"})
      for (std::size_t t = 0; t < memory_tag_count; ++t) {
        const auto& c = counts_.by_tag[detail::ledger_space_index(space)][t];
        if (c.peak != 0 || c.current != 0)
          s << space << ' ' << name_of(MemoryTag(t)) << ": current " << c.current << " B, peak " << c.peak << " B\n";
      }
    return s.str();
  }

  /// Called by Tensor storage: +bytes on allocation, -bytes on release (slot: the space's index).
  static void record(std::size_t i, MemoryTag tag, std::int64_t bytes) {
    for (MemoryLedger* l = top(); l; l = l->parent_) {
      l->counts_.add(i, tag, bytes);
      if (bytes > 0) ++l->allocations_;
    }
  }

 private:
  static MemoryLedger*& top() {
    thread_local MemoryLedger* t = nullptr;
    return t;
  }
  MemoryLedger* parent_;
  detail::LedgerCounts counts_;
  std::size_t allocations_ = 0;
};

/// Process-wide current and peak bytes per space and tag (every thread).
class MemoryTotals {
 public:
  std::int64_t current(std::string_view space, MemoryTag tag) const {
    return cells_[detail::ledger_space_index(space)][std::size_t(tag)].current.load();
  }
  std::int64_t peak(std::string_view space, MemoryTag tag) const {
    return cells_[detail::ledger_space_index(space)][std::size_t(tag)].peak.load();
  }
  std::int64_t current(std::string_view space) const {
    std::int64_t n = 0;
    for (std::size_t t = 0; t < memory_tag_count; ++t) n += current(space, MemoryTag(t));
    return n;
  }

  void record(std::size_t slot, MemoryTag tag, std::int64_t bytes) {
    auto& c = cells_[slot][std::size_t(tag)];
    const std::int64_t now = c.current.fetch_add(bytes) + bytes;
    std::int64_t p = c.peak.load();
    while (now > p && !c.peak.compare_exchange_weak(p, now)) {
    }
  }

 private:
  struct Cell {
    std::atomic<std::int64_t> current{0}, peak{0};
  };
  std::array<std::array<Cell, memory_tag_count>, detail::ledger_space_slots> cells_{};
};

inline MemoryTotals& memory_totals() {
  static MemoryTotals totals;
  return totals;
}

namespace detail {
/// The ledger slot of a memory space type (looked up once per space).
template <class Space>
std::size_t ledger_slot() {
  static const std::size_t slot = ledger_space_index(Space::name);
  return slot;
}

/// What Tensor storage calls (both the thread's scopes and the process totals).
template <class Space>
void ledger_record(MemoryTag tag, std::int64_t bytes) {
  if (bytes == 0) return;
  const std::size_t slot = ledger_slot<Space>();
  MemoryLedger::record(slot, tag, bytes);
  memory_totals().record(slot, tag, bytes);
}
}  // namespace detail

}  // namespace dtensor
