// dtensor/parallel/pipeline/csv.hpp — schedules to and from CSV, as PyTorch's pipelining writes
// them: one row per rank, one action per cell, in the ranks' order.
//
//   std::string text = pipeline::write_csv(schedule);
//   auto again = pipeline::read_csv(text, StageLayout::looped(4), 8);   // == schedule
//   auto s = pipeline::read_csv(compute_only_text, layout, 8, {.add_send_recv = true});
//
// The CSV holds only the actions; the stage layout and the number of micro-batches come with
// the call. Empty cells are skipped (PyTorch writes an idle slot as one), spaces around a cell
// and '\r' line ends are ignored. A cell that is not an action is a dtensor::Error naming its
// row, column (both from 1, as a spreadsheet shows them) and text; a file with more or fewer
// rows than the layout has ranks is one too. Reading does not validate: validate.hpp does.
//
// PyTorch's golden CSVs come in two kinds, and both read:
// - Overlapped pairs: PyTorch writes DualPipeV's forward of one micro-batch overlapped with the
//   backward of another as one cell, `(0F7;7B3)OVERLAP_F_B`. The executor runs actions one after
//   the other, so such a cell is read as its sub-actions in order (0F7, then 7B3): the same
//   dependencies, without the overlap. Another composite kind is an error that says the kind is
//   not supported (not that the cell is not an action).
// - Compute-only: the "compute" CSVs list only F, B, I and W; the sends and receives are added by
//   PyTorch's `_add_send_recv`. Such a CSV over several ranks is not runnable as it is:
//   is_compute_only() says so, and `{.add_send_recv = true}` adds the communication while reading
//   (pipeline::add_send_recv, communication.hpp); a CSV that has its own is refused then.
#pragma once

#include <cstddef>
#include <optional>
#include <istream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/parallel/pipeline/communication.hpp"
#include "dtensor/parallel/pipeline/schedule.hpp"

namespace dtensor::parallel::pipeline {

inline std::string write_csv(const Schedule& schedule) {
  std::string out;
  for (const auto& list : schedule.actions) {
    for (std::size_t step = 0; step < list.size(); ++step) out += (step ? "," : "") + to_string(list[step]);
    out += "\n";
  }
  return out;
}

struct CsvOptions {
  bool add_send_recv = false;  // the CSV has computations only: add the sends and receives they need
};

/// Whether a schedule has no send or receive although its stages span several ranks: a
/// compute-only CSV, which needs add_send_recv before it can run.
inline bool is_compute_only(const Schedule& schedule) {
  if (schedule.layout.ranks < 2) return false;
  for (const auto& list : schedule.actions)
    for (const Action& a : list)
      if (!is_compute(a.kind)) return false;
  return true;
}

namespace detail {
/// The actions of one CSV cell: one action, or the sub-actions of `(A;B)OVERLAP_F_B`; nothing when
/// the cell is neither. `unsupported` names a composite kind other than OVERLAP_F_B.
inline std::optional<std::vector<Action>> parse_cell(std::string_view cell, std::string& unsupported) {
  if (auto a = try_parse_action(cell)) return std::vector<Action>{*a};
  if (cell.empty() || cell.front() != '(') return std::nullopt;
  const std::size_t close = cell.find(')');
  if (close == std::string_view::npos) return std::nullopt;
  const std::string_view kind = cell.substr(close + 1);
  if (kind != "OVERLAP_F_B") {
    unsupported = std::string(kind);
    return std::nullopt;
  }
  std::vector<Action> out;
  std::string_view inner = cell.substr(1, close - 1);
  while (true) {
    const std::size_t semi = inner.find(';');
    auto a = try_parse_action(inner.substr(0, semi));
    if (!a) return std::nullopt;
    out.push_back(*a);
    if (semi == std::string_view::npos) break;
    inner.remove_prefix(semi + 1);
  }
  return out;
}
}  // namespace detail

inline Schedule read_csv(std::string_view text, const StageLayout& layout, int microbatches, CsvOptions options = {}) {
  constexpr const char* op = "pipeline::read_csv";
  layout.check(op);
  if (microbatches < 1) throw Error(op, dtensor::detail::cat("a schedule needs at least one micro-batch, got ", microbatches));
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    lines.push_back(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
  }
  if (int(lines.size()) != layout.ranks)
    throw Error(op, dtensor::detail::cat("the CSV has ", lines.size(), " rows, one per rank is ", layout.ranks));
  auto trim = [](std::string_view cell) {
    while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t')) cell.remove_prefix(1);
    while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t' || cell.back() == '\r')) cell.remove_suffix(1);
    return cell;
  };
  Schedule schedule{layout, microbatches, {}};
  for (std::size_t row = 0; row < lines.size(); ++row) {
    auto& list = schedule.actions.emplace_back();
    std::string_view rest = lines[row];
    for (std::size_t column = 1;; ++column) {
      const std::size_t comma = rest.find(',');
      const std::string_view cell = trim(rest.substr(0, comma));
      if (!cell.empty()) {
        std::string unsupported;
        auto actions = detail::parse_cell(cell, unsupported);
        if (!actions && !unsupported.empty())
          throw Error(op, dtensor::detail::cat("row ", row + 1, " (rank ", row, "), column ", column, ": '", cell,
                                               "': the action kind ", unsupported,
                                               " is not supported (composite cells: (A;B)OVERLAP_F_B only)"));
        if (!actions)
          throw Error(op, dtensor::detail::cat("row ", row + 1, " (rank ", row, "), column ", column, ": '", cell,
                                               "' is not an action (expected e.g. 0F0, 1B0, 2I1, 2W1, 0SEND_F0, 1RECV_B0, "
                                               "(0F7;7B3)OVERLAP_F_B)"));
        list.insert(list.end(), actions->begin(), actions->end());
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  if (!options.add_send_recv) return schedule;
  for (std::size_t rank = 0; rank < schedule.actions.size(); ++rank)
    for (const Action& a : schedule.actions[rank])
      if (!is_compute(a.kind))
        throw Error(op, dtensor::detail::cat("add_send_recv was asked for, but the CSV has its own communication (",
                                             to_string(a), " on rank ", rank, "): read it without the option"));
  return add_send_recv(layout, microbatches, schedule.actions);
}

inline Schedule read_csv(std::istream& in, const StageLayout& layout, int microbatches, CsvOptions options = {}) {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return read_csv(std::string_view(text), layout, microbatches, options);
}

}  // namespace dtensor::parallel::pipeline
