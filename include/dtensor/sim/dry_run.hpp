// dtensor/sim/dry_run.hpp — a program run once per rank class on the sim communicator.
//
//   auto classes = sim::rank_classes<2>({128, 8}, {...});          // sim/rank_classes.hpp
//   auto reports = sim::dry_run<2>({128, 8}, classes, [](CommPtr world, sim::Recorder& rec) {
//     MetaMesh<"dp", "tp"> mesh(world, {128, 8});                  // groups from the shape
//     rec.phase("forward");  ...the real step on meta tensors...
//   });
//   for (auto& r : reports) std::cout << r.to_table();
//
// For each class, the program runs as the class's first rank of a sim world of the mesh's size
// (comm/sim.hpp), inside a Recorder (sim/report.hpp), on the calling thread; the report stands
// for every rank of the class. Nothing is done per rank of the world.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "dtensor/comm/sim.hpp"
#include "dtensor/core/checked.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/sim/rank_classes.hpp"
#include "dtensor/sim/report.hpp"

namespace dtensor::sim {

/// "rank 17 {2, 1}": how a report names its class.
template <std::size_t N>
std::string class_name(const std::array<int, N>& shape, const RankClass<N>& c) {
  return dtensor::detail::cat("rank ", dtensor::detail::row_major_index(shape, c.coordinate), " ", to_string(c.coordinate));
}

/// program(world, recorder) once per class (see the synopsis); one report per class, in order.
template <std::size_t N, class Program>
std::vector<RankReport> dry_run(const std::array<int, N>& shape, const std::vector<RankClass<N>>& classes,
                                Program&& program) {
  const int world_size = checked_product<int>(shape, "sim::dry_run", "number of ranks");
  std::vector<RankReport> reports;
  for (const auto& c : classes) {
    Recorder recorder;
    program(world(dtensor::detail::row_major_index(shape, c.coordinate), world_size), recorder);
    reports.push_back(recorder.finish(class_name(shape, c), c.ranks));
  }
  return reports;
}

}  // namespace dtensor::sim
