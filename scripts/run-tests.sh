#!/usr/bin/env bash
# scripts/run-tests.sh — set up, build and run the whole test suite.
#
#   scripts/run-tests.sh             # unit (threads), MPI (4 and 8 processes), parity, examples,
#                                    # compile-fail, CUDA (skip without a GPU), packaging tests
#
# And scripts/run-sanitizers.sh, beside the suite and the packaging checks, in the background at
# the lowest priority (skip with DTENSOR_TEST_SANITIZERS=0).
# When nvcc is found (PATH or /usr/local/cuda) the CUDA and NCCL components are built too and
# their tests (label cuda) run — on a machine without a GPU they report "skipped".
# Environment: DTENSOR_TEST_BUILD (default build-tests) is the build folder; DTENSOR_TEST_JOBS
# the build parallelism (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh

build=${DTENSOR_TEST_BUILD:-build-tests}
jobs=${DTENSOR_TEST_JOBS:-$(nproc)}
cuda=()
nvcc=$(command -v nvcc || true)
if [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [[ -n $nvcc ]]; then
  # The CUDA objects' host code at -O0 without debug info: CMake's RelWithDebInfo default for them
  # is -O2 -g -DNDEBUG, and their host pass is the build's longest (train_gpt_cuda's two units,
  # 4-5 GB each). nvcc's -O sets the host compiler's level only; the device code is optimized by
  # cicc and ptxas as always (but see below). Without a GPU their tests skip, and scripts/gpu-check.sh builds Release.
  # NDEBUG stays, as before (the collective check's default, comm/config.hpp).
  cuda=(-DDTENSOR_WITH_CUDA=ON -DDTENSOR_WITH_NCCL=ON -DCMAKE_CUDA_COMPILER="$nvcc")
  # Without a GPU the device code is compiled to PTX only (compute_90, what the driver would
  # JIT-compile), not also to sm_90 machine code: ptxas's pass was a quarter of an nvcc unit's CPU
  # time (test_ops_cuda.cu: 48.9 -> 36.6 s, docs/benchmarks.md) and nothing here runs that code.
  # For the same reason cicc, which turns the device code into PTX, does not optimize it there
  # (-Xcicc -O0; its pass went from 14.0 to 8.9 s of test_ops_cuda.cu's 43 s): that PTX is only
  # checked to compile. Where a GPU is usable the default (PTX and sm_90, cicc at -O3) stays;
  # scripts/gpu-check.sh builds the device's own architecture in Release and runs it.
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    cuda+=(-DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O0 -DNDEBUG")
  else
    cuda+=(-DCMAKE_CUDA_ARCHITECTURES=90-virtual -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O0 -DNDEBUG -Xcicc -O0")
  fi
  echo "run-tests: building the CUDA and NCCL components with $nvcc"
fi
# -O1 without debug info keeps the build within CI's time budget (docs/benchmarks.md has the timings).
# The test programs that take long to compile and run for a few seconds of mostly waiting ranks are
# compiled at -O0 (DTENSOR_TESTS_O0, the top-level CMakeLists.txt): test_moe compiled in 32 s of CPU
# against 57 s at -O1 and ran as long. Those whose run is long or arithmetic (the kernels, the
# redistribution oracles, test_comm_threads, test_sim, the 5-D and pipeline parity suites) and the
# examples but train_vit (their tests run the trainer many times) stay at -O1; the benchmarks,
# built but not run here, are at -O0 too. (test_sim gains nothing at -O0: its unit is template-heavy front-end work,
# 140.7 s of CPU at -O1 and more than 132 s at -O0, measured back to back.)
o0_tests=(dtensor_catch_session dtensor_catch_main dtensor_mpi_catch_main dtensor_cuda_catch_main dtensor_nccl_catch_main
          # The unit test files compile in groups, one program each (tests/CMakeLists.txt,
          # DTENSOR_TEST_GROUPS): these groups hold the unit tests that were listed here one by one
          # (test_checkpoint, test_llama, test_trainer; test_dtensor_api, test_dtensor_faults,
          # test_ops_spaces, test_sync, test_trace; the test_nn_* files, test_optim, test_context_parallel).
          unit_models unit_dtensor unit_nn
          test_moe test_hardening
          # parity_models: the GPT, FSDP, CP, Llama and ViT parity suites, one program
          # (tests/parity/CMakeLists.txt); parity_pipelines (pipeline, 5-D) stays at -O1.
          parity_models test_moe_parity test_checkpoint_mpi test_dtensor_mpi test_hardening_mpi
          test_gpt_parity_mpi test_moe_parity_mpi
          # train_vit: its unit compiles in 72 s of CPU at -O0 against 101 s at -O1 (measured as a
          # pair), and its three training tests take 13 s of CPU at -O0 against 5 s: 21 s less.
          # (train_gpt's tests run it about a hundred times: it stays at -O1.)
          train_vit
          # The benchmarks: CI builds them (they must compile) but does not run them.
          bench_check_collectives bench_checkpoint bench_comm_mpi bench_comm_threads
          bench_context_attention bench_gemm_host bench_gpt_step_host bench_kernels_host
          bench_moe_dispatch bench_offload bench_redistribute_mpi bench_redistribute_threads)
# Ninja for a new build folder (scripts/setup-deps.sh installs it; an existing folder keeps its
# generator, which CMake cannot change).
gen=()
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" \
      -DDTENSOR_TESTS_O0="$(IFS=';'; echo "${o0_tests[*]}")" \
      -DDTENSOR_BUILD_TESTS=ON -DDTENSOR_BUILD_EXAMPLES=ON -DDTENSOR_BUILD_BENCHMARKS=ON \
      -DDTENSOR_WITH_MPI=ON -DDTENSOR_WITH_BLAS=ON -DDTENSOR_WERROR=ON "${cuda[@]}"
# Each phase's wall time, for CI's budget (docs/benchmarks.md, "CI: the clean-clone time").
phase() { echo "run-tests: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)"; phase_start=$SECONDS; }
phase_start=$SECONDS
cmake --build "$build" -j"$jobs"
phase "the main build"
# ASan + UBSan over the threads-backend suite, TSan over the threads backend's synchronization
# (scripts/run-sanitizers.sh): started now, in the background at the lowest priority (nice 19),
# beside the main suite and the packaging checks. Those two phases left about half of the two
# cores idle (the suite's programs are mostly rank threads waiting on each other: 323 s of CPU
# over its 292 s on 2 cores, measured loaded, so less when quiet; the packaging checks are mostly
# CMake configuring), and the sanitizer builds are CPU work that fills it. Its output is printed
# whole when it ends. Its own session (setsid), so that an early exit (a failed test) ends it, its
# compilers included. (So nice 19 orders its processes only within that session's scheduling group,
# which under the kernel's autogroup scheduling gets the same share as the suite's: see
# scripts/lowest-priority.sh, which .ci/run uses for the clang job. Not here: the sanitized
# programs' rank threads would wait behind the suite's spinning ones, and some of their cases time
# collectives out on purpose; it would move CPU time between the phases, not save it.)
san_pid=""
san_log=""
stop_sanitizers() { if [[ -n $san_pid ]]; then kill -- "-$san_pid" 2>/dev/null || true; fi; }
if [[ ${DTENSOR_TEST_SANITIZERS:-1} != 0 ]]; then
  san_log=$(mktemp)
  trap 'stop_sanitizers; rm -f "$san_log"' EXIT
  setsid -w nice -n 19 scripts/run-sanitizers.sh > "$san_log" 2>&1 &
  san_pid=$!
fi
# Includes the examples, which check themselves against the full tensors (label example).
(cd "$build" && ctest --output-on-failure -j"$jobs")
phase "the main suite (ctest)"
DTENSOR_PACKAGING_MPI=1 scripts/test_packaging.sh
phase "the packaging checks"
if [[ -n $san_pid ]]; then
  san_status=0
  wait "$san_pid" || san_status=$?
  san_pid=""
  cat "$san_log"
  if [[ $san_status != 0 ]]; then
    echo "run-tests: the sanitizer builds and runs failed (exit $san_status)"
    exit 1
  fi
  phase "the rest of the sanitizer builds and runs (begun with the suite)"
fi
