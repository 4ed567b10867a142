// dtensor/distributed/visualize.hpp — which ranks hold which block of a 1-D or 2-D DTensor.
//
//   std::cout << visualize_sharding(x);
//
//   (S(0), S(1)) of [13, 5] on mesh dp=2 x tp=4
//                cols [0, 2)    cols [2, 4)   cols [4, 5)   cols [5, 5)
//   rows [0, 7)  0             1             2             3
//   rows [7, 13) 4             5             6             7
//
// Computed from the layout alone: no communication. Ranks holding a Partial value are marked
// with a '+' (the block is the sum / max / ... of their pieces).
#pragma once

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/distributed/dtensor.hpp"

namespace dtensor {

template <Element T, std::size_t R, class Mesh, class L, class Space>
std::string visualize_sharding(const DTensor<T, R, Mesh, L, Space>& x) {
  static_assert(R == 1 || R == 2, "visualize_sharding draws 1-D and 2-D tensors");
  const auto& shape = x.mesh().shape();
  std::ostringstream head;
  head << to_string(L::desc) << " of " << to_string(x.shape()) << " on mesh ";
  for (std::size_t i = 0; i < Mesh::ndim; ++i) head << (i ? " x " : "") << Mesh::names[i] << '=' << shape[i];
  head << '\n';

  // Distinct row and column ranges, and the ranks holding each (row, col) block.
  std::vector<Range> rows, cols;
  std::map<std::pair<std::size_t, std::size_t>, std::string> cell;
  int n = 1;
  for (int s : shape) n *= s;
  auto index_of = [](std::vector<Range>& v, Range r) {
    auto it = std::find(v.begin(), v.end(), r);
    if (it != v.end()) return std::size_t(it - v.begin());
    v.push_back(r);
    return v.size() - 1;
  };
  for (int r = 0; r < n; ++r) {
    const auto b = local_box(L::desc, shape, detail::row_major_coordinate(shape, r), x.shape());
    const Range rr = R == 2 ? Range{b.offset[0], b.offset[0] + b.extent[0]} : Range{0, 1};
    const Range cr{b.offset[R - 1], b.offset[R - 1] + b.extent[R - 1]};
    auto& c = cell[{index_of(rows, rr), index_of(cols, cr)}];
    c += (c.empty() ? "" : ",") + std::to_string(r) + (L::desc.has_partial() ? "+" : "");
  }
  auto by_begin = [](Range a, Range b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); };
  std::vector<Range> srows = rows, scols = cols;
  std::sort(srows.begin(), srows.end(), by_begin);
  std::sort(scols.begin(), scols.end(), by_begin);
  auto label = [](const char* what, Range r) { return detail::cat(what, " [", r.begin, ", ", r.end, ")"); };

  std::vector<std::vector<std::string>> table(srows.size() + 1, std::vector<std::string>(scols.size() + 1));
  for (std::size_t c = 0; c < scols.size(); ++c) table[0][c + 1] = label(R == 2 ? "cols" : "elements", scols[c]);
  for (std::size_t r = 0; r < srows.size(); ++r) {
    table[r + 1][0] = R == 2 ? label("rows", srows[r]) : "";
    for (std::size_t c = 0; c < scols.size(); ++c) {
      auto it = cell.find({index_of(rows, srows[r]), index_of(cols, scols[c])});
      table[r + 1][c + 1] = it == cell.end() ? "-" : it->second;
    }
  }
  std::vector<std::size_t> width(scols.size() + 1, 0);
  for (const auto& row : table)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::ostringstream out;
  out << head.str();
  for (const auto& row : table) {
    for (std::size_t c = 0; c < row.size(); ++c) out << row[c] << std::string(width[c] - row[c].size() + 2, ' ');
    out << '\n';
  }
  return out.str();
}

}  // namespace dtensor
