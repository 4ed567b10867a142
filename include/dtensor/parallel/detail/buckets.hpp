// dtensor/parallel/detail/buckets.hpp — bucketed all-reduce of pending gradient reductions.
//
// The machinery shared by DataParallel (Partial over the data dimension) and the
// sequence-parallel gradient sync (Partial<sum> over the tensor dimension). Gradients are taken
// in reverse registration order (the order a backward pass finishes them, as PyTorch's DDP does)
// and grouped into buckets of at most bucket_bytes (a gradient larger than that gets a bucket of
// its own) with one reduction op per bucket. A bucket whose gradients are adjacent in memory —
// neighbours in a flat group (nn/flat_params.hpp) — is all-reduced in place, as one span; with
// contiguous_only (DDP) a bucket never spans a gap, so no gradient is ever copied. Otherwise
// (the small, scattered sequence-parallel gradients) the bucket is packed into one buffer and
// unpacked after. The bucket plan depends only on the parameters' extents, layouts and places in
// their groups, so every rank makes the same.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dtensor/comm/work.hpp"
#include "dtensor/kernels/cast.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::parallel::detail {

struct BucketOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;
  bool contiguous_only = true;  // break buckets at gaps in memory instead of packing
};

/// One bucket: indices into the parameter list (reverse order), their reduction op, the element count.
struct Bucket {
  std::vector<std::size_t> params;
  ReduceOp op = ReduceOp::sum;
  std::size_t numel = 0;
};

/// dst = src in memory space Space: a copy, or a conversion where a gradient is held in a
/// narrower type than the bucket's (ParamRef::narrow_grad: widened to pack, rounded back after).
template <MemorySpace Space, class To, class From>
void convert_flat(std::span<To> dst, std::span<From> src) {
  if constexpr (std::is_same_v<To, std::remove_const_t<From>>) {
    Space::copy(dst.data(), src.data(), src.size_bytes());
  } else {
    auto out = nn::detail::flat_view<Space>(dst);
    kernels::cast_into(out, nn::detail::flat_view<Space>(src));
  }
}

/// Whether gradient `next` (visited after `prev` in reverse order) ends where `prev` begins.
template <class T, std::size_t N, class Space>
bool adjacent(const nn::ParamRef<T, N, Space>& next, const nn::ParamRef<T, N, Space>& prev) {
  return next.precedes(prev);
}

/// Buckets over the parameters whose gradient is Partial on mesh dimension `dim`.
template <class T, std::size_t N, class Space>
std::vector<Bucket> plan_buckets(const nn::ParamList<T, N, Space>& ps, std::size_t dim, BucketOptions o) {
  std::vector<Bucket> out;
  const std::size_t cap = std::max<std::size_t>(1, o.bucket_bytes / sizeof(T));
  for (std::size_t k = ps.size(); k-- > 0;) {
    const auto& pl = ps[k].grad_state->placements[dim];
    if (!pl.is_partial()) continue;
    const std::size_t n = ps[k].grad_size();
    const bool gap = !out.empty() && o.contiguous_only && !adjacent(ps[k], ps[out.back().params.back()]);
    if (out.empty() || out.back().op != pl.op || gap || (out.back().numel > 0 && out.back().numel + n > cap))
      out.push_back(Bucket{{}, pl.op, 0});
    out.back().params.push_back(k);
    out.back().numel += n;
  }
  return out;
}

/// A bucket's all-reduce in flight: its handle and, for a packed bucket, the packed buffer (in
/// the gradients' memory space, counted as communication memory).
template <class T, class Space = host_space>
struct PendingBucket {
  Bucket bucket;
  Work work;
  Tensor<T, 1, Space> packed;
  bool is_packed = false;
};

/// Issues the bucket's all-reduce on `group` (asynchronously): in place when its gradients are
/// contiguous, else through a packed buffer. `copied_bytes` counts the bytes packed.
template <class T, std::size_t N, class Space>
PendingBucket<T, Space> start_bucket(const nn::ParamList<T, N, Space>& ps, Bucket b, Communicator& group,
                                     std::size_t& copied_bytes) {
  PendingBucket<T, Space> p{std::move(b), {}, {}};
  const auto& idx = p.bucket.params;
  bool contiguous = !ps[idx.front()].grad_is_narrow();  // a narrow (bf16) gradient is widened into the packed buffer
  for (std::size_t j = 1; j < idx.size(); ++j) contiguous = contiguous && adjacent(ps[idx[j]], ps[idx[j - 1]]);
  if (contiguous) {
    std::span<T> all(ps[idx.back()].grad.data(), p.bucket.numel);  // the last visited starts lowest
    p.work = group.all_reduce_async(std::span<const T>(all), all, p.bucket.op);
    return p;
  }
  {
    MemoryTagScope tag(MemoryTag::communication);
    p.packed = Tensor<T, 1, Space>::uninitialized(Shape<1>{Extent(p.bucket.numel)});
  }
  p.is_packed = true;
  std::size_t off = 0;
  for (std::size_t k : idx) {
    ps[k].visit_grad([&](auto g) { convert_flat<Space>(std::span<T>(p.packed.data() + off, g.size()), g); });
    off += ps[k].grad_size();
  }
  copied_bytes += 2 * p.bucket.numel * sizeof(T);  // packed and unpacked
  p.work = group.all_reduce_async(std::span<const T>(p.packed.span()), p.packed.span(), p.bucket.op);
  return p;
}

/// Waits for the bucket, unpacks it if it was packed, and marks its gradients Replicate on `dim`.
template <class T, std::size_t N, class Space>
void finish_bucket(nn::ParamList<T, N, Space>& ps, PendingBucket<T, Space>& p, std::size_t dim) {
  p.work.wait();
  std::size_t off = 0;
  for (std::size_t k : p.bucket.params) {
    if (p.is_packed)
      ps[k].visit_grad([&](auto g) { convert_flat<Space>(g, std::span<T>(p.packed.data() + off, g.size())); });
    off += ps[k].grad_size();
    ps[k].grad_state->placements[dim] = PlacementDesc::replicate();
  }
}

/// All-reduces every gradient Partial on mesh dimension `dim` (bucketed, one bucket at a time)
/// and marks it Replicate there. Returns the number of buckets (= all-reduces issued).
template <class T, std::size_t N, class Space, class Mesh>
std::size_t bucketed_all_reduce(nn::ParamList<T, N, Space>& ps, const Mesh& mesh, std::size_t dim, BucketOptions o,
                                std::size_t* copied_bytes = nullptr) {
  std::size_t copied = 0;
  const auto buckets = plan_buckets(ps, dim, o);
  for (const auto& b : buckets) {
    auto p = start_bucket(ps, b, mesh.group(dim), copied);
    finish_bucket(ps, p, dim);
  }
  if (copied_bytes) *copied_bytes += copied;
  return buckets.size();
}

}  // namespace dtensor::parallel::detail
