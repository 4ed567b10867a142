// dtensor/parallel/pipeline/csv.hpp — schedules to and from CSV, as PyTorch's pipelining writes
// them: one row per rank, one action per cell, in the ranks' order.
//
//   std::string text = pipeline::write_csv(schedule);
//   auto again = pipeline::read_csv(text, StageLayout::looped(4), 8);   // == schedule
//
// The CSV holds only the actions; the stage layout and the number of micro-batches come with
// the call. Empty cells are skipped (PyTorch writes an idle slot as one), spaces around a cell
// and '\r' line ends are ignored. A cell that is not an action is a dtensor::Error naming its
// row, column (both from 1, as a spreadsheet shows them) and text; a file with more or fewer
// rows than the layout has ranks is one too. Reading does not validate: validate.hpp does.
#pragma once

#include <cstddef>
#include <istream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

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

inline Schedule read_csv(std::string_view text, const StageLayout& layout, int microbatches) {
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
        auto action = try_parse_action(cell);
        if (!action)
          throw Error(op, dtensor::detail::cat("row ", row + 1, " (rank ", row, "), column ", column, ": '", cell,
                                               "' is not an action (expected e.g. 0F0, 1B0, 2I1, 2W1, 0SEND_F0, 1RECV_B0)"));
        list.push_back(*action);
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return schedule;
}

inline Schedule read_csv(std::istream& in, const StageLayout& layout, int microbatches) {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return read_csv(std::string_view(text), layout, microbatches);
}

}  // namespace dtensor::parallel::pipeline
