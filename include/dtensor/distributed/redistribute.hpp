// dtensor/distributed/redistribute.hpp — changing a DTensor's layout.
//
//   auto y = redistribute<Layout<Replicate, Shard<1>>>(x);    // a new DTensor
//   redistribute_into(y, x);                                  // into y, reusing its storage
//   auto pending = redistribute_async<Layout<Replicate>>(x);  // split phase: issue now ...
//   ...work that does not touch x...
//   auto z = pending.wait();                                  // ... and finish here
//   std::cout << plan_of<decltype(x)::layout, Layout<Replicate, Shard<1>>, Mesh>();
//   auto g = redistribute_backward<From>(grad);               // the adjoint, see below
//
// The plan is computed at compile time (distributed/plan.hpp); running it is the collectives
// of its steps and the copies they need. Each collective exchanges blocks of one shape
// (distributed/step_geometry.hpp): uneven chunks travel padded and are trimmed on arrival.
// Where the blocks already lie in the tensor back to back (a gather or scatter along a leading
// dimension: torch.chunk's rule puts the padding at the tail) the collective reads the input
// and writes the result in place, with no packing copy. Steps whose group has one rank are
// skipped (mesh sizes are run-time values; the plan is made for every size at once).
//
// Backward (the adjoint): the gradient of redistribute<To>(x), x in layout From, is the
// redistribution of the gradient from its own layout back to From with Partial replaced by
// Replicate — a gradient every rank computed identically is Replicate, one each rank computed
// its share of is Partial<sum>. So Shard->Replicate goes back by a local chunk (Replicate
// gradient) or a reduce-scatter (Partial gradient), Partial->Replicate by nothing.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/comm/work.hpp"
#include "dtensor/distributed/agreement.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/distributed/plan.hpp"
#include "dtensor/distributed/step_geometry.hpp"

namespace dtensor {

namespace detail {

template <class T, class Space>
using FlatBuffer = Tensor<T, 1, Space>;

/// Gives `out` the extents `shape` and room for `capacity` elements, keeping its storage when
/// it is large enough (redistribute_into, and the buffers a plan's steps pass along).
template <class T, std::size_t R, class Space>
void prepare_output(Tensor<T, R, Space>& out, const Shape<R>& shape, Extent capacity) {
  if (out.capacity() >= capacity) out.resize_within(shape);
  else out = Tensor<T, R, Space>::with_capacity(shape, capacity);
}

/// Copies part j (a box in global coordinates) of `src`, which holds box `src_box`, to the
/// start of block j of `blocks` (blocks of shape `block`, back to back).
template <class T, std::size_t R, class Space>
void pack_parts(const T* src, const Box<R>& src_box, const std::vector<Box<R>>& parts, const Shape<R>& block,
                T* blocks) {
  const Extent block_size = numel(block);
  for (std::size_t j = 0; j < parts.size(); ++j) {
    Shape<R> at{};
    for (std::size_t d = 0; d < R; ++d) at[d] = parts[j].offset[d] - src_box.offset[d];
    copy_box_raw<Space>(src, src_box.extent, at, blocks + Extent(j) * block_size, block, Shape<R>{}, parts[j].extent,
                        sizeof(T));
  }
}

/// The inverse: the start of block j goes where part j lies in `dst`, which holds box `dst_box`.
template <class T, std::size_t R, class Space>
void unpack_parts(const T* blocks, const Shape<R>& block, const std::vector<Box<R>>& parts, T* dst,
                  const Box<R>& dst_box) {
  const Extent block_size = numel(block);
  for (std::size_t j = 0; j < parts.size(); ++j) {
    Shape<R> at{};
    for (std::size_t d = 0; d < R; ++d) at[d] = parts[j].offset[d] - dst_box.offset[d];
    copy_box_raw<Space>(blocks + Extent(j) * block_size, block, Shape<R>{}, dst, dst_box.extent, at, parts[j].extent,
                        sizeof(T));
  }
}

/// A step's collective once issued: finish() waits for it and moves what arrived in a staging
/// buffer (when the blocks could not land in place) into the step's output.
template <class T, std::size_t R, class Space>
struct IssuedCollective {
  Work work;
  FlatBuffer<T, Space> send_staging, recv_staging;  // alive until the collective completes
  std::vector<Box<R>> recv_parts;                   // where the staged blocks go
  Shape<R> block{};
  bool staged = false;

  void finish(Tensor<T, R, Space>& out, const Box<R>& out_box) {
    work.wait();
    if (staged) unpack_parts<T, R, Space>(recv_staging.data(), block, recv_parts, out.data(), out_box);
    send_staging = {};
    recv_staging = {};
  }
};

/// The blocking or the asynchronous form of a collective: `call(async)` returns the Work of the
/// asynchronous form, or runs the blocking one and returns a completed Work.
template <class Call>
Work issue(bool async, Call&& call) {
  return call(async);
}

/// Where the received blocks go: straight into `out` (sized for the padded tail) when they
/// land in place, else into a staging buffer that finish() unpacks.
template <class T, std::size_t R, class Space>
T* receive_buffer(IssuedCollective<T, R, Space>& issued, const std::vector<Box<R>>& parts, const Box<R>& out_box,
                  const Shape<R>& block, Tensor<T, R, Space>& out) {
  const Extent total = numel(block) * Extent(parts.size());
  if (blocks_in_place(parts, out_box, block)) {
    prepare_output(out, out_box.extent, std::max(total, numel(out_box.extent)));
    return out.data();
  }
  prepare_output(out, out_box.extent, numel(out_box.extent));
  MemoryTagScope tag(MemoryTag::communication);  // staging, not the caller's activations
  issued.recv_staging = FlatBuffer<T, Space>::uninitialized(Shape<1>{total});
  issued.recv_parts = parts;
  issued.block = block;
  issued.staged = true;
  return issued.recv_staging.data();
}

/// What goes out: the input itself when its parts lie in place and it is long enough to read
/// every block, else the parts packed into a zeroed staging buffer (padding is trimmed).
template <class T, std::size_t R, class Space>
const T* send_buffer(IssuedCollective<T, R, Space>& issued, const std::vector<Box<R>>& parts, const Box<R>& in_box,
                     const Shape<R>& block, const Tensor<T, R, Space>& in) {
  const Extent total = numel(block) * Extent(parts.size());
  if (numel(in_box.extent) >= total && blocks_in_place(parts, in_box, block)) return in.data();
  MemoryTagScope tag(MemoryTag::communication);  // staging, not the caller's activations
  issued.send_staging = FlatBuffer<T, Space>(Shape<1>{total});
  pack_parts<T, R, Space>(in.data(), in_box, parts, block, issued.send_staging.data());
  return issued.send_staging.data();
}

/// The send side of an all-to-all as strided blocks of the input itself, when the backend can
/// read them so (host memory) and a packing copy would otherwise be needed: every part is a
/// whole block, and the parts follow each other along the one dimension `e` in which the
/// block is narrower than the piece (Shard(d) -> Shard(e) with even chunks). Uneven parts,
/// which travel padded, return nothing and take the packing path.
template <class T, std::size_t R, class Space>
std::optional<StridedBlocks> strided_send_blocks(const std::vector<Box<R>>& parts, const Box<R>& in_box,
                                                 const Shape<R>& block, const Tensor<T, R, Space>& in) {
  if constexpr (!std::is_same_v<Space, host_space>) {
    return std::nullopt;
  } else {
    const Extent total = numel(block) * Extent(parts.size());
    if (numel(in_box.extent) >= total && blocks_in_place(parts, in_box, block)) return std::nullopt;  // no copy anyway
    std::size_t split = R;
    for (std::size_t d = 0; d < R; ++d) {
      if (block[d] == in_box.extent[d]) continue;
      if (split != R) return std::nullopt;
      split = d;
    }
    if (split == R || in.numel() != numel(in_box.extent)) return std::nullopt;
    for (std::size_t j = 0; j < parts.size(); ++j)
      for (std::size_t d = 0; d < R; ++d)
        if (parts[j].extent[d] != block[d] ||
            parts[j].offset[d] - in_box.offset[d] != (d == split ? Extent(j) * block[d] : 0))
          return std::nullopt;
    std::size_t rows = 1, inner = 1;
    for (std::size_t d = 0; d < split; ++d) rows *= std::size_t(in_box.extent[d]);
    for (std::size_t d = split + 1; d < R; ++d) inner *= std::size_t(in_box.extent[d]);
    const std::size_t run = std::size_t(block[split]) * inner;
    return StridedBlocks{.rows = rows, .run = run, .row_stride = std::size_t(in_box.extent[split]) * inner,
                         .block_stride = run};
  }
}

// ---------------------------------------------------------------- one function per step kind

/// Shard -> Replicate over the group: every rank's piece, padded to the block, gathered.
template <class T, std::size_t R, class Space>
IssuedCollective<T, R, Space> all_gather_step(Communicator& group, const StepGeometry<R>& g,
                                              const Tensor<T, R, Space>& in, Tensor<T, R, Space>& out, bool async) {
  IssuedCollective<T, R, Space> issued;
  const std::size_t block_size = std::size_t(g.block_elements());
  const T* send = send_buffer(issued, std::vector<Box<R>>{g.before}, g.before, g.block, in);
  T* recv = receive_buffer(issued, g.member_before, g.after, g.block, out);
  std::span<const T> send_span(send, block_size);
  std::span<T> recv_span(recv, block_size * std::size_t(g.group_size));
  issued.work = issue(async, [&](bool a) {
    if (a) return group.all_gather_async(send_span, recv_span);
    group.all_gather(send_span, recv_span);
    return Work{};
  });
  return issued;
}

/// Partial -> Shard over the group: block j is the part rank j keeps, reduced.
template <class T, std::size_t R, class Space>
IssuedCollective<T, R, Space> reduce_scatter_step(Communicator& group, const StepGeometry<R>& g, ReduceOp op,
                                                  const Tensor<T, R, Space>& in, Tensor<T, R, Space>& out,
                                                  bool async) {
  IssuedCollective<T, R, Space> issued;
  const std::size_t block_size = std::size_t(g.block_elements());
  const T* send = send_buffer(issued, g.member_after, g.before, g.block, in);
  T* recv = receive_buffer(issued, std::vector<Box<R>>{g.after}, g.after, g.block, out);
  std::span<const T> send_span(send, block_size * std::size_t(g.group_size));
  std::span<T> recv_span(recv, block_size);
  issued.work = issue(async, [&](bool a) {
    if (a) return group.reduce_scatter_async(send_span, recv_span, op);
    group.reduce_scatter(send_span, recv_span, op);
    return Work{};
  });
  return issued;
}

/// Shard(d) -> Shard(e) over the group: this rank sends rank j the part of its piece that j
/// holds afterwards, and receives from rank j the part of j's piece that it holds.
template <class T, std::size_t R, class Space>
IssuedCollective<T, R, Space> all_to_all_step(Communicator& group, const StepGeometry<R>& g,
                                              const Tensor<T, R, Space>& in, Tensor<T, R, Space>& out, bool async) {
  IssuedCollective<T, R, Space> issued;
  std::vector<Box<R>> to_members(std::size_t(g.group_size)), from_members(std::size_t(g.group_size));
  for (std::size_t j = 0; j < to_members.size(); ++j) {
    to_members[j] = intersect(g.before, g.member_after[j]);
    from_members[j] = intersect(g.member_before[j], g.after);
  }
  const std::size_t total = std::size_t(g.block_elements()) * std::size_t(g.group_size);
  const auto strided = strided_send_blocks(to_members, g.before, g.block, in);
  const T* send = strided ? in.data() : send_buffer(issued, to_members, g.before, g.block, in);
  T* recv = receive_buffer(issued, from_members, g.after, g.block, out);
  std::span<const T> send_span(send, strided ? std::size_t(in.numel()) : total);
  std::span<T> recv_span(recv, total);
  issued.work = issue(async, [&](bool a) {
    if (strided) {
      if (a) return group.all_to_all_async(send_span, *strided, recv_span);
      group.all_to_all(send_span, *strided, recv_span);
    } else {
      if (a) return group.all_to_all_async(send_span, recv_span);
      group.all_to_all(send_span, recv_span);
    }
    return Work{};
  });
  return issued;
}

/// Partial -> Replicate over the group, out of place, straight into the result.
template <class T, std::size_t R, class Space>
IssuedCollective<T, R, Space> all_reduce_step(Communicator& group, ReduceOp op, const Tensor<T, R, Space>& in,
                                              Tensor<T, R, Space>& out, bool async) {
  IssuedCollective<T, R, Space> issued;
  prepare_output(out, in.shape(), in.numel());
  std::span<const T> send_span = in.span();
  std::span<T> recv_span = out.span();
  issued.work = issue(async, [&](bool a) {
    if (a) return group.all_reduce_async(send_span, recv_span, op);
    group.all_reduce(send_span, recv_span, op);
    return Work{};
  });
  return issued;
}

/// Replicate -> Shard: this rank's chunk of its piece.
template <class T, std::size_t R, class Space>
void take_chunk_step(const Box<R>& before, const Box<R>& after, const Tensor<T, R, Space>& in,
                     Tensor<T, R, Space>& out) {
  prepare_output(out, after.extent, numel(after.extent));
  Shape<R> at{};
  for (std::size_t d = 0; d < R; ++d) at[d] = after.offset[d] - before.offset[d];
  copy_box(in, at, out, Shape<R>{}, after.extent);
}

/// Replicate -> Partial: the values or zeros (replica_keeps_values).
template <class T, std::size_t R, class Space>
void replicate_to_partial_step(bool keeps_values, const Tensor<T, R, Space>& in, Tensor<T, R, Space>& out) {
  prepare_output(out, in.shape(), in.numel());
  if (keeps_values) Space::copy(out.data(), in.data(), in.bytes());
  else Space::zero(out.data(), out.bytes());
}

/// Shard -> Partial: the piece in place in a tensor of the parent range, the rest the op's identity.
template <class T, std::size_t R, class Space>
void shard_to_partial_step(ReduceOp op, const Box<R>& before, const Box<R>& after, const Tensor<T, R, Space>& in,
                           Tensor<T, R, Space>& out) {
  prepare_output(out, after.extent, numel(after.extent));
  Space::fill(out.data(), std::size_t(out.numel()), reduction_identity<T>(op));
  Shape<R> at{};
  for (std::size_t d = 0; d < R; ++d) at[d] = before.offset[d] - after.offset[d];
  copy_box(in, Shape<R>{}, out, at, before.extent);
}

/// Running a plan on this rank's piece, one step at a time: run(async) runs the steps up to
/// and including the next collective, which it issues asynchronously when asked; finish()
/// completes it and runs the rest. Steps pass their pieces through two scratch tensors (each
/// reading the other's), the last writes into `result`'s storage. `input` is read in place
/// and must stay alive and unchanged until finish() returns.
template <class T, std::size_t R, class Space, class Mesh, std::size_t N>
class PlanExecution {
 public:
  using Local = Tensor<T, R, Space>;

  PlanExecution(const Plan<N>& plan, const Local& input, const Mesh& mesh, const Shape<R>& global, Local result)
      : plan_(plan), input_(&input), mesh_(mesh), global_(global), result_(std::move(result)), state_(plan.from) {
    for (std::size_t k = 0; k < plan.size; ++k)
      if (runs(plan.steps[k])) last_ = k, any_ = true;
  }

  /// Runs local steps and the next collective (issued asynchronously when `async`).
  [[gnu::noinline]] void run(bool async) {
    while (next_ < plan_.size) {
      const Step& s = plan_.steps[next_];
      const LayoutDesc<N> after = apply_step(state_, s);
      const bool issued = runs(s) && run_step(s, after, async);
      state_ = after;
      ++next_;
      if (issued) return;
    }
    if (!any_) copy_input();
  }

  /// Completes the collective in flight and runs the remaining steps; returns the result.
  [[gnu::noinline]] Local finish() {
    complete_in_flight();
    while (next_ < plan_.size) {
      run(false);
      complete_in_flight();
    }
    return std::move(result_);
  }

 private:
  enum Piece : int { input_piece = -1, scratch_0 = 0, scratch_1 = 1, result_piece = 2 };

  // A step on a group of one rank moves nothing: its piece before and after is the same.
  bool runs(const Step& s) const { return s.group_size(mesh_.shape()) > 1; }
  const Local& piece(int p) const { return p == input_piece ? *input_ : p == result_piece ? result_ : scratch_[std::size_t(p)]; }
  Local& output(int p) { return p == result_piece ? result_ : scratch_[std::size_t(p)]; }

  // Runs step s (plan step next_) on the current piece; returns whether it issued a collective.
  bool run_step(const Step& s, const LayoutDesc<N>& after, bool async) {
    const Local& in = piece(current_);
    const int out_piece = next_ == last_ ? result_piece : current_ == scratch_0 ? scratch_1 : scratch_0;
    Local& out = output(out_piece);
    current_ = out_piece;
    const auto& coord = mesh_.coordinate();
    const Box<R> after_box = local_box(after, mesh_.shape(), coord, global_);
    if (!s.is_collective()) {
      const Box<R> before_box = local_box(state_, mesh_.shape(), coord, global_);
      switch (s.kind) {
        case StepKind::take_chunk: take_chunk_step(before_box, after_box, in, out); break;
        case StepKind::replicate_to_partial:
          replicate_to_partial_step(replica_keeps_values(s.to, coord[std::size_t(s.mesh_dim)]), in, out);
          break;
        default: shard_to_partial_step(s.to.op, before_box, after_box, in, out); break;
      }
      return false;
    }
    Communicator& group = mesh_.group(std::size_t(s.mesh_dim), std::size_t(s.mesh_dim_last));
    in_flight_box_ = after_box;
    if (s.kind == StepKind::all_reduce) {
      in_flight_ = all_reduce_step(group, s.from.op, in, out, async);
    } else {
      const auto g = step_geometry(state_, after, s.mesh_dim, s.mesh_dim_last, mesh_.shape(), coord, global_);
      switch (s.kind) {
        case StepKind::all_gather: in_flight_ = all_gather_step(group, g, in, out, async); break;
        case StepKind::reduce_scatter: in_flight_ = reduce_scatter_step(group, g, s.from.op, in, out, async); break;
        default: in_flight_ = all_to_all_step(group, g, in, out, async); break;
      }
    }
    has_in_flight_ = true;
    return true;
  }

  void complete_in_flight() {
    if (!has_in_flight_) return;
    has_in_flight_ = false;
    in_flight_.finish(output(current_), in_flight_box_);
  }

  // No step moves anything (an empty plan, or every step on a group of one rank): the result
  // is a copy of the input, which the caller keeps.
  void copy_input() {
    if (&result_ == input_ || (result_.data() == input_->data() && input_->data())) return;  // redistribute_into(x, x)
    prepare_output(result_, input_->shape(), input_->numel());
    Space::copy(result_.data(), input_->data(), input_->bytes());
  }

  Plan<N> plan_;
  const Local* input_;
  Mesh mesh_;
  Shape<R> global_;
  Local result_;
  LayoutDesc<N> state_;            // the layout before plan step next_
  std::size_t next_ = 0;           // the next plan step
  std::size_t last_ = 0;           // the last step that runs: it writes the result
  bool any_ = false;               // whether any step runs
  int current_ = input_piece;      // which tensor holds the current piece
  std::array<Local, 2> scratch_;
  IssuedCollective<T, R, Space> in_flight_;
  Box<R> in_flight_box_{};         // the box the collective in flight produces
  bool has_in_flight_ = false;
};

}  // namespace detail

/// Runs a plan on this rank's piece (the run-time entry point: layouts known only at run time).
/// The first step reads `local` where it is; the result reuses `result`'s storage when it is
/// large enough.
template <class T, std::size_t R, class Space, class Mesh, std::size_t N>
Tensor<T, R, Space> execute(const Plan<N>& plan, const Tensor<T, R, Space>& local, const Mesh& mesh,
                            const Shape<R>& global, Tensor<T, R, Space> result = {}) {
  detail::PlanExecution<T, R, Space, Mesh, N> run(plan, local, mesh, global, std::move(result));
  run.run(false);
  return run.finish();
}

namespace detail {
/// The plan of From -> To, with the layout errors as compile errors.
template <LayoutType From, LayoutType To>
constexpr auto checked_plan() {
  static_assert(From::mesh_ndim == To::mesh_ndim, "the target layout needs one placement per mesh dimension");
  static_assert(!changes_partial_op(From::desc, To::desc),
                "Partial<a> to Partial<b> with a != b changes the value: reduce to Replicate or Shard first");
  static_assert(!shard_to_partial_avg(From::desc, To::desc),
                "Shard to Partial<avg> has no meaning: a shard is not an average over ranks");
  return layout_plan<From, To>;
}
}  // namespace detail

/// The plan redistribute<To> runs on a tensor of layout From, as text.
template <LayoutType From, LayoutType To, MeshType Mesh>
std::string plan_of() {
  constexpr auto plan = detail::checked_plan<From, To>();
  return describe(plan, Mesh::names);
}

/// The same logical tensor in layout To. Issues exactly the collectives of plan_of<From, To>
/// (less those on mesh dimensions of size 1).
template <LayoutType To, Element T, std::size_t R, class Mesh, class From, class Space>
DTensor<T, R, Mesh, To, Space> redistribute(const DTensor<T, R, Mesh, From, Space>& x) {
  constexpr auto plan = detail::checked_plan<From, To>();
  const auto agreement = check_redistribution_agreement<To>(x);
  return DTensor<T, R, Mesh, To, Space>(x.mesh(), x.shape(), execute(plan, x.to_local(), x.mesh(), x.shape()));
}

/// redistribute<To> of a temporary (or moved-from) x: where no step of the plan runs — the two
/// layouts place alike, or every step's group is one rank — the result takes x's storage, where
/// redistribute<To>(const&) copies it (a Linear's exit in a 1-rank step was 2 % of its time,
/// issue 32). Otherwise, and in what it checks and issues, the same as redistribute<To>(x).
template <LayoutType To, Element T, std::size_t R, class Mesh, class From, class Space>
DTensor<T, R, Mesh, To, Space> redistribute(DTensor<T, R, Mesh, From, Space>&& x) {
  constexpr auto plan = detail::checked_plan<From, To>();
  bool moves = false;
  for (const auto& s : plan) moves = moves || s.group_size(x.mesh().shape()) > 1;
  if (moves) return redistribute<To>(std::as_const(x));
  const auto agreement = check_redistribution_agreement<To>(x);
  auto local = std::move(x.local());
  return DTensor<T, R, Mesh, To, Space>(x.mesh(), x.shape(), std::move(local));
}

/// redistribute<To>(x) into `result`, whose storage is reused when it is large enough (a
/// training loop that redistributes the same tensor every step allocates nothing); its former
/// contents, extents and mesh are replaced by x's.
template <Element T, std::size_t R, class Mesh, class To, class From, class Space>
void redistribute_into(DTensor<T, R, Mesh, To, Space>& result, const DTensor<T, R, Mesh, From, Space>& x) {
  constexpr auto plan = detail::checked_plan<From, To>();
  const auto agreement = check_redistribution_agreement<To>(x);
  auto local = execute(plan, x.to_local(), x.mesh(), x.shape(), std::move(result.local()));
  result = DTensor<T, R, Mesh, To, Space>(x.mesh(), x.shape(), std::move(local));
}

/// A redistribution in flight (redistribute_async): wait() returns the result. Until then the
/// source DTensor must stay alive and unchanged, as the buffers of an asynchronous collective.
template <Element T, std::size_t R, class Mesh, class To, class Space>
class PendingDTensor {
 public:
  PendingDTensor(detail::PlanExecution<T, R, Space, Mesh, Mesh::ndim> run, Mesh mesh, const Shape<R>& global)
      : run_(std::move(run)), mesh_(std::move(mesh)), global_(global) {}

  /// Completes the collective in flight, runs the plan's remaining steps, returns the result.
  DTensor<T, R, Mesh, To, Space> wait() { return DTensor<T, R, Mesh, To, Space>(mesh_, global_, run_.finish()); }

 private:
  detail::PlanExecution<T, R, Space, Mesh, Mesh::ndim> run_;
  Mesh mesh_;
  Shape<R> global_;
};

/// Split-phase redistribute<To>(x): runs the plan up to its first collective, issues that one
/// asynchronously and returns; work done before wait() overlaps with it. Issues the same
/// collectives as redistribute<To> (later ones, if the plan has several, run inside wait()).
template <LayoutType To, Element T, std::size_t R, class Mesh, class From, class Space>
PendingDTensor<T, R, Mesh, To, Space> redistribute_async(const DTensor<T, R, Mesh, From, Space>& x) {
  constexpr auto plan = detail::checked_plan<From, To>();
  const auto agreement = check_redistribution_agreement<To>(x);  // blocking, before anything is in flight
  detail::PlanExecution<T, R, Space, Mesh, Mesh::ndim> run(plan, x.to_local(), x.mesh(), x.shape(), {});
  run.run(true);
  return PendingDTensor<T, R, Mesh, To, Space>(std::move(run), x.mesh(), x.shape());
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
/// redistribute_backward of a temporary: its storage is the result where no step runs (as above).
template <LayoutType From, Element T, std::size_t R, class Mesh, class G, class Space>
auto redistribute_backward(DTensor<T, R, Mesh, G, Space>&& grad) {
  return redistribute<typename grad_layout<From>::type>(std::move(grad));
}

}  // namespace dtensor
