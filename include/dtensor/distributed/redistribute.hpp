// dtensor/distributed/redistribute.hpp — changing a DTensor's layout.
//
//   auto y = redistribute<Layout<Replicate, Shard<1>>>(x);    // or x-> via the free function
//   std::cout << plan_of<decltype(x)::layout, Layout<Replicate, Shard<1>>, Mesh>();
//   auto g = redistribute_backward<From>(grad);               // the adjoint, see below
//
// The plan is computed at compile time (distributed/plan.hpp); running it is the collectives
// of its steps and the copies they need. Uneven chunks travel padded to the largest chunk
// (ceil(n / k)) and are trimmed on arrival. Because torch.chunk's rule puts the padding at the
// tail, a gather or scatter along a leading dimension needs no packing: the gathered buffer is
// the result plus a tail the tensor's extents leave out.
//
// Backward (the adjoint): the gradient of redistribute<To>(x), x in layout From, is the
// redistribution of the gradient from its own layout back to From with Partial replaced by
// Replicate — a gradient every rank computed identically is Replicate, one each rank computed
// its share of is Partial<sum>. So Shard->Replicate goes back by a local chunk (Replicate
// gradient) or a reduce-scatter (Partial gradient), Partial->Replicate by nothing.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dtensor/distributed/agreement.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/distributed/plan.hpp"

namespace dtensor {

namespace detail {

template <class T, class Space>
using FlatBuffer = Tensor<T, 1, Space>;

/// For each j, the piece of `src` whose `dim` range is ranges[j] goes to the start of block j
/// (blocks of shape `block`, back to back in `out`).
template <class T, std::size_t R, class Space>
void pack_blocks(const Tensor<T, R, Space>& src, std::size_t dim, std::span<const Range> ranges,
                 const Shape<R>& block, T* out) {
  const Extent bsize = numel(block);
  for (std::size_t j = 0; j < ranges.size(); ++j) {
    Shape<R> off{}, ext = src.shape();
    off[dim] = ranges[j].begin;
    ext[dim] = ranges[j].size();
    copy_box_raw<Space>(src.data(), src.shape(), off, out + Extent(j) * bsize, block, Shape<R>{}, ext, sizeof(T));
  }
}

/// The inverse: the start of block j goes where `dim` range ranges[j] lies in `dst`.
template <class T, std::size_t R, class Space>
void unpack_blocks(const T* in, const Shape<R>& block, std::size_t dim, std::span<const Range> ranges,
                   Tensor<T, R, Space>& dst) {
  const Extent bsize = numel(block);
  for (std::size_t j = 0; j < ranges.size(); ++j) {
    Shape<R> off{}, ext = dst.shape();
    off[dim] = ranges[j].begin;
    ext[dim] = ranges[j].size();
    copy_box_raw<Space>(in + Extent(j) * bsize, block, Shape<R>{}, dst.data(), dst.shape(), off, ext, sizeof(T));
  }
}

/// The chunks of [0, n) over k ranks.
inline std::vector<Range> chunks_of(Extent n, int k) {
  std::vector<Range> r(static_cast<std::size_t>(k));
  for (int j = 0; j < k; ++j) r[std::size_t(j)] = chunk_range(n, k, j);
  return r;
}

/// True when every dimension before `dim` has extent 1: then blocks split along `dim` are
/// contiguous and in order, and padding them only adds a tail.
template <std::size_t R>
bool leading(const Shape<R>& s, std::size_t dim) {
  for (std::size_t i = 0; i < dim; ++i)
    if (s[i] != 1) return false;
  return true;
}

/// Runs one step of a plan on this rank's piece; `before`/`after` are the layouts around it.
/// Reads `local` and returns a new piece: a step never copies its input first, so the first
/// step of a redistribution reads the caller's tensor in place.
template <class T, std::size_t R, class Space, class Mesh, std::size_t N>
Tensor<T, R, Space> run_step(const Step& s, const LayoutDesc<N>& before, const LayoutDesc<N>& after,
                             const Tensor<T, R, Space>& local, const Mesh& mesh, const Shape<R>& global) {
  using Local = Tensor<T, R, Space>;
  const auto& mshape = mesh.shape();
  const auto& coord = mesh.coordinate();
  const Box<R> bb = dtensor::local_box(before, mshape, coord, global);
  const Box<R> ab = dtensor::local_box(after, mshape, coord, global);
  const auto i = std::size_t(s.mesh_dim);

  switch (s.kind) {
    case StepKind::take_chunk: {
      Shape<R> off{};
      for (std::size_t d = 0; d < R; ++d) off[d] = ab.offset[d] - bb.offset[d];
      auto out = Local::uninitialized(ab.extent);
      copy_box(local, off, out, Shape<R>{}, ab.extent);
      return out;
    }
    case StepKind::replicate_to_partial:
      // Partial<sum>: the rank at coordinate 0 keeps the values; avg, max, min: every rank does.
      if (s.to.op == ReduceOp::sum && coord[i] != 0) return Local(local.shape());  // zeros
      return local;
    case StepKind::shard_to_partial: {
      auto out = Local::uninitialized(ab.extent);
      Space::fill(out.data(), std::size_t(out.numel()), reduction_identity<T>(s.to.op));
      Shape<R> off{};
      for (std::size_t d = 0; d < R; ++d) off[d] = bb.offset[d] - ab.offset[d];
      copy_box(local, Shape<R>{}, out, off, bb.extent);
      return out;
    }
    case StepKind::all_reduce: {  // out of place, straight into the result
      auto& g = mesh.group(i, std::size_t(s.mesh_dim_last));
      auto out = Local::uninitialized(local.shape());
      g.all_reduce(local.span(), out.span(), s.from.op);
      return out;
    }
    default: break;
  }

  auto& g = mesh.group(i);
  const int k = g.size(), me = g.rank();
  if (s.kind == StepKind::all_gather || s.kind == StepKind::reduce_scatter) {
    // The gathered box G (the parent range of d) and this rank's piece P of it.
    const auto d = std::size_t((s.kind == StepKind::all_gather ? s.from : s.to).dim);
    const Box<R>& G = s.kind == StepKind::all_gather ? ab : bb;
    const Box<R>& P = s.kind == StepKind::all_gather ? bb : ab;
    const auto ranges = chunks_of(G.extent[d], k);
    Shape<R> block = G.extent;
    block[d] = chunk_size(G.extent[d], k);
    const Extent bsize = numel(block);
    const bool contiguous = leading(G.extent, d);

    if (s.kind == StepKind::all_gather) {
      const T* send = local.data();
      FlatBuffer<T, Space> padded;
      if (P.extent[d] != block[d]) {  // this rank's chunk is short: pad it to the block
        padded = FlatBuffer<T, Space>(Shape<1>{bsize});
        copy_box_raw<Space>(local.data(), local.shape(), Shape<R>{}, padded.data(), block, Shape<R>{}, local.shape(), sizeof(T));
        send = padded.data();
      }
      if (contiguous) {  // receive straight into the result; the padding is its unused tail
        auto out = Local::with_capacity(G.extent, bsize * k);
        g.all_gather(std::span<const T>(send, std::size_t(bsize)), std::span<T>(out.data(), std::size_t(bsize * k)));
        return out;
      }
      FlatBuffer<T, Space> all = FlatBuffer<T, Space>::uninitialized(Shape<1>{bsize * k});
      g.all_gather(std::span<const T>(send, std::size_t(bsize)), all.span());
      auto out = Local::uninitialized(G.extent);
      unpack_blocks<T, R, Space>(all.data(), block, d, ranges, out);
      return out;
    }
    // reduce_scatter
    const T* send = local.data();
    FlatBuffer<T, Space> packed;
    if (!contiguous || G.extent[d] != block[d] * k) {
      packed = FlatBuffer<T, Space>(Shape<1>{bsize * k});  // zero padding: reduced, then trimmed
      pack_blocks<T, R, Space>(local, d, ranges, block, packed.data());
      send = packed.data();
    }
    if (contiguous) {
      auto out = Local::with_capacity(P.extent, bsize);
      g.reduce_scatter(std::span<const T>(send, std::size_t(bsize * k)), std::span<T>(out.data(), std::size_t(bsize)),
                       s.from.op);
      return out;
    }
    FlatBuffer<T, Space> mine = FlatBuffer<T, Space>::uninitialized(Shape<1>{bsize});
    g.reduce_scatter(std::span<const T>(send, std::size_t(bsize * k)), mine.span(), s.from.op);
    auto out = Local::uninitialized(P.extent);
    copy_box_raw<Space>(mine.data(), block, Shape<R>{}, out.data(), out.shape(), Shape<R>{}, out.shape(), sizeof(T));
    return out;
  }

  // all_to_all: Shard(d) -> Shard(e). This rank holds chunk `me` of d and all of e; it sends
  // chunk j of e to rank j and receives rank j's chunk of d.
  const auto d = std::size_t(s.from.dim), e = std::size_t(s.to.dim);
  const auto d_ranges = chunks_of(ab.extent[d], k);
  const auto e_ranges = chunks_of(bb.extent[e], k);
  Shape<R> block = bb.extent;
  block[d] = chunk_size(ab.extent[d], k);
  block[e] = chunk_size(bb.extent[e], k);
  const Extent bsize = numel(block);
  // Blocks that are already contiguous, in order and unpadded travel without packing: the
  // send side when e is a leading dimension of this piece (S(1) -> S(0) of a matrix), the
  // receive side when d is a leading dimension of the result (S(0) -> S(1)).
  const bool send_direct = leading(bb.extent, e) && bb.extent[e] == block[e] * k && bb.extent[d] == block[d];
  const bool recv_direct = leading(ab.extent, d) && ab.extent[d] == block[d] * k && ab.extent[e] == block[e];
  const T* send = local.data();
  FlatBuffer<T, Space> packed;
  if (!send_direct) {
    packed = FlatBuffer<T, Space>(Shape<1>{bsize * k});  // zero padding: sent, then trimmed
    pack_blocks<T, R, Space>(local, e, e_ranges, block, packed.data());
    send = packed.data();
  }
  auto out = Local::uninitialized(ab.extent);
  if (recv_direct) {
    g.all_to_all(std::span<const T>(send, std::size_t(bsize * k)), out.span());
    return out;
  }
  FlatBuffer<T, Space> recv = FlatBuffer<T, Space>::uninitialized(Shape<1>{bsize * k});
  g.all_to_all(std::span<const T>(send, std::size_t(bsize * k)), recv.span());
  unpack_blocks<T, R, Space>(recv.data(), block, d, d_ranges, out);
  (void)me;
  return out;
}

}  // namespace detail

/// Runs a plan on this rank's piece (the run-time entry point: layouts known only at run time).
/// The first step reads `local` where it is; only an empty plan copies it.
template <class T, std::size_t R, class Space, class Mesh, std::size_t N>
Tensor<T, R, Space> execute(const Plan<N>& plan, const Tensor<T, R, Space>& local, const Mesh& mesh,
                            const Shape<R>& global) {
  if (plan.size == 0) return local;
  LayoutDesc<N> state = plan.from;
  Tensor<T, R, Space> piece;
  for (const Step& s : plan) {
    const LayoutDesc<N> next = apply_step(state, s);
    piece = detail::run_step(s, state, next, &s == plan.begin() ? local : piece, mesh, global);
    state = next;
  }
  return piece;
}

/// The plan redistribute<To> runs on a tensor of layout From, as text.
template <LayoutType From, LayoutType To, MeshType Mesh>
std::string plan_of() {
  static_assert(!changes_partial_op(From::desc, To::desc), DTENSOR_MSG_PARTIAL_OP);
  static_assert(!shard_to_partial_avg(From::desc, To::desc), DTENSOR_MSG_SHARD_AVG);
  constexpr auto plan = plan_redistribution(From::desc, To::desc);
  return describe(plan, Mesh::names);
}

/// The same logical tensor in layout To. Issues exactly the collectives of plan_of<From, To>.
template <LayoutType To, Element T, std::size_t R, class Mesh, class From, class Space>
DTensor<T, R, Mesh, To, Space> redistribute(const DTensor<T, R, Mesh, From, Space>& x) {
  static_assert(To::mesh_ndim == Mesh::ndim, "the target layout needs one placement per mesh dimension");
  static_assert(!changes_partial_op(From::desc, To::desc), DTENSOR_MSG_PARTIAL_OP);
  static_assert(!shard_to_partial_avg(From::desc, To::desc), DTENSOR_MSG_SHARD_AVG);
  constexpr auto plan = plan_redistribution(From::desc, To::desc);
  check_redistribution_agreement<To>(x);
  return DTensor<T, R, Mesh, To, Space>(x.mesh(), x.shape(), execute(plan, x.to_local(), x.mesh(), x.shape()));
}

/// Every element, on every rank (a redistribution to Replicate on every mesh dimension).
template <Element T, std::size_t R, class Mesh, class L, class Space>
Tensor<T, R, Space> full_tensor(const DTensor<T, R, Mesh, L, Space>& x) {
  return redistribute<replicated_layout<Mesh::ndim>>(x).to_local();
}

/// Partial replaced by Replicate: the layout a gradient goes back to.
template <LayoutType L>
struct grad_layout;
template <class Order, Placement... P>
struct grad_layout<BasicLayout<Order, P...>> {
  template <class Q>
  using fix = std::conditional_t<Q::desc.is_partial(), Replicate, Q>;
  using type = BasicLayout<Order, fix<P>...>;
};

/// The backward of redistribute<To>(x) for x in layout From: `grad` (in whatever layout the
/// gradient has) redistributed to From with Partial replaced by Replicate.
template <LayoutType From, Element T, std::size_t R, class Mesh, class G, class Space>
auto redistribute_backward(const DTensor<T, R, Mesh, G, Space>& grad) {
  return redistribute<typename grad_layout<From>::type>(grad);
}

}  // namespace dtensor
