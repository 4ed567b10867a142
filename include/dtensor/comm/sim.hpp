// dtensor/comm/sim.hpp — the dry-run backend: one rank of a world that is not there.
//
//   dtensor::CommPtr world = dtensor::sim::world(/*rank=*/5, /*size=*/16384);
//   DeviceMesh<"dp", "tp"> mesh(world, {2048, 8});   // groups from the shape, no rendezvous
//   dtensor::CommLog log;
//   auto y = redistribute<Layout<Replicate, Replicate>>(x);   // x: a meta_space DTensor
//   log.records();   // what rank 5 would have issued: kinds, groups, sizes, bytes
//
// A sim communicator is rank `rank` of `size` ranks and has no peers: every collective and
// point-to-point call returns at once, completed, touching no buffer (they are meta tensors'
// null pointers in a dry run), after the checks and the CommLog record that every backend
// gets from Communicator (comm/communicator.hpp) — so a dry run's log is the real run's. Nothing
// here costs time or memory in the world size: a collective over 16,384 ranks is one record.
//
// Sub-groups: split(color, key, group_size), what DeviceMesh calls, makes the group from the
// numbers the caller knows. The plain split(color, key) cannot know its group without peers
// and throws. The collective check (set_check_collectives) has nothing to compare against, so
// a sim communicator starts with it off; turned on, it passes and costs an allocation of one
// fingerprint per rank of the group.
#pragma once

#include <memory>
#include <string_view>

#include "dtensor/comm/communicator.hpp"

namespace dtensor::sim {

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(int rank, int size, int world_rank) : Communicator(rank, size, world_rank) {
    set_check_collectives(false);
  }

  std::string_view backend() const override { return "sim"; }

 protected:
  CommPtr do_split(int color, int key) override {
    fail("split", dtensor::detail::cat("color ", color, ", key ", key,
                              ": the sim backend has no peers to learn the group from; use "
                              "split(color, key, group_size) (as DeviceMesh does)"));
  }
  CommPtr do_split_known(int, int key, int group_size) override {
    auto c = std::make_shared<SimCommunicator>(key, group_size, world_rank());
    c->set_label(label());
    return c;
  }
  Work do_all_gather(const void*, void*, std::size_t, DType, bool) override { return {}; }
  Work do_reduce_scatter(const void*, void*, std::size_t, DType, ReduceOp, bool) override { return {}; }
  Work do_all_reduce(const void*, void*, std::size_t, DType, ReduceOp, bool) override { return {}; }
  Work do_all_to_all(const void*, void*, std::size_t, DType, bool) override { return {}; }
  Work do_all_to_all_strided(const void*, const StridedBlocks&, void*, DType, bool) override { return {}; }
  Work do_all_to_all_v(const void*, const std::size_t*, const std::size_t*, void*, const std::size_t*,
                       const std::size_t*, DType, bool) override {
    return {};
  }
  Work do_broadcast(void*, std::size_t, DType, int, bool) override { return {}; }
  Work do_send(const void*, std::size_t, DType, int, int, bool) override { return {}; }
  Work do_recv(void*, std::size_t, DType, int, int, bool) override { return {}; }
  void do_barrier() override {}
};

/// Rank `rank` of a simulated world of `size` ranks.
inline CommPtr world(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("sim::world", dtensor::detail::cat("rank ", rank, " of a world of ", size, " ranks: need 0 <= rank < size"));
  return std::make_shared<SimCommunicator>(rank, size, rank);
}

}  // namespace dtensor::sim
