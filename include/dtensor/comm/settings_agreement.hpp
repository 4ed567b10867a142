// dtensor/comm/settings_agreement.hpp — ranks agree on a program's settings at setup.
//
//   require_same_settings(*world, "train_gpt", {{"--lr", "0.003"}, {"--seed", "1"}, ...});
//
// The ranks of a job each parse their own command line (every process of an MPI job, every
// thread given its options). Ranks given different settings (one launched with another --lr,
// --steps, --schedule or --microbatches) train different models or issue different collectives,
// and fail late with an unclear message (MPI_ERR_TRUNCATE, a group of the wrong size, a hang,
// a corrupted heap) or not at all. One all-gather of a fixed-size record per rank at setup (for
// each setting a 64-bit hash of its name and value and the value's first characters; about
// 6 KiB per rank) finds them before any step, in every build type and whatever the collective
// check's switch: every rank throws the same dtensor::Error, naming each setting that differs
// and which ranks hold which value.
//
// Collective over `comm`: every rank must call it, once, with the same number of settings in
// the same order (a different number is itself reported). The layers above agree on their own
// setup this way too: a pipeline executor on its schedule (parallel/pipeline/executor.hpp), a
// MoE layer on its routing (parallel/moe.hpp). On the sim backend (no peers) it does nothing.
//
// It lives in comm/ (it needs nothing but a Communicator) so that the backends can use it at
// start-up: dtensor::mpi::run agrees on the DTENSOR_* settings with it (comm/env_agreement.hpp).
// distributed/settings_agreement.hpp includes this header, for the programs that include that.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/error.hpp"

namespace dtensor {

/// One setting: its name as the user writes it (a flag) and its value as text.
struct Setting {
  std::string name;
  std::string value;
};

namespace detail {

// Per agreement: a program's whole flag table, one setting per flag (train/flag_table.hpp's
// settings_of: train_gpt has about 80 flags).
inline constexpr std::size_t max_settings = 128;
inline constexpr std::size_t setting_text_bytes = 40;  // of each value, for the message

/// What one rank sends: a fixed size, so that ranks with different settings still exchange
/// equal byte counts (what MPI needs).
struct SettingsRecord {
  std::uint32_t count = 0;
  std::uint32_t pad = 0;
  std::array<std::uint64_t, max_settings> hash{};
  std::array<std::array<char, setting_text_bytes>, max_settings> text{};
};

inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 14695981039346656037ull) {
  for (char ch : s) h = (h ^ std::uint8_t(ch)) * 1099511628211ull;
  return h;
}

/// The value as the message shows it: its first characters, "…" when cut.
inline std::string shown_value(const std::array<char, setting_text_bytes>& t) {
  const std::string_view v(t.data(), strnlen(t.data(), t.size()));
  return v.size() == t.size() ? cat("'", v, "…'") : cat("'", v, "'");
}

}  // namespace detail

/// Throws on every rank of `comm` unless all of them passed the same settings (see the top of
/// this file). `op` names the program or the setup step in the message.
inline void require_same_settings(Communicator& comm, std::string_view op, const std::vector<Setting>& settings) {
  using detail::SettingsRecord;
  if (settings.size() > detail::max_settings)
    comm.fail(std::string(op), detail::cat(settings.size(), " settings to agree on; at most ", detail::max_settings));
  // The sim backend (a dry run) has no peers to compare with: its all-gather moves nothing.
  if (comm.backend() == "sim") return;
  SettingsRecord mine;
  mine.count = std::uint32_t(settings.size());
  for (std::size_t i = 0; i < settings.size(); ++i) {
    // The name is hashed too: ranks that list different settings in one position disagree.
    mine.hash[i] = detail::fnv1a(settings[i].value, detail::fnv1a(settings[i].name + '\0'));
    const auto n = std::min(settings[i].value.size(), detail::setting_text_bytes);
    std::memcpy(mine.text[i].data(), settings[i].value.data(), n);
  }
  const int size = comm.size();
  std::vector<SettingsRecord> all(static_cast<std::size_t>(size));
  comm.all_gather(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&mine), sizeof mine),
                  std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(all.data()), all.size() * sizeof mine));
  std::string differs;
  bool counts_differ = false;
  for (const auto& r : all) counts_differ = counts_differ || r.count != mine.count;
  if (counts_differ) {
    differs = "\n  the number of settings:";
    for (int r = 0; r < size; ++r) differs += detail::cat(" rank ", r, ": ", all[std::size_t(r)].count, ";");
  } else {
    for (std::size_t i = 0; i < settings.size(); ++i) {
      // Ranks grouped by the value they hold, in order of the lowest rank holding it.
      std::map<std::uint64_t, std::vector<int>> holders;
      std::vector<std::uint64_t> order;
      for (int r = 0; r < size; ++r) {
        const auto h = all[std::size_t(r)].hash[i];
        if (holders.find(h) == holders.end()) order.push_back(h);
        holders[h].push_back(r);
      }
      if (order.size() == 1) continue;
      differs += detail::cat("\n  ", settings[i].name, ":");
      for (auto h : order) {
        const auto& ranks = holders[h];
        differs += detail::cat(ranks.size() == 1 ? " rank " : " ranks ");
        for (std::size_t k = 0; k < ranks.size(); ++k) differs += detail::cat(k ? ", " : "", ranks[k]);
        differs += detail::cat(" ", detail::shown_value(all[std::size_t(ranks.front())].text[i]), ";");
      }
    }
  }
  if (!differs.empty())
    throw Error(std::string(op), detail::cat("ranks were given different settings (checked at setup, before any step):",
                                             differs),
                comm.rank());
}

}  // namespace dtensor
