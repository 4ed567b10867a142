// dtensor/parallel/fully_shard.hpp — FSDP / ZeRO-1, 2, 3 and HSDP over a model's flat units.
//
//   using Mesh = DeviceMesh<"dp", "fsdp", "tp">;          // "dp": replicate (HSDP), "fsdp": shard, "tp": tensor
//   nn::GPT<float, Mesh, parallel::MegatronPlan<true>> model(mesh, cfg);
//   auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3, .prefetch = 2});
//   optim::AdamW<float, 3> opt(fsdp.params(), {...});    // the optimizer steps over this rank's shards
//   for (...) {
//     opt.zero_grad();
//     auto [loss, saved] = model.forward(ids, targets);  // ZeRO-3: all-gathers each unit before its forward
//     model.backward(std::move(saved));                  // ... and before its backward; reduce-scatters its grads
//     fsdp.finish_gradient_sync();                       // wait; HSDP: all-reduce on "dp"; gradients reduced
//     parallel::sequence_parallel_grads(fsdp.params(), mesh);   // under SP, as without FSDP
//     optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
//     opt.step();
//     fsdp.sync_parameters();                            // ZeRO-1/2: all-gather the updated parameters
//   }
//
// The model (nn::GPT, nn::Sequential, any nn::WithUnits model: units() and set_hooks(nn::UnitHooks), nn/units.hpp)
// keeps one flat group per unit (embed, blocks, head). Each unit's flat buffer is Shard<0> over
// the mesh dimension with Role::data_shard (torch.chunk, uneven sizes allowed; see
// detail/fsdp_unit.hpp) — flattened with the context dimension when that follows it ("fsdp*cp":
// under context parallelism the context ranks shard too, torchtitan's dp_shard_cp; the
// gradient, Partial<sum> on both, is reduce-scattered once over the flattened group,
// FsdpShardDims); this rank keeps its shard of the values (the master copy, in M), of the
// gradients (in M) and, through params(), of the optimizer state. The stages:
//
//   stage 1 (ZeRO-1)  full parameters and gradients stay; per unit, as backward completes it,
//                     one reduce-scatter of its gradients on the shard dimension (the optimizer
//                     needs only this rank's shard); sync_parameters: one all-gather per unit.
//                     With T == M the master values are this rank's slice of the full values and
//                     the gradient shard its slice of the full gradients (no state held twice:
//                     4Ψ + 4Ψ + 8Ψ/N bytes in fp32 with AdamW; DDP is this over one shard rank).
//   stage 2 (ZeRO-2)  as 1, but the unit's full gradients exist only from its backward to its
//                     reduction; the gradient shard is its own buffer (T == M: 4Ψ + 12Ψ/N).
//   stage 3 (ZeRO-3)  as 2, and the unit's full parameters exist only around its forward and
//                     its backward: one all-gather before each (2 per unit per step), freed
//                     after the forward (reshard_after_forward) and after the backward.
//   HSDP              a mesh dimension with Role::data ("dp") of size > 1 besides the shard one:
//                     after the unit's reduction on the shard dimension, one all-reduce of this
//                     rank's gradient shard on the replicate dimension (per unit).
//   FSDP over TP      the groups hold the tensor-parallel pieces already (a "tp" split first),
//                     and FSDP shards those flat buffers on the data-shard dimension after it.
//
// Prefetch: `prefetch` units may be unsharded at once. With 2, the all-gather of unit i+1
// (forward) or i−1 (backward) is issued asynchronously when unit i starts, so it travels while
// unit i computes; with 1 each unit is gathered when it starts (no overlap). events() records
// the order (tests assert it).
//
// Mixed precision (FSDP2's MixedPrecisionPolicy): the model computes in its element type T (a
// GPT<bfloat16> computes in bf16) and the master values, the gradient shard and the optimizer
// state are M (fully_shard<float>(model_bf16, ...)); parameters are all-gathered in T;
// gradients are reduced in M (reduce_in_compute_dtype: in T). With T == M nothing is converted
// and every collective runs in place on the groups' storage.
//
// Gradient accumulation: set_requires_gradient_sync(false) before the backwards of the first
// micro-batches (their gradients accumulate in the units' full buffers, no collective), true
// before the last; finish_gradient_sync then reduces the sum once. Pipeline stages
// (pipeline/sharded_pipeline.hpp) keep sync off for the whole step and call reduce_gradients()
// after a stage's last backward instead, and unshard() / reshard() around the stage's part of
// the schedule (ZeRO-3: one all-gather per unit per step, whatever the micro-batches).
//
// CPU offload (FSDP2's CPUOffloadPolicy, ZeRO-Offload): fully_shard<M, host_space>(model, ...)
// keeps the master values, gradient shards and so the optimizer state on the host while the
// model computes on the GPU. The collectives still run on the model's buffers (device memory);
// each reduced gradient shard is copied to the host and added there, the optimizer steps on the
// host, and each all-gather sends the updated shard copied (and narrowed to T) back from the
// host: per unit and step, one device-to-host copy of the gradient shard and one host-to-device
// copy of the value shard, c elements each. params() is then a host list (the optimizer is a
// host optimizer). The space is a type because the optimizer's list is: the offload_optimizer
// option only asks for it (true with a device model's own space is an error naming the call;
// for a host model both are the host and nothing changes).
//
// Parameter offload (ZeRO-Infinity's, docs/offload.md): FsdpOptions::offload_params_dir puts
// every unit's separate master shard (ZeRO-3's parameter shard; the fp32 master of a bf16 model
// at any stage) in a file per unit and rank in that directory, mapped into memory
// (optim/detail/offload_file.hpp FileMapping): the optimizer's views, the all-gather and the
// checkpoint read and write it in place, so the arithmetic is the in-memory run's bit for bit,
// while the kernel's page cache stages it. Each all-gather prefetches the next unit's shard in
// its direction (forward: the next unit, backward: the one before) and drops its own from the
// process's memory once sent; sync_parameters() (every step, after the optimizer) starts
// writing the updated shards behind and drops them. A master that is the model's own values
// (ZeRO-1/2 with M == T) has nothing separate to offload and stays. A directory that is missing,
// not writable or without room fails on every rank of the mesh (dtensor::Error naming the
// directory, the bytes and the failed ranks) and leaves no file. Host memory spaces only.
//
// Communication is only what the table above says; every collective is recorded by CommLog.
// The model's own ParamRefs (model.collect, units()[u].params) do not survive a release: use
// params() for the optimizer, gradient clipping and the sequence-parallel sync.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtensor/mesh/roles.hpp"
#include "dtensor/nn/param_groups.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/optim/detail/offload_file.hpp"
#include "dtensor/parallel/detail/fsdp_unit.hpp"

namespace dtensor::parallel {

struct FsdpOptions {
  int stage = 3;                                // 1, 2 or 3 (ZeRO's stages)
  std::optional<bool> reshard_after_forward{};  // ZeRO-3: free each unit after its forward (default true)
  int prefetch = 2;                             // units unsharded at once (>= 1; 1 = no prefetch)
  bool reduce_in_compute_dtype = false;         // reduce gradients in T (bf16) instead of M (fp32)
  bool offload_optimizer = false;               // CPU offload of master values and optimizer state
  bool reduce_replicas = true;                  // HSDP: all-reduce on the replicate dimension; off: each
                                                // replica keeps its gradient (still Partial there), for parallel/sync/
  // ZeRO-1 with T != M: accumulate the gradients in a full buffer of M per unit (Megatron's
  // distributed optimizer with fp32 gradient accumulation, 6 + 12/N bytes per parameter in bf16
  // with fp32 master values and AdamW); the model's T gradients exist only around a unit's backward.
  bool accumulate_grads_in_master = false;
  // Parameter offload (see the top of this file): the separate master shards in files in this
  // existing, writable directory on local disk; empty: in memory.
  std::string offload_params_dir{};
};

/// What fully_shard did, in order (unit indices), for tests and traces.
struct FsdpEvent {
  enum Kind { gather_issued, gather_done, compute_begin, compute_end, reshard, reduce_issued, reduce_done };
  Kind kind;
  std::size_t unit;
  bool backward;
};

/// Bytes this rank holds now, by kind.
struct FsdpMemory {
  std::size_t params = 0;  // the units' full values (resident ones, padding included)
  std::size_t grads = 0;   // the units' full gradients (resident ones)
  std::size_t master = 0;  // master values of this rank's shards
  std::size_t grad_shards = 0;
  std::size_t disk = 0;    // master values in files (FsdpOptions::offload_params_dir): not in memory
  std::size_t total() const { return params + grads + master + grad_shards; }
};

namespace detail {
/// The memory space of a model's parameters (its units' flat groups).
template <class Model>
using model_space_t =
    typename std::remove_cvref_t<decltype(*std::declval<Model&>().units().front().group)>::space;
}  // namespace detail

/// StateSpace: where the master values, gradient shards and optimizer state live (the model's
/// space, or host_space for CPU offload). OverData: shard over the mesh's one Role::data
/// dimension, no replicate dimension (a parameter group on a mesh without a data-shard
/// dimension: the experts over "edp"; FullyShardGroups below).
template <class Model, MeshType Mesh, class M, MemorySpace StateSpace = detail::model_space_t<Model>, bool OverData = false>
class FullyShard {
  static_assert(nn::require_units<Model>());
  using Unit = std::remove_cvref_t<decltype(std::declval<Model&>().units().front())>;
  using Group = typename decltype(Unit::group)::element_type;
  using T = typename Group::element_type;
  using Space = typename Group::space;
  static constexpr std::size_t N = Mesh::ndim;
  using Shard = detail::UnitShard<T, M, N, Space, StateSpace>;
  template <class E>
  using Buffer = Tensor<E, 1, Space>;

 public:
  static_assert(OverData || count_role<Mesh, Role::data_shard>() == 1,
                "fully_shard needs exactly one mesh dimension with Role::data_shard (\"fsdp\", \"dp_shard\", \"zero\")");
  static_assert(OverData || count_role<Mesh, Role::data>() <= 1,
                "fully_shard: at most one replicate (Role::data) dimension, for HSDP");
  static_assert(!OverData || count_role<Mesh, Role::data>() == 1,
                "fully_shard: a parameter group's mesh without a data-shard dimension needs exactly one data "
                "dimension (Role::data, e.g. the experts' \"edp\") to shard over");
  /// The mesh dimensions the units are sharded over: shard_dim (data-shard) .. shard_last (the
  /// context dimension when it follows: one flattened group, "fsdp*cp"; detail/fsdp_unit.hpp).
  using ShardDims = FsdpShardDims<Mesh, OverData>;
  static constexpr std::size_t shard_dim = ShardDims::first;
  static constexpr std::size_t shard_last = ShardDims::last;
  static constexpr std::size_t replicate_dim = OverData ? N : role_dim<Mesh, Role::data>;  // N when there is none
  static_assert(replicate_dim >= N || !ShardDims::covers(replicate_dim));

  FullyShard(Model& model, Mesh mesh, FsdpOptions o) : model_(model), mesh_(std::move(mesh)), o_(o) {
    if (o.stage < 1 || o.stage > 3)
      throw Error("fully_shard", dtensor::detail::cat("stage ", o.stage, " is not a ZeRO stage (1, 2 or 3)"), mesh_.rank());
    if (o.prefetch < 1)
      throw Error("fully_shard", dtensor::detail::cat("prefetch ", o.prefetch, " must be >= 1 (units unsharded at once)"),
                  mesh_.rank());
    if (o.reshard_after_forward.value_or(false) && o.stage != 3)
      throw Error("fully_shard", dtensor::detail::cat("reshard_after_forward needs stage 3, not ", o.stage), mesh_.rank());
    if (o.offload_optimizer && !std::is_same_v<StateSpace, host_space>)
      throw Error("fully_shard", dtensor::detail::cat("offload_optimizer for a model in ", Space::name,
                                                      " memory: the shards' memory space is a type, call "
                                                      "fully_shard<M, host_space>(model, mesh, options)"),
                  mesh_.rank());
    if (o.accumulate_grads_in_master && (o.stage != 1 || o.reduce_in_compute_dtype || !std::is_same_v<StateSpace, Space>))
      throw Error("fully_shard",
                  dtensor::detail::cat("accumulate_grads_in_master needs stage 1 (not ", o.stage,
                                       "), reductions in the master type (reduce_in_compute_dtype is ",
                                       o.reduce_in_compute_dtype ? "true" : "false",
                                       ") and no offload (the state space is ", StateSpace::name, ", the model's ", Space::name, ")"),
                  mesh_.rank());
    reshard_after_forward_ = o.stage == 3 && o.reshard_after_forward.value_or(true);
    check_units();
    if (!o.offload_params_dir.empty() && !(std::is_same_v<StateSpace, host_space> && holds_data_v<StateSpace>))
      throw Error("fully_shard", dtensor::detail::cat("offload_params_dir with the state in ", StateSpace::name,
                                                      " memory: parameter offload maps files into host memory"),
                  mesh_.rank());
    std::string error;  // parameter offload: this rank's failure to make its files
    const int size = ShardDims::size(mesh_), coord = ShardDims::coordinate(mesh_);
    for (auto& u : model_.units()) {
      // Stages 1/2: the shard makes room for the in-place all-gather (values kept) and, where it
      // can, keeps its master values and gradient shard in the full buffers (fsdp_unit.hpp).
      units_.push_back(std::make_unique<Shard>(u.group->name(), u.group, size, coord, shard_dim, shard_last, o.stage,
                                               o.accumulate_grads_in_master));
      auto& s = *units_.back();
      if (!o.offload_params_dir.empty()) error = offload_master(s, error);  // before the views are handed out
      s.group->set_sharded();  // an optimizer over the model's own ParamRefs now fails (optim/optimizer.hpp)
      if (o.stage == 3) s.group->release_values();
      if (o.stage >= 2 || s.main_grad.numel() > 0) s.group->release_grads();
      for (auto& p : s.segments) params_.push_back(p);
    }
    if (!o.offload_params_dir.empty()) {
      std::vector<optim::detail::OffloadFile*> files;
      for (auto& f : offloaded_) files.push_back(f.file.get());
      std::size_t bytes = 0, planned = 0;  // made; meant (every separate master shard)
      for (auto& f : offloaded_) bytes += f.file ? f.file->bytes() : 0;
      for (auto& u : units_) planned += u->master_in_values ? 0 : u->shard_size() * sizeof(M);
      // A failure anywhere: every rank throws, its files removed (the mappings go with this object).
      optim::detail::agree_on_offload(&mesh_.comm(), error, files, "fully_shard", o.offload_params_dir,
                                       dtensor::detail::cat(planned, " bytes of master values on this rank"));
      disk_bytes_ = bytes;
      dtensor::detail::ledger_record<disk_ledger>(MemoryTag::optimizer_state, std::int64_t(disk_bytes_));
      for (auto& f : offloaded_) f.map.release(0, f.map.bytes());  // written: the file holds them now
    }
    install_hooks();
  }
  FullyShard(const FullyShard&) = delete;  // the model's hooks hold `this`
  FullyShard& operator=(const FullyShard&) = delete;
  ~FullyShard() {
    try {
      model_.set_hooks({});
      for (auto& u : units_) wait_gather(*u);
      for (auto& u : units_) finish_reduce(*u, false);
    } catch (...) {  // a failed collective is reported where it was waited on, not here
    }
    if (disk_bytes_ > 0) dtensor::detail::ledger_record<disk_ledger>(MemoryTag::optimizer_state, -std::int64_t(disk_bytes_));
  }

  /// This rank's shards of every unit's parameters (master values and gradient shards), for the
  /// optimizer, gradient clipping and the sequence-parallel gradient sync.
  nn::ParamList<M, N, StateSpace>& params() noexcept { return params_; }

  /// Off: the backward's gradients accumulate in the units' full buffers, unreduced (no_sync).
  void set_requires_gradient_sync(bool on) { sync_ = on; }
  bool requires_gradient_sync() const noexcept { return sync_; }

  /// Waits for every unit's reduction, adds the result to the gradient shards and, for HSDP,
  /// all-reduces each unit's shard on the replicate dimension first. Returns the number of
  /// units reduced.
  std::size_t finish_gradient_sync() {
    std::size_t n = 0;
    for (auto& u : units_) n += finish_reduce(*u, true);
    return n;
  }

  /// Issues the reduction of every unit's accumulated gradients now: after backwards run with
  /// set_requires_gradient_sync(false), e.g. a pipeline stage's last backward of a step, so
  /// that the reductions overlap the rest of the schedule. finish_gradient_sync waits for them.
  /// Returns the number issued.
  std::size_t reduce_gradients() {
    std::size_t n = 0;
    for (auto& unit : units_) {
      auto& s = *unit;
      if (s.reducing || (!s.group->grads_resident() && s.main_grad.numel() == 0)) continue;
      // Reduced already (during the backward, with sync on): ZeRO-1's full gradients stay
      // resident, but nothing in them is pending.
      bool pending = false;
      for (const auto& e : s.group->entries()) pending = pending || e.has_grad;
      if (!pending) continue;
      check_pending(s);
      issue_reduce(s);
      ++n;
    }
    return n;
  }

  /// ZeRO-3: all-gathers every unit now and keeps them unsharded until reshard(): the hooks
  /// neither gather nor free them meanwhile (a pipeline stage's UNSHARD before its first
  /// forward of a step, so its micro-batches share one all-gather per unit). Stages 1 and 2
  /// keep their values anyway: nothing to do.
  void unshard() {
    if (o_.stage != 3) return;
    for (std::size_t u = 0; u < units_.size(); ++u) issue_gather(u, false);
    for (auto& u : units_) wait_gather(*u);
    held_ = true;
  }
  /// ZeRO-3: frees every unit's full values again (RESHARD), ending unshard().
  void reshard() {
    if (o_.stage != 3) return;
    held_ = false;
    for (std::size_t u = 0; u < units_.size(); ++u) reshard_unit(u);
  }

  /// ZeRO-1/2: all-gathers every unit's updated shard into its full values (one all-gather per
  /// unit). ZeRO-3: nothing (the next forward gathers).
  /// Parameter offload: then starts writing every unit's updated master shard to its file and
  /// drops it from the process's memory (ZeRO-3: the next forward reads it back, prefetched).
  void sync_parameters() {
    if (o_.stage != 3) {
      for (std::size_t u = 0; u < units_.size(); ++u) issue_gather(u, false);
      for (auto& u : units_) wait_gather(*u);
    }
    for (auto& f : offloaded_) {
      f.map.write_behind();
      f.map.release(0, f.map.bytes());
    }
  }

  /// Zeroes the gradient shards (and ZeRO-1's full gradients), nothing pending.
  void zero_grad() {
    for (auto& p : params_) p.zero_grad();
    for (auto& u : units_) {
      u->grad_reduced = false;
      u->carried = {};
      if (u->main_grad.numel() > 0) u->zero_full_grads();
    }
    for (auto& u : units_)
      if (u->group->grads_resident()) {
        nn::detail::zero_flat<Space>(u->group->grads());
        reset_grad_states(*u);
      }
  }

  /// Bytes held now (see FsdpMemory); the optimizer's state is the optimizer's.
  FsdpMemory memory() const {
    FsdpMemory m;
    for (const auto& u : units_) {
      m.params += u->group->values_storage().size() * sizeof(T);
      m.grads += u->group->grads_storage().size() * sizeof(T) + std::size_t(u->main_grad.numel()) * sizeof(M);
      m.master += u->master_bytes();     // 0 where they are the full values' slice
      m.grad_shards += u->grad_bytes();  // 0 where the shard lives in the full gradients
    }
    m.disk = disk_bytes_;
    return m;
  }
  /// The most units whose full values were resident or being gathered at once (ZeRO-3).
  std::size_t peak_unsharded_units() const noexcept { return peak_unsharded_; }
  const std::vector<FsdpEvent>& events() const noexcept { return events_; }
  void clear_events() { events_.clear(); }
  std::size_t num_units() const noexcept { return units_.size(); }
  const FsdpOptions& options() const noexcept { return o_; }
  bool reshard_after_forward() const noexcept { return reshard_after_forward_; }

 private:
  // ---------------------------------------------------------------- checks

  void check_units() {
    auto& units = model_.units();
    std::unordered_map<std::string, std::string> owner;  // parameter -> unit
    for (std::size_t i = 0; i < units.size(); ++i) {
      const auto& g = units[i].group;
      if (!g || g->size() == 0)
        throw Error("fully_shard", dtensor::detail::cat("unit ", i, g ? " (" + g->name() + ")" : std::string(),
                                                        " has no parameters: a unit must own some"), mesh_.rank());
      for (std::size_t j = 0; j < i; ++j)
        if (units[j].group == g)
          throw Error("fully_shard", dtensor::detail::cat("units ", j, " and ", i, " share the group ", g->name()),
                      mesh_.rank());
      for (const auto& e : g->entries()) {
        auto [it, fresh] = owner.emplace(e.name, g->name());
        if (!fresh)
          throw Error("fully_shard", dtensor::detail::cat("parameter ", e.name, " is in unit ", it->second,
                                                          " and in unit ", g->name(),
                                                          ": a module shared by two units cannot be sharded twice"),
                      mesh_.rank());
      }
    }
    if (units.empty()) throw Error("fully_shard", "the model has no units", mesh_.rank());
  }

  // ---------------------------------------------------------------- hooks

  void install_hooks() {
    nn::UnitHooks h;
    if (o_.stage == 3) {
      h.pre_forward = [this](std::size_t u) { pre_compute(u, false); };
      h.post_forward = [this](std::size_t u) {
        events_.push_back({FsdpEvent::compute_end, u, false});
        if (reshard_after_forward_ && !held_) reshard_unit(u);
      };
      h.pre_backward = [this](std::size_t u) { pre_compute(u, true); };
    } else if (o_.stage == 2) {
      h.pre_backward = [this](std::size_t u) {  // the full gradients exist only around the unit's backward
        auto& s = *units_[u];
        if (!s.group->grads_resident()) s.group->materialize_grads(s.padded());
      };
    } else {
      h.pre_backward = [this](std::size_t u) {
        auto& s = *units_[u];
        carry_reduced_grad(s);
        if (!s.group->grads_resident()) s.group->materialize_grads(s.padded());  // main_grad: around the backward
      };
    }
    h.grads_ready = [this](std::size_t u) { grads_ready(u); };
    model_.set_hooks(std::move(h));
  }

  /// Unit u is about to compute: its values resident (waiting for a prefetch, or gathering now),
  /// then the next units' all-gathers issued, up to `prefetch` unsharded at once.
  void pre_compute(std::size_t u, bool backward) {
    auto& s = *units_[u];
    if (!s.group->values_resident() || s.gathering) {
      issue_gather(u, backward);
      wait_gather(s);
    }
    if (backward && !s.group->grads_resident()) s.group->materialize_grads(s.padded());
    events_.push_back({FsdpEvent::compute_begin, u, backward});
    for (int k = 1; k < o_.prefetch; ++k) {
      const auto next = backward ? std::ptrdiff_t(u) - k : std::ptrdiff_t(u) + k;
      if (next < 0 || next >= std::ptrdiff_t(units_.size())) break;
      issue_gather(std::size_t(next), backward);
    }
  }

  void grads_ready(std::size_t u) {
    auto& s = *units_[u];
    if (s.main_grad.numel() > 0 && s.group->grads_resident()) {
      // Megatron's fp32 accumulation: this backward's T gradients added into main_grad, then freed.
      auto wide = Shard::template make_buffer<M>(s.padded(), MemoryTag::communication, false);
      detail::convert_into<Space>(wide.span(), std::span<const T>(s.group->grads_storage().first(s.padded())));
      detail::add_into<Space>(s.main_grad.span(), std::span<const M>(wide.span()));
      s.group->release_grads();
    }
    if (o_.stage == 3) {
      if (!held_) reshard_unit(u);
      if (!s.group->grads_resident()) return;  // no gradient came (cannot happen for a model's own unit)
    }
    if (!sync_) return;  // accumulate in the full buffer (no_sync)
    check_pending(s);
    // Earlier units' reductions (issued while this one computed) have had time: finish them and
    // add them into their gradient shards, so that their full gradients and the reduce-scatter's
    // output go now (at most two units' of each live at once, not every unit's until
    // finish_gradient_sync: on a one-rank shard dimension, DDP, the output is a whole unit).
    for (std::size_t v = u + 1; v < units_.size(); ++v) finish_reduce(*units_[v], true);
    issue_reduce(s);
  }

  // ---------------------------------------------------------------- all-gather

  void issue_gather(std::size_t u, bool backward) {
    auto& s = *units_[u];
    if (s.gathering || (s.group->values_resident() && o_.stage == 3)) return;
    s.group->materialize_values(s.padded());
    s.gather_send = Shard::template make_buffer<T>(s.chunk, MemoryTag::communication, true);  // padding stays 0
    if (!offloaded_.empty()) {  // parameter offload: the next unit in this direction read ahead
      const std::size_t next = backward ? u - 1 : u + 1;  // u - 1 wraps past 0 to a large index: none
      if (next < units_.size()) offloaded_[next].map.prefetch(0, offloaded_[next].map.bytes());
    }
    detail::convert_across<Space, StateSpace>(s.gather_send.span().first(s.shard_size()), std::span<const M>(s.master.span()));
    if (!offloaded_.empty()) offloaded_[u].map.release(0, offloaded_[u].map.bytes());  // sent: back to the file
    s.gather = ShardDims::group(mesh_).all_gather_async(std::span<const T>(s.gather_send.span()), s.group->values_storage());
    s.gathering = true;
    events_.push_back({FsdpEvent::gather_issued, u, backward});
    peak_unsharded_ = std::max(peak_unsharded_, unsharded_now());
  }

  void wait_gather(Shard& s) {
    if (!s.gathering) return;
    s.gathering = false;
    s.gather.wait();
    s.gather_send = {};
    events_.push_back({FsdpEvent::gather_done, index_of(s), false});
  }

  void reshard_unit(std::size_t u) {
    auto& s = *units_[u];
    wait_gather(s);
    s.group->release_values();
    events_.push_back({FsdpEvent::reshard, u, false});
  }

  std::size_t unsharded_now() const {
    std::size_t n = 0;
    for (const auto& u : units_) n += u->group->values_resident() || u->gathering;
    return n;
  }

  // ---------------------------------------------------------------- reduction

  /// Every pending gradient is Partial on every dimension of the shard group (under context
  /// parallelism on "cp" as on "fsdp": the reduce-scatter over the flattened group sums both).
  void check_pending(const Shard& s) const {
    for (const auto& e : s.group->entries())
      for (std::size_t d = shard_dim; d <= shard_last; ++d) {
        if (e.has_grad && !e.grad_state.placements[d].is_partial())
          mesh_.comm().fail("fully_shard",
                            dtensor::detail::cat("gradient of ", e.name, " in unit ", s.name, " is ", to_string(e.grad_state),
                                                 ", not Partial on the ", d == shard_dim ? "data-shard" : "context",
                                                 " dimension \"", Mesh::names[d], "\" of the shard group: reduced twice?"));
        else if (e.has_grad && e.grad_state.placements[d].op != e.grad_state.placements[shard_dim].op)
          mesh_.comm().fail("fully_shard",
                            dtensor::detail::cat("gradient of ", e.name, " in unit ", s.name, " is ", to_string(e.grad_state),
                                                 ": one reduce-scatter over the shard group needs one reduction op on \"",
                                                 Mesh::names[shard_dim], "\" and \"", Mesh::names[d], "\""));
      }
  }

  /// ZeRO-1 with the gradient shard in the full gradient buffer: a reduced gradient still there
  /// when the next backward starts (no zero_grad in between: accumulation over steps) is moved
  /// aside and the buffer zeroed, so that the backward accumulates this rank's local gradient
  /// from 0 and the next finish_reduce adds the moved one back.
  void carry_reduced_grad(Shard& s) {
    if (!s.grad_in_full || !s.grad_reduced) return;
    s.grad_reduced = false;
    bool held = false;
    for (const auto& seg : s.segments) held = held || *seg.has_grad;
    if (held) {
      s.carried = Shard::template make_buffer<M, StateSpace>(s.shard_size(), MemoryTag::gradients, false);
      if (s.grad_narrow) detail::convert_into<Space>(s.carried.span(), std::span<const T>(s.grad_low.span()));  // exact
      else detail::convert_into<StateSpace>(s.carried.span(), std::span<const M>(s.grad.span()));
    }
    s.zero_full_grads();
  }

  /// Issues the unit's reduction on the shard group: a reduce-scatter of the full gradients
  /// (every stage: ZeRO-1 too needs only its shard), in M or T.
  void issue_reduce(Shard& s) {
    auto& group = ShardDims::group(mesh_);
    // The full gradients of T (main_grad: released; the reduction reads main_grad in M).
    const auto full = s.group->grads_resident() ? s.group->grads_storage().first(s.padded()) : std::span<T>();
    s.grad_op = pending_op(s);
    if (reduce_in_m()) {
      std::span<M> send;
      if constexpr (std::is_same_v<T, M>) send = full;
      else if (s.main_grad.numel() > 0) send = s.main_grad.span();
      else {
        s.reduce_wide = Shard::template make_buffer<M>(full.size(), MemoryTag::communication, false);
        detail::convert_into<Space>(s.reduce_wide.span(), std::span<const T>(full));
        send = s.reduce_wide.span();
      }
      s.reduced_wide = Shard::template make_buffer<M>(s.chunk, MemoryTag::communication, false);
      s.reduce = group.reduce_scatter_async(std::span<const M>(send), s.reduced_wide.span(), s.grad_op);
    } else {
      s.reduced_narrow = Shard::template make_buffer<T>(s.chunk, MemoryTag::communication, false);
      s.reduce = group.reduce_scatter_async(std::span<const T>(full), s.reduced_narrow.span(), s.grad_op);
    }
    s.reducing = true;
    // Until its reduction is added into the shard, the shard's gradient is not this step's:
    // Partial on the shard dimension from now on, so that an optimizer step taken before
    // finish_gradient_sync fails (optim::detail::check_reduced) instead of stepping on a stale
    // gradient (finish_collective says so again once the collective is done).
    for (auto& seg : s.segments)
      for (std::size_t d = shard_dim; d <= shard_last; ++d) seg.grad_state->placements[d] = PlacementDesc::partial(s.grad_op);
    events_.push_back({FsdpEvent::reduce_issued, index_of(s), true});
  }

  /// The pending reduction of the unit's gradients on the shard dimension (sum, or avg).
  ReduceOp pending_op(const Shard& s) const {
    for (const auto& e : s.group->entries())
      if (e.has_grad && e.grad_state.placements[shard_dim].is_partial()) return e.grad_state.placements[shard_dim].op;
    return ReduceOp::sum;
  }

  bool reduce_in_m() const { return std::is_same_v<T, M> || !o_.reduce_in_compute_dtype; }

  /// Waits for the unit's collective on the shard dimension (this rank's part is then in
  /// reduced_*); ZeRO-2/3 free the full gradients, ZeRO-1 zeroes them (consumed: the next step
  /// starts from 0) unless the gradient shard lives in them (then finish_reduce does).
  void finish_collective(Shard& s) {
    if (!s.reducing || s.reduce_waited) return;
    s.reduce.wait();
    s.reduce_waited = true;
    if (o_.stage != 1) s.group->release_grads();
    else if (!s.grad_in_full) nn::detail::zero_flat<Space>(s.group->grads_storage());
    s.reduce_wide = {};
    remember_grad_states(s);
    reset_grad_states(s);
    // Until finish_gradient_sync adds the reduction into the shard, the shard's gradient is
    // not this step's: Partial on the shard dimension, so that an optimizer step taken before
    // it fails (optim::detail::check_reduced) instead of stepping on a stale gradient.
    for (std::size_t k = 0; k < s.segments.size(); ++k) {
      auto pending = s.pending_states[k];
      for (std::size_t d = shard_dim; d <= shard_last; ++d) pending.placements[d] = PlacementDesc::partial(s.grad_op);
      *s.segments[k].grad_state = pending;
    }
  }

  /// Finishes the unit's reduction (HSDP: then the all-reduce on the replicate dimension) and
  /// adds it into the gradient shard. Returns whether there was one.
  bool finish_reduce(Shard& s, bool accumulate) {
    if (!s.reducing) return false;
    finish_collective(s);
    s.reducing = false;
    s.reduce_waited = false;
    if (!accumulate) return true;
    const std::size_t n = s.shard_size();
    // The reduced part holds at least this rank's n elements (c >= n after a reduce-scatter).
    // The reduced part in M in the shards' space: as it is, or widened and/or moved (CPU offload).
    auto add_to_shard = [&](auto reduced) {
      using E = typename decltype(reduced)::element_type;
      replicate_reduce(reduced, s.grad_op);
      if (s.grad_narrow) {
        if constexpr (std::is_same_v<Space, StateSpace>) {
          // The T shard += the reduction, summed in M and rounded to T once (the held part and a
          // carried one widen exactly).
          auto sum = Shard::template make_buffer<M>(n, MemoryTag::communication, false);
          detail::convert_into<Space>(sum.span(), std::span<const E>(reduced));
          if (s.grad_in_full) {
            s.zero_full_grads();
            if (s.carried.numel() > 0) detail::add_into<Space>(sum.span(), std::span<const M>(s.carried.span()));
            s.carried = {};
            s.grad_reduced = true;
          } else {
            auto held = Shard::template make_buffer<M>(n, MemoryTag::communication, false);
            detail::convert_into<Space>(held.span(), std::span<const T>(s.grad_low.span()));
            detail::add_into<Space>(sum.span(), std::span<const M>(held.span()));
          }
          detail::convert_into<Space>(s.grad_low.span(), std::span<const M>(sum.span()));
        }
      } else if (s.grad_in_full) {
        if constexpr (std::is_same_v<Space, StateSpace>) {
          // The shard is (a part of) the full gradient buffer: the buffer to 0 but for the shard,
          // which becomes the reduced gradient, plus one carried over from before this backward
          // (carry_reduced_grad): the same sum as adding this one to that.
          s.zero_full_grads();
          detail::convert_into<Space>(s.grad.span(), std::span<const E>(reduced));
          if (s.carried.numel() > 0) detail::add_into<Space>(s.grad.span(), std::span<const M>(s.carried.span()));
          s.carried = {};
          s.grad_reduced = true;
        }
      } else if constexpr (std::is_same_v<E, M> && std::is_same_v<Space, StateSpace>) {
        detail::add_into<StateSpace>(s.grad.span(), std::span<const M>(reduced));
      } else {
        auto incoming = Shard::template make_buffer<M, StateSpace>(n, MemoryTag::communication, false);
        detail::convert_across<StateSpace, Space>(incoming.span(), std::span<const E>(reduced));
        detail::add_into<StateSpace>(s.grad.span(), std::span<const M>(incoming.span()));
      }
    };
    if (reduce_in_m()) add_to_shard(s.reduced_wide.span().first(n));
    else add_to_shard(s.reduced_narrow.span().first(n));
    s.reduced_wide = {};
    s.reduced_narrow = {};
    for (std::size_t k = 0; k < s.segments.size(); ++k) {
      *s.segments[k].grad_state = s.pending_states[k];
      *s.segments[k].has_grad = true;
    }
    events_.push_back({FsdpEvent::reduce_done, index_of(s), true});
    return true;
  }

  /// HSDP: the all-reduce of this rank's gradient shard on the replicate dimension (none when
  /// the mesh has no such dimension or it has one rank).
  template <class E>
  void replicate_reduce(std::span<E> shard, ReduceOp op) {
    if constexpr (replicate_dim < N) {
      if (o_.reduce_replicas && mesh_.size(replicate_dim) > 1) mesh_.group(replicate_dim).all_reduce(shard, op);
    }
  }

  /// The segments' gradient states once reduced: the entry's, with the shard group's dimensions
  /// Shard<0> (of the flat buffer) and the replicate dimension reduced; the tensor dimension as it was
  /// (Partial<sum> under sequence parallelism, for sequence_parallel_grads).
  void remember_grad_states(Shard& s) {
    s.pending_states.clear();
    for (const auto& e : s.group->entries()) {
      if (s.overlap(e).size() == 0) continue;
      auto st = ShardDims::sharded(e.grad_state);
      if constexpr (replicate_dim < N)
        if (o_.reduce_replicas) st.placements[replicate_dim] = PlacementDesc::replicate();
      s.pending_states.push_back(st);
    }
  }

  void reset_grad_states(Shard& s) {
    for (auto& e : s.group->entries()) {
      e.grad_state = e.layout;
      e.has_grad = false;
    }
  }

  std::size_t index_of(const Shard& s) const {
    for (std::size_t i = 0; i < units_.size(); ++i)
      if (units_[i].get() == &s) return i;
    return units_.size();
  }

  Model& model_;
  Mesh mesh_;
  FsdpOptions o_;
  bool reshard_after_forward_ = true;
  bool sync_ = true;
  bool held_ = false;  // unshard() called: the hooks leave the full values in place
  std::vector<std::unique_ptr<Shard>> units_;
  nn::ParamList<M, N, StateSpace> params_;
  std::vector<FsdpEvent> events_;
  std::size_t peak_unsharded_ = 0;
  // Parameter offload: per unit, its master's file and mapping (none where the master is the
  // model's own values); their bytes on the ledger's disk.
  struct OffloadedMaster {
    std::unique_ptr<optim::detail::OffloadFile> file;
    optim::detail::FileMapping map;  // declared after the file: unmapped before it is removed
  };
  std::vector<OffloadedMaster> offloaded_;
  std::size_t disk_bytes_ = 0;

  /// Parameter offload of unit s (the last built): its master values copied into a file of
  /// their own and the unit's views pointed there. `error`: an earlier unit's failure (then
  /// nothing more is made); returns this rank's error so far.
  std::string offload_master(Shard& s, std::string error) {
    offloaded_.emplace_back();
    if (!error.empty() || s.master_in_values || s.shard_size() == 0) return error;
    auto& f = offloaded_.back();
    f.file = std::make_unique<optim::detail::OffloadFile>(o_.offload_params_dir, s.shard_size() * sizeof(M), mesh_.rank(),
                                                          "fsdp-params");
    if (!f.file->error().empty()) {
      error = f.file->error();
      f.file.reset();
      return error;
    }
    f.map = optim::detail::FileMapping(*f.file);
    M* at = static_cast<M*>(f.map.data());
    std::copy_n(s.master.data(), s.shard_size(), at);
    s.master = Tensor<M, 1, StateSpace>::view(at, Shape<1>{Extent(s.shard_size())});  // the buffer in memory goes
    s.master_on_disk = true;
    for (auto& p : s.segments) p.value = std::span<M>(at + p.offset, p.value.size());
    return error;
  }
};

namespace detail {
/// One parameter group's units as a model FullyShard can wrap: units() and the hooks, which
/// FullyShardGroups fires when the model fires the unit each group unit follows.
template <class Unit>
class GroupUnits {
 public:
  explicit GroupUnits(std::vector<Unit>& units) : units_(&units) {}
  std::vector<Unit>& units() noexcept { return *units_; }
  void set_hooks(nn::UnitHooks h) { hooks_ = std::move(h); }
  const nn::UnitHooks& hooks() const noexcept { return hooks_; }

 private:
  std::vector<Unit>* units_;
  nn::UnitHooks hooks_;
};

/// The FSDP of one parameter group beyond the model's mesh: over the group mesh's data-shard
/// dimension (and data, HSDP) where it has one, else over its one data dimension ("edp").
template <class Group, class M, MemorySpace StateSpace>
struct GroupShard {
  using Unit = typename Group::unit_type;
  using GMesh = typename Group::mesh_type;
  static constexpr bool over_data = count_role<GMesh, Role::data_shard>() == 0;
  using Fsdp = FullyShard<GroupUnits<Unit>, GMesh, M, StateSpace, over_data>;
  std::unique_ptr<GroupUnits<Unit>> view;
  std::unique_ptr<Fsdp> fsdp;
  std::vector<std::vector<std::size_t>> following;  // the model's unit u -> this group's units that follow it
};

template <class Model>
constexpr std::size_t parameter_group_count() {
  if constexpr (requires(Model& m) { m.parameter_groups(); })
    return std::tuple_size_v<decltype(std::declval<Model&>().parameter_groups())>;
  else return 1;
}

template <class Model, class M, MemorySpace StateSpace, class Seq>
struct group_shards;
template <class Model, class M, MemorySpace StateSpace, std::size_t... I>
struct group_shards<Model, M, StateSpace, std::index_sequence<0, I...>> {
  using Groups = nn::parameter_groups_t<Model>;
  using type = std::tuple<GroupShard<std::tuple_element_t<I, Groups>, M, StateSpace>...>;
};
}  // namespace detail

/// FSDP over every parameter group of a model (nn/param_groups.hpp): the model's units on its
/// mesh as FullyShard, and each other group (a MoE's experts on (edp, ep, tp)) sharded over its
/// own mesh's data dimension(s) by a FullyShard of its own, whose hooks run when the model runs
/// the unit each of its units follows (nn::followed_units: "h.1.experts" with "h.1"). So ZeRO-3
/// all-gathers a block's experts with the block, every stage reduce-scatters their gradients as
/// the block's backward ends, and params() is one nn::ParamSet (one optimizer, one clip) over
/// all groups' shards. fully_shard(model, ...) returns this for a model with several groups.
template <class Model, MeshType Mesh, class M, MemorySpace StateSpace>
class FullyShardGroups {
  using Own = FullyShard<Model, Mesh, M, StateSpace>;
  static constexpr std::size_t groups = detail::parameter_group_count<Model>();
  using Shards = typename detail::group_shards<Model, M, StateSpace, std::make_index_sequence<groups>>::type;
  static_assert(std::is_same_v<StateSpace, detail::model_space_t<Model>>,
                "fully_shard: CPU offload of a model with parameters on several meshes is not supported (the "
                "parameter set's lists live on their meshes' memory space)");
  template <class S>
  using list_of = nn::MeshParams<nn::ParamList<M, S::GMesh::ndim, StateSpace>, typename S::GMesh>;
  template <class Tuple>
  struct set_of;
  template <class... S>
  struct set_of<std::tuple<S...>> {
    using type = nn::ParamSet<nn::MeshParams<nn::ParamList<M, Mesh::ndim, StateSpace>, Mesh>, list_of<S>...>;
  };

 public:
  using Set = typename set_of<Shards>::type;

  FullyShardGroups(Model& model, const Mesh& mesh, FsdpOptions o)
      : model_(model), own_(model, mesh, o), shards_(make_shards(model, mesh, o)), params_(make_set(model, mesh)) {
    static_assert(requires { model.hooks(); }, "fully_shard over parameter groups needs `hooks()` on the model (nn::WithUnits)");
    // The model's hooks: its own units' FSDP, then the units of each group that follow the unit.
    const nn::UnitHooks own_hooks = model.hooks();
    auto chain = [this](std::function<void(std::size_t)> first, auto pick) -> std::function<void(std::size_t)> {
      return [this, first = std::move(first), pick](std::size_t u) {
        if (first) first(u);
        for_groups([&]<std::size_t I>(std::integral_constant<std::size_t, I>, auto& g) {
          const auto& hook = pick(g.view->hooks());
          if (hook)
            for (std::size_t k : g.following[u]) hook(k);
        });
      };
    };
    model.set_hooks({.pre_forward = chain(own_hooks.pre_forward, [](const nn::UnitHooks& h) -> auto& { return h.pre_forward; }),
                     .post_forward = chain(own_hooks.post_forward, [](const nn::UnitHooks& h) -> auto& { return h.post_forward; }),
                     .pre_backward = chain(own_hooks.pre_backward, [](const nn::UnitHooks& h) -> auto& { return h.pre_backward; }),
                     .grads_ready = chain(own_hooks.grads_ready, [](const nn::UnitHooks& h) -> auto& { return h.grads_ready; })});
  }
  FullyShardGroups(const FullyShardGroups&) = delete;  // the model's hooks hold `this`
  FullyShardGroups& operator=(const FullyShardGroups&) = delete;
  ~FullyShardGroups() { model_.set_hooks({}); }

  /// This rank's shards of every group's parameters: list<0> the model's mesh's, then one per group.
  Set& params() noexcept { return params_; }
  /// The FSDP of the model's own units, and of group I (>= 1).
  Own& own() noexcept { return own_; }
  template <std::size_t I>
  auto& group() noexcept {
    static_assert(I >= 1 && I < groups, "FullyShardGroups::group<I>: I names a group beyond the model's own (1, ...)");
    return *std::get<I - 1>(shards_).fsdp;
  }

  void set_requires_gradient_sync(bool on) {
    each([&](auto& f) { f.set_requires_gradient_sync(on); });
  }
  bool requires_gradient_sync() const noexcept { return own_.requires_gradient_sync(); }
  std::size_t finish_gradient_sync() {
    std::size_t n = 0;
    each([&](auto& f) { n += f.finish_gradient_sync(); });
    return n;
  }
  std::size_t reduce_gradients() {
    std::size_t n = 0;
    each([&](auto& f) { n += f.reduce_gradients(); });
    return n;
  }
  void unshard() {
    each([](auto& f) { f.unshard(); });
  }
  void reshard() {
    each([](auto& f) { f.reshard(); });
  }
  void sync_parameters() {
    each([](auto& f) { f.sync_parameters(); });
  }
  void zero_grad() {
    each([](auto& f) { f.zero_grad(); });
  }
  FsdpMemory memory() const {
    FsdpMemory m;
    const_cast<FullyShardGroups*>(this)->each([&](auto& f) {
      const auto x = f.memory();
      m.params += x.params, m.grads += x.grads, m.master += x.master, m.grad_shards += x.grad_shards;
    });
    return m;
  }
  std::size_t num_units() const {
    std::size_t n = 0;
    const_cast<FullyShardGroups*>(this)->each([&](auto& f) { n += f.num_units(); });
    return n;
  }
  const FsdpOptions& options() const noexcept { return own_.options(); }

 private:
  template <class F>
  void for_groups(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::integral_constant<std::size_t, I>{}, std::get<I>(shards_)), ...);
    }(std::make_index_sequence<groups - 1>{});
  }
  template <class F>
  void each(F&& f) {
    f(own_);
    for_groups([&]<std::size_t I>(std::integral_constant<std::size_t, I>, auto& g) { f(*g.fsdp); });
  }
  /// Each other group's FSDP, and which of its units follow each of the model's units.
  static Shards make_shards(Model& model, const Mesh& mesh, const FsdpOptions& o) {
    Shards shards;
    auto all = model.parameter_groups();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (make_shard(model, mesh, o, std::get<I + 1>(all), std::get<I>(shards)), ...);
    }(std::make_index_sequence<groups - 1>{});
    return shards;
  }
  template <class Group, class S>
  static void make_shard(Model& model, const Mesh& mesh, const FsdpOptions& o, const Group& group, S& g) {
    g.view = std::make_unique<typename decltype(g.view)::element_type>(*group.units);
    g.fsdp = std::make_unique<typename S::Fsdp>(*g.view, *group.mesh, o);
    g.following.assign(model.units().size(), {});
    const auto follows = nn::followed_units(model.units(), group);
    for (std::size_t k = 0; k < follows.size(); ++k) {
      if (follows[k] >= model.units().size())
        throw Error("fully_shard",
                    dtensor::detail::cat("unit ", (*group.units)[k].group->name(), " of parameter group \"", *group.name,
                                         "\" follows no unit on the model's mesh (its part has no parameter there): "
                                         "nothing would fire its hooks"),
                    mesh.rank());
      g.following[follows[k]].push_back(k);
    }
  }
  Set make_set(Model& model, const Mesh& mesh) {
    auto all = model.parameter_groups();
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return Set(nn::on(mesh, own_.params()), nn::on(*std::get<I + 1>(all).mesh, std::get<I>(shards_).fsdp->params())...);
    }(std::make_index_sequence<groups - 1>{});
  }

  Model& model_;
  Own own_;
  Shards shards_;
  Set params_;
};

/// Shards `model`'s units over the mesh's data-shard dimension (see the top of this file).
/// M: the master values' and optimizer state's element type (default: the model's).
/// StateSpace: where they and the gradient shards live (default: the model's memory space;
/// host_space offloads them to the CPU). The model must outlive the result and stay where it is.
/// A model with parameters on more meshes than its own (nn::parameter_groups: a MoE's experts)
/// gets a FullyShardGroups: every group sharded over its own mesh's data dimension(s).
template <class M = void, class StateSpace = void, class Model, MeshType Mesh>
auto fully_shard(Model& model, const Mesh& mesh, FsdpOptions o = {}) {
  static_assert(nn::require_units<Model>());  // before anything reads model.units(): a readable error
  using Unit = std::remove_cvref_t<decltype(model.units().front())>;
  using T = typename decltype(Unit::group)::element_type::element_type;
  using Master = std::conditional_t<std::is_void_v<M>, T, M>;
  using State = std::conditional_t<std::is_void_v<StateSpace>, detail::model_space_t<Model>, StateSpace>;
  if constexpr (detail::parameter_group_count<Model>() > 1) return FullyShardGroups<Model, Mesh, Master, State>(model, mesh, o);
  else return FullyShard<Model, Mesh, Master, State>(model, mesh, o);
}

/// The (replicate, shard) sizes of the data ranks for HSDP: `data_ranks` split into `replicate`
/// groups; throws naming the flag when it does not divide.
inline std::pair<int, int> hsdp_shape(int data_ranks, int replicate, const char* flag = "hsdp") {
  if (replicate < 1 || data_ranks < 1 || data_ranks % replicate != 0)
    throw Error("hsdp_shape", dtensor::detail::cat("--", flag, " ", replicate, " does not divide the ", data_ranks,
                                                   " data-parallel ranks"));
  return {replicate, data_ranks / replicate};
}

}  // namespace dtensor::parallel
