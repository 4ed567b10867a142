// dtensor/parallel/fully_shard.hpp — FSDP / ZeRO-1, 2, 3 and HSDP over a model's flat units.
//
//   using Mesh = DeviceMesh<"dp", "fsdp", "tp">;          // "dp": replicate (HSDP), "fsdp": shard, "tp": tensor
//   models::GPT<float, Mesh, parallel::MegatronPlan<true>> model(mesh, cfg);
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
// The model (models::GPT, nn::Sequential, any nn::WithUnits model: units() and set_hooks(nn::UnitHooks), nn/units.hpp)
// keeps one flat group per unit (embed, blocks, head). Each unit's flat buffer is Shard<0> over
// the mesh dimension with Role::data_shard (torch.chunk, uneven sizes allowed; see
// fsdp/unit_state.hpp) — flattened with the context dimension when that follows it ("fsdp*cp":
// under context parallelism the context ranks shard too, torchtitan's dp_shard_cp; the
// gradient, Partial<sum> on both, is reduce-scattered once over the flattened group,
// FsdpShardDims in fsdp/group.hpp); this rank keeps its shard of the values (the master copy, in
// M), of the gradients (in M) and, through params(), of the optimizer state. The stages:
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
//
// This is the public header; the code lives in parallel/fsdp/, one concern a header (FSDP2's
// split): options.hpp (FsdpOptions, FsdpEvent, FsdpMemory, hsdp_shape, the option checks),
// unit_state.hpp (one unit's shard on this rank: master values, gradient shard, where each
// lives, the optimizer's views), group.hpp (FsdpShardDims, the shard group; FsdpGroup, every
// unit's state on one mesh, built and checked), collectives.hpp (all-gather, reduce-scatter,
// HSDP's all-reduce and how a result lands in a shard: the stage x precision x offload decisions
// as named functions), hooks.hpp (the unit hooks per stage), module.hpp (FullyShard, the object
// returned), parameter_groups.hpp (FullyShardGroups: parameters on several meshes), api.hpp
// (fully_shard).
#pragma once

#include "dtensor/parallel/fsdp/api.hpp"
#include "dtensor/parallel/fsdp/module.hpp"
#include "dtensor/parallel/fsdp/options.hpp"
#include "dtensor/parallel/fsdp/parameter_groups.hpp"
