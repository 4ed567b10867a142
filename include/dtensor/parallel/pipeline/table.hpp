// dtensor/parallel/pipeline/table.hpp — a schedule printed as a table, one row per rank.
//
//   std::cout << pipeline::format_table(s);                        // step by step, with messages
//   std::cout << pipeline::format_table(s.compute_only());         // computations only
//   std::cout << pipeline::format_timeline(pipeline::simulate(s)); // by simulated time
//
// format_table writes the lists as they are: column k is each rank's k-th action. format_timeline
// writes what each rank computes in each unit of simulated time (an action of cost 2 fills two
// columns; an empty cell is idle time), which is how the bubble looks on paper. It needs costs
// that are whole numbers of time units.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "dtensor/parallel/pipeline/simulate.hpp"

namespace dtensor::parallel::pipeline {

namespace detail {

/// Rows of cells, each column padded to its widest cell, a header of column numbers.
inline std::string format_grid(const std::vector<std::vector<std::string>>& rows, const char* column_label) {
  std::size_t columns = 0;
  for (const auto& row : rows) columns = std::max(columns, row.size());
  std::vector<std::size_t> width(columns, 1);
  for (std::size_t column = 0; column < columns; ++column) width[column] = std::to_string(column).size();
  for (const auto& row : rows)
    for (std::size_t column = 0; column < row.size(); ++column) width[column] = std::max(width[column], row[column].size());
  const std::string first_header = column_label;
  std::size_t label_width = first_header.size();
  for (std::size_t rank = 0; rank < rows.size(); ++rank)
    label_width = std::max(label_width, ("rank " + std::to_string(rank)).size());
  auto pad = [](std::string text, std::size_t to) {
    text.resize(std::max(text.size(), to), ' ');
    return text;
  };
  auto end_line = [](std::string line) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + "\n";
  };
  std::string header = pad(first_header, label_width);
  for (std::size_t column = 0; column < columns; ++column) header += " " + pad(std::to_string(column), width[column]);
  std::string out = end_line(header);
  for (std::size_t rank = 0; rank < rows.size(); ++rank) {
    std::string line = pad("rank " + std::to_string(rank), label_width);
    for (std::size_t column = 0; column < columns; ++column)
      line += " " + pad(column < rows[rank].size() ? rows[rank][column] : "", width[column]);
    out += end_line(line);
  }
  return out;
}

}  // namespace detail

/// Rank x step: each rank's actions in the order it runs them.
inline std::string format_table(const Schedule& schedule) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& list : schedule.actions) {
    auto& row = rows.emplace_back();
    for (const Action& action : list) row.push_back(to_string(action));
  }
  return detail::format_grid(rows, "step");
}

/// Rank x time unit: what each rank computes when, from a simulation with whole-unit costs.
inline std::string format_timeline(const Timeline& timeline) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& list : timeline.actions) {
    auto& row = rows.emplace_back();
    for (const TimedAction& timed : list) {
      if (!is_compute(timed.action.kind)) continue;
      const double start = std::round(timed.start), end = std::round(timed.end);
      if (start != timed.start || end != timed.end)
        throw Error("pipeline::format_timeline",
                    dtensor::detail::cat(to_string(timed.action), " runs from ", timed.start, " to ", timed.end,
                                         ": the time grid needs whole-unit costs"));
      if (row.size() < std::size_t(end)) row.resize(std::size_t(end));
      for (auto unit = std::size_t(start); unit < std::size_t(end); ++unit) row[unit] = to_string(timed.action);
    }
  }
  return detail::format_grid(rows, "time");
}

}  // namespace dtensor::parallel::pipeline
