// dtensor/parallel/data_parallel.hpp — data parallelism (DDP): bucketed all-reduce of gradients.
//
//   nn::ParamList<float, 2> ps;  model.collect(ps);
//   parallel::DataParallel<DeviceMesh<"dp", "tp">> ddp(mesh, {.bucket_bytes = 1 << 20});
//   ...  model.backward(...);                 // gradients of replicated parameters: Partial<avg> on "dp"
//   ddp.all_reduce_gradients(ps);             // one all-reduce per bucket on "dp" -> Replicate
//
// Every rank along "dp" holds the same parameters and differentiates the mean loss of its own
// micro-batch, so the gradient of the global mean loss is the average over "dp" of the local
// ones: Partial<avg> (a gradient recorded as Partial<sum> is summed instead). The collectives:
// exactly one all-reduce on the "dp" group per bucket, buckets as in detail/buckets.hpp (reverse
// parameter order, at most bucket_bytes each, one reduction op each). Parameters sharded on
// "dp" (FSDP) are not this class's business. Every parameter that is replicated on "dp" must
// arrive Partial there: one that is already Replicate means a second sync or a missing
// backward, and is an error.
#pragma once

#include <cstddef>

#include "dtensor/parallel/detail/buckets.hpp"

namespace dtensor::parallel {

struct DataParallelOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;  // PyTorch's default: 25 MiB
};

template <MeshType Mesh, fixed_string Dim = "dp">
class DataParallel {
 public:
  static constexpr std::size_t dim = Mesh::template index_of<Dim>();

  explicit DataParallel(Mesh mesh, DataParallelOptions o = {}) : mesh_(std::move(mesh)), o_(o) {
    if (o.bucket_bytes == 0) throw Error("DataParallel", "bucket_bytes must be > 0", mesh_.rank());
  }

  /// Reduces the pending "dp" part of every gradient: one all-reduce per bucket. Returns the
  /// number of buckets.
  template <class T>
  std::size_t all_reduce_gradients(nn::ParamList<T, Mesh::ndim>& ps) const {
    for (const auto& p : ps) {
      if (!p.layout.placements[dim].is_replicate()) continue;
      if (!p.grad_state->placements[dim].is_partial())
        mesh_.comm().fail("DataParallel::all_reduce_gradients",
                          dtensor::detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                               ", not Partial on \"", Dim.view(),
                                               "\": reduced twice, or no backward since zero_grad"));
    }
    return detail::bucketed_all_reduce(ps, mesh_, dim, o_.bucket_bytes);
  }

  /// The number of buckets all_reduce_gradients would use for these gradients.
  template <class T>
  std::size_t num_buckets(const nn::ParamList<T, Mesh::ndim>& ps) const {
    return detail::plan_buckets(ps, dim, o_.bucket_bytes).size();
  }

  const DataParallelOptions& options() const noexcept { return o_; }

 private:
  Mesh mesh_;
  DataParallelOptions o_;
};

}  // namespace dtensor::parallel
