// dtensor/parallel/data_parallel.hpp — data parallelism (DDP): bucketed all-reduce of gradients,
// overlapped with the backward.
//
//   parallel::DataParallel<DeviceMesh<"dp", "tp">> ddp(mesh, {.bucket_bytes = 1 << 20});
//   ddp.attach(model);                        // reduce each unit's gradients as soon as backward has them
//   auto [loss, saved] = model.forward(ids, targets);
//   model.backward(std::move(saved));         // bucket all-reduces start during the backward
//   ddp.finish_gradient_sync();               // wait for them: gradients Replicate on "dp"
//
//   ddp.all_reduce_gradients(params);         // or: all at once after the backward (no overlap)
//
// The data dimension is the mesh's dimension with Role::data (mesh/roles.hpp; "dp" by default),
// or the one named by the second template argument: DataParallel<DeviceMesh<"replica", "tp">,
// "replica">, with no role to declare.
// Every rank along it holds the same parameters and differentiates its share of the global mean
// loss, so each gradient arrives Partial<sum> there (a Partial<avg> one is averaged instead); one
// that is already Replicate means a second sync or a missing backward, and is an error.
//
// The collectives: exactly one all-reduce on the data group per bucket. Buckets (detail/buckets.hpp)
// take gradients in reverse registration order, at most bucket_bytes each, never across a gap in
// memory: the gradients of a flat group (nn/flat_params.hpp) are adjacent, so each bucket is one
// span reduced in place — no gradient is copied (copied_bytes() stays 0 for a model whose
// parameters are flattened). attach() uses the model's grads-ready callback (models::GPT::
// set_grads_ready): when the backward finishes a unit, that unit's buckets are issued
// asynchronously (PyTorch DDP's overlap of communication with the rest of the backward).
// Parameters sharded on the data dimension (FSDP) are not this class's business.
//
// Parameter groups (nn/param_groups.hpp): attach() takes every group of the model, not only its
// units on Mesh. A group on another mesh (a MoE's experts on (edp, ep, tp)) is reduced over that
// mesh's data dimension (Role::data: "edp"), one DataParallel of its own per group, with the same
// bucket size; each of its units ("h.1.experts") is issued when the model fires grads_ready for
// the unit of its part ("h.1"), so it overlaps the backward like the model's own, and
// finish_gradient_sync waits for all (issuing first any unit no hook announced). A group whose
// mesh has no data dimension needs no reduction (every data rank's tokens reached its experts).
// The caller writes no code for the experts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "dtensor/mesh/fixed_string.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/nn/param_groups.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/parallel/detail/buckets.hpp"

namespace dtensor::parallel {

struct DataParallelOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;  // PyTorch's default: 25 MiB
};

namespace detail {
/// The dimension DataParallel reduces over: the one named Dim, or (Dim empty) the data dimension.
template <class Mesh, fixed_string Dim>
constexpr std::size_t data_parallel_dim() {
  if constexpr (Dim.view().empty()) {
    static_assert(has_role<Mesh, Role::data>,
                  "DataParallel needs a mesh dimension with Role::data (\"dp\", or one named by mesh_roles), or "
                  "the dimension's name as its second template argument: DataParallel<Mesh, \"replica\">");
    static_assert(count_role<Mesh, Role::data>() == 1,
                  "DataParallel reduces over one data dimension; this mesh has several (HSDP is fully_shard's business)");
    return role_dim<Mesh, Role::data>;
  } else {
    return Mesh::template index_of<Dim>();
  }
}
}  // namespace detail

template <MeshType Mesh, fixed_string Dim = "">
class DataParallel {
 public:
  static constexpr std::size_t dim = detail::data_parallel_dim<Mesh, Dim>();

  explicit DataParallel(Mesh mesh, DataParallelOptions o = {}) : mesh_(std::move(mesh)), o_(o) {
    if (o.bucket_bytes == 0) throw Error("DataParallel", "bucket_bytes must be > 0", mesh_.rank());
  }
  DataParallel(const DataParallel&) = delete;  // attach() keeps `this` in the model's callback
  DataParallel& operator=(const DataParallel&) = delete;

  /// Reduces the pending data-dimension part of every gradient, one bucket at a time. Returns
  /// the number of buckets (= all-reduces).
  template <class T>
  std::size_t all_reduce_gradients(nn::ParamList<T, Mesh::ndim, mesh_space_t<Mesh>>& ps) {
    check_pending(ps);
    return detail::bucketed_all_reduce(ps, mesh_, dim, options(), &copied_bytes_);
  }

  /// From now on, the model's backward issues each unit's buckets as soon as that unit's
  /// gradients are complete — those of every parameter group (see the top of this file). The
  /// model must outlive this object's use, and stay where it is.
  template <class Model>
  void attach(Model& model) {
    static_assert(nn::require_units<Model>());
    static_assert(requires(std::function<void(std::size_t)> fn) { model.set_grads_ready(std::move(fn)); },
                  "DataParallel::attach needs `set_grads_ready(fn)` on the model (nn::WithUnits gives it)");
    others_.clear();
    for (auto& u : model.units()) nn::materialize_unit(u);  // a deferred model (nn::DeferredInit): drawn whole, DDP keeps it all
    if constexpr (requires { model.parameter_groups(); }) {
      auto groups = model.parameter_groups();
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (attach_group(model, std::get<I + 1>(groups)), ...);
      }(std::make_index_sequence<std::tuple_size_v<decltype(groups)> - 1>{});
    }
    model.set_grads_ready([this, &model](std::size_t unit) {
      issue(model.units().at(unit).params);
      for (auto& g : others_) g.unit_ready(unit);
    });
  }

  /// Waits for every bucket issued since the last call and marks those gradients Replicate on
  /// the data dimension (the other groups': on theirs). Returns the number of buckets.
  std::size_t finish_gradient_sync() {
    std::size_t n = pending_.size();
    for (auto& p : pending_) p.finish();
    pending_.clear();
    for (auto& g : others_) n += g.finish();
    return n;
  }

  /// How many parameter groups beyond Mesh's attach() found that need a reduction.
  std::size_t other_groups() const noexcept { return others_.size(); }

  /// Issues the buckets of one list of gradients asynchronously (what attach's callback does).
  template <class T>
  void issue(nn::ParamList<T, Mesh::ndim, mesh_space_t<Mesh>>& ps) {
    check_pending(ps);
    for (auto& b : detail::plan_buckets(ps, dim, options()))
      pending_.emplace_back(ps, detail::start_bucket(ps, std::move(b), mesh_.group(dim), copied_bytes_));
  }

  /// The number of buckets all_reduce_gradients would use for these gradients.
  template <class T>
  std::size_t num_buckets(const nn::ParamList<T, Mesh::ndim, mesh_space_t<Mesh>>& ps) const {
    return detail::plan_buckets(ps, dim, options()).size();
  }

  /// Gradient bytes copied into and out of packed buckets so far (0 when every bucket was contiguous).
  std::size_t copied_bytes() const {
    std::size_t n = copied_bytes_;
    for (const auto& g : others_) n += g.copied();
    return n;
  }
  const DataParallelOptions& options_given() const noexcept { return o_; }

 private:
  detail::BucketOptions options() const { return {.bucket_bytes = o_.bucket_bytes, .contiguous_only = true}; }

  /// Another parameter group's reduction, type-erased over its mesh (see the top of this file).
  struct OtherGroup {
    std::function<void(std::size_t)> unit_ready;  // the model's unit u is finished: issue the units following it
    std::function<std::size_t()> finish;         // issue what no hook issued, then wait for all
    std::function<std::size_t()> copied;
  };

  template <class Model, class Group>
  void attach_group(Model& model, const Group& g) {
    using GMesh = typename Group::mesh_type;
    if constexpr (has_role<GMesh, Role::data>) {
      for (auto& u : *g.units) nn::materialize_unit(u);
      auto sync = std::make_shared<DataParallel<GMesh>>(*g.mesh, o_);
      auto issued = std::make_shared<std::vector<bool>>(g.units->size(), false);
      auto* units = g.units;
      others_.push_back(
          {[sync, units, issued, follows = nn::followed_units(model.units(), g)](std::size_t u) {
             for (std::size_t k = 0; k < follows.size(); ++k)
               if (follows[k] == u && !(*issued)[k]) {
                 sync->issue((*units)[k].params);
                 (*issued)[k] = true;
               }
           },
           [sync, units, issued] {
             for (std::size_t k = 0; k < units->size(); ++k)
               if (!(*issued)[k]) sync->issue((*units)[k].params);
             std::fill(issued->begin(), issued->end(), false);
             return sync->finish_gradient_sync();
           },
           [sync] { return sync->copied_bytes(); }});
    }
  }

  template <class T>
  void check_pending(const nn::ParamList<T, Mesh::ndim, mesh_space_t<Mesh>>& ps) const {
    for (const auto& p : ps) {
      if (!p.layout.placements[dim].is_replicate()) continue;
      if (!p.grad_state->placements[dim].is_partial())
        mesh_.comm().fail("DataParallel",
                          dtensor::detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                               ", not Partial on the data dimension \"", Mesh::names[dim],
                                               "\": reduced twice, or no backward since zero_grad"));
    }
  }

  /// A bucket in flight, with the list its indices refer to (type-erased over the element type).
  struct Pending {
    template <class T>
    Pending(nn::ParamList<T, Mesh::ndim, mesh_space_t<Mesh>>& ps, detail::PendingBucket<T, mesh_space_t<Mesh>> b)
        : finish([&ps, bucket = std::make_shared<detail::PendingBucket<T, mesh_space_t<Mesh>>>(std::move(b))] {
            detail::finish_bucket(ps, *bucket, dim);
          }) {}
    std::function<void()> finish;
  };

  Mesh mesh_;
  DataParallelOptions o_;
  std::vector<Pending> pending_;
  std::vector<OtherGroup> others_;
  std::size_t copied_bytes_ = 0;
};

}  // namespace dtensor::parallel
