// dtensor/parallel/detail/buckets.hpp — bucketed all-reduce of pending gradient reductions.
//
// The machinery shared by DataParallel (Partial over "dp") and the sequence-parallel gradient
// sync (Partial<sum> over "tp"). Gradients are taken in reverse registration order (the order a
// backward pass finishes them, as PyTorch's DDP does), grouped into buckets of at most
// bucket_bytes (a gradient larger than that gets a bucket of its own) with one reduction op per
// bucket, copied into one flat buffer, all-reduced with one collective, and copied back. The
// bucket plan depends only on the parameters' extents and layouts, so every rank makes the same.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dtensor/nn/parameter.hpp"

namespace dtensor::parallel::detail {

/// One bucket: indices into the parameter list, their reduction op, the element count.
struct Bucket {
  std::vector<std::size_t> params;
  ReduceOp op = ReduceOp::sum;
  std::size_t numel = 0;
};

/// Buckets over the parameters whose gradient is Partial on mesh dimension `dim`.
template <class T, std::size_t N>
std::vector<Bucket> plan_buckets(const nn::ParamList<T, N>& ps, std::size_t dim, std::size_t bucket_bytes) {
  std::vector<Bucket> out;
  const std::size_t cap = std::max<std::size_t>(1, bucket_bytes / sizeof(T));
  for (std::size_t k = ps.size(); k-- > 0;) {
    const auto& pl = ps[k].grad_state->placements[dim];
    if (!pl.is_partial()) continue;
    const std::size_t n = ps[k].grad.size();
    if (out.empty() || out.back().op != pl.op || (out.back().numel > 0 && out.back().numel + n > cap))
      out.push_back(Bucket{{}, pl.op, 0});
    out.back().params.push_back(k);
    out.back().numel += n;
  }
  return out;
}

/// All-reduces every gradient Partial on mesh dimension `dim` (bucketed) and marks it Replicate
/// there. Returns the number of buckets (= all-reduces issued).
template <class T, std::size_t N, class Mesh>
std::size_t bucketed_all_reduce(nn::ParamList<T, N>& ps, const Mesh& mesh, std::size_t dim,
                                std::size_t bucket_bytes) {
  auto& group = mesh.group(dim);
  const auto buckets = plan_buckets(ps, dim, bucket_bytes);
  std::vector<T> flat;
  for (const auto& b : buckets) {
    flat.resize(b.numel);
    std::size_t off = 0;
    for (std::size_t k : b.params) {
      std::copy(ps[k].grad.begin(), ps[k].grad.end(), flat.begin() + std::ptrdiff_t(off));
      off += ps[k].grad.size();
    }
    group.all_reduce(std::span<T>(flat), b.op);
    off = 0;
    for (std::size_t k : b.params) {
      std::copy_n(flat.begin() + std::ptrdiff_t(off), ps[k].grad.size(), ps[k].grad.begin());
      off += ps[k].grad.size();
      ps[k].grad_state->placements[dim] = PlacementDesc::replicate();
    }
  }
  return buckets.size();
}

}  // namespace dtensor::parallel::detail
