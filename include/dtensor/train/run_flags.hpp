// dtensor/train/run_flags.hpp — where a trainer's ranks run, as command-line flags: --backend
// threads|mpi|nccl, --device cpu|cuda, --dtype f32|bf16|fp8, --tf32, --attention,
// --profile-kernels and --intra-op-threads; their rows of a flag table (train/flag_table.hpp), the checks of what a
// build can run (a host build, or its _cuda twin holding only the GPU's instantiations), and the
// ranks started by the backend (threads, or one MPI process each).
//
//   struct Options : train::cli::TrainerFlags, train::cli::RunFlags { ... };
//   ... train::cli::run_flag_rows<Options>("my_trainer") among the table's parts (joined_rows) ...
//   train::cli::check_run_flags(o, /*cuda_build=*/false, "my_trainer");
//   return train::cli::run_ranks(o, o.ranks(), argc, argv, [&](CommPtr world) { ... }, "my_trainer");
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/hosts.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/mesh/hosts.hpp"
#include "dtensor/train/flag_table.hpp"
#include "dtensor/train/flags.hpp"
#ifdef DTENSOR_HAS_MPI
#include "dtensor/comm/mpi.hpp"
#endif

namespace dtensor::train::cli {

/// The flags' values (their meaning and defaults: run_flag_rows).
struct RunFlags {
  std::string backend = "threads", device = "cpu", dtype = "f32", attention = "auto";
  bool tf32 = false, profile_kernels = false;
  int intra_op_threads = 1;
};

/// The rows of where the ranks run; `program` names the host build (its GPU build: program_cuda).
template <class O>
FlagTable<O> run_flag_rows(const std::string& program) {
  static_assert(std::is_base_of_v<RunFlags, O>);
  using R = RunFlags;
  return {
      {"--backend", "threads|mpi|nccl",
       "the ranks: threads (default), MPI processes (mpirun -n), or NCCL with --device cuda under mpirun (one GPU "
       "per process)",
       choice(&R::backend, {"threads", "mpi", "nccl"})},
      {"--device", "cpu|cuda",
       "cuda (" + program + "_cuda): the model on a GPU, the ranks threads sharing it, or --backend nccl under mpirun",
       choice(&R::device, {"cpu", "cuda"})},
      {"--dtype", "f32|bf16|fp8",
       "bf16: the model computes in bfloat16; master weights, gradient shards and AdamW state stay fp32 (FSDP mixed "
       "precision, also without --fsdp: ZeRO-1 on one shard; the experts too). fp8: bf16 with every Linear's "
       "GEMMs in FP8 (E4M3 forward, E5M2 gradients, delayed scaling; the host's emulation, or cuBLASLt's FP8 GEMMs "
       "with --device cuda on sm_89+: docs/fp8.md); not with --checkpoint or --recompute full|mlp",
       choice(&R::dtype, {"f32", "bf16", "fp8"})},
      {"--tf32", "",
       "--device cuda: float GEMMs on TF32 tensor cores (fp32 accumulation, inputs rounded to 10 mantissa bits; "
       "PyTorch's allow_tf32)",
       set_to(&R::tf32, true)},
      {"--attention", "auto|fused|gemm",
       "--device cuda: the fused attention kernels or the cuBLAS chunks (docs/gpu.md); auto (the default) runs bf16 "
       "attention on cuDNN's fused kernels where the build has cuDNN, else takes the chunks from 128 keys on",
       choice(&R::attention, {"auto", "fused", "gemm"})},
      {"--profile-kernels", "",
       "--device cuda: time the kernels by class (GEMMs, attention, norms, cross-entropy, embedding, optimizer) with "
       "CUDA events and print each class's share of the run (kernels/cuda/profile.cuh); slows the run a little",
       set_to(&R::profile_kernels, true)},
      {"--intra-op-threads", "N",
       "each rank's host kernels (GEMMs, attention, norms, GELU, AdamW, cross entropy, elementwise, permutes) on N "
       "threads: a pool of N - 1 workers per rank; the same bits as 1 (docs/host-kernels.md). With "
       "DTENSOR_BLAS_THREADS > 1 the GEMMs run on OpenBLAS's threads instead",
       integer(&R::intra_op_threads, 1, kernels::host::IntraOpThreads::max_threads)},
  };
}

/// --device, --dtype and --backend together: what this build can run (cuda_build: program_cuda).
inline void check_run_flags(const RunFlags& o, bool cuda_build, const std::string& program) {
  if (o.device == "cuda" && !cuda_build)
    throw UsageError("--device cuda: this " + program + " was built without CUDA; run " + program +
                     "_cuda (built with -DDTENSOR_WITH_CUDA=ON)");
  // The _cuda build holds only the GPU's instantiations of the trainer: the host's doubled its
  // nvcc units, CI's longest (docs/benchmarks.md, "CI").
  if (o.device == "cpu" && cuda_build)
    throw UsageError(program + "_cuda runs on the GPU: give --device cuda (the host run is " + program +
                     ": the same trainer, the same flags)");
  if (o.device == "cpu" && o.backend == "nccl") throw UsageError("--backend nccl needs --device cuda");
  if (o.tf32 && o.device != "cuda") throw UsageError("--tf32 needs --device cuda (the host's float GEMMs are fp32)");
  if (o.profile_kernels && o.device != "cuda") throw UsageError("--profile-kernels needs --device cuda");
  if (o.attention != "auto" && o.device != "cuda")
    throw UsageError("--attention " + o.attention + " needs --device cuda (the host has one attention kernel)");
  if (o.device == "cuda" && o.backend == "mpi")
    throw UsageError("--device cuda runs under mpirun with --backend nccl, not mpi");
}

/// --dtype in the words of the run's first line (print_mesh_line), for a model whose experts' GEMMs
/// follow its Linears' in FP8 (experts: whether the run has any).
inline std::string dtype_words(const RunFlags& o) {
  if (o.dtype == "f32") return "f32";
  const std::string rest = "fp32 master weights and AdamW state)";
  if (o.dtype == "bf16") return "bf16 (" + rest;
  return std::string("fp8 (E4M3/E5M2 Linear ") +
         (o.device == "cuda" ? "GEMMs on cuBLASLt" : "and expert GEMMs, host emulation") + "; bf16 elsewhere; " + rest;
}

/// The run's first line: "PROGRAM: mesh pp 2 x dp 1 x fsdp 2 (ZeRO-3) x cp 2 (ring) x tp 2 + SP = 16
/// ranks, threads backend, device cpu, dtype f32" (`dtype`: how the model computes, in words).
inline void print_mesh_line(const MeshFlags& m, const RunFlags& o, const std::string& program,
                            const std::string& dtype) {
  std::printf(
      "%s: mesh pp %d x dp %d x fsdp %d (ZeRO-%d) x cp %d (%s) x tp %d%s = %d ranks, %s backend, device %s, "
      "dtype %s\n",
      program.c_str(), m.pp, m.dp, m.fsdp, m.zero, m.cp, std::string(nn::name_of(m.cp_kind)).c_str(), m.tp,
      m.sp ? " + SP" : "", m.ranks(), o.backend.c_str(), o.device.c_str(), dtype.c_str());
}

/// `ranks` host ranks by --backend: threads of this process, or (mpi) this process one of an
/// MPI job's. Returns the exit status (2: --backend mpi in a build without MPI).
template <class Fn>
int run_ranks(const RunFlags& o, int ranks, int argc, char** argv, Fn&& fn, const std::string& program) {
  if (o.backend != "mpi") {
    (void)program;
    threads::run(ranks, std::forward<Fn>(fn));
    return 0;
  }
#ifdef DTENSOR_HAS_MPI
  return dtensor::mpi::run(argc, argv, std::forward<Fn>(fn));
#else
  (void)argc, (void)argv;
  std::fprintf(stderr, "%s: --backend mpi needs a build with -DDTENSOR_WITH_MPI=ON\n", program.c_str());
  return 2;
#endif
}

/// The hosts of a process backend's ranks (none under threads: one host), and on rank 0 which
/// mesh dimensions cross hosts when there are several (docs/multinode.md).
template <class Mesh>
std::vector<std::string> print_hosts(const RunFlags& o, const Mesh& mesh) {
  const std::vector<std::string> hosts = o.backend == "threads" ? std::vector<std::string>{} : host_names(mesh.root());
  const auto placed =
      mesh_hosts(mesh, hosts.empty() ? std::vector<std::string>(std::size_t(mesh.root().size()), "") : hosts);
  if (mesh.root().rank() == 0 && placed.count > 1) std::printf("%s\n", describe_hosts(mesh, placed).c_str());
  return hosts;
}

}  // namespace dtensor::train::cli
