#!/usr/bin/env bash
# scripts/run-sanitizers.sh — the test suite under AddressSanitizer + UndefinedBehaviorSanitizer,
# and the threads-backend tests under ThreadSanitizer.
#
#   scripts/run-sanitizers.sh            # both (build-asan/, build-tsan/)
#   scripts/run-sanitizers.sh asan       # or only one of them
#   scripts/run-sanitizers.sh tsan
#
# ASan+UBSan: a chosen subset of the threads-backend tests, one program per area where buffers
# are made, lent and freed — the core (tensors, views, the caching allocator), communication,
# redistribution, ops on every host/meta space, bad input and faults, FSDP (units gathered,
# released, reduced; the GPT under FSDP x TP + SP), context parallelism (ring attention's
# in-flight sends), checkpoints and offload files — UB fatal (-fno-sanitize-recover), leaks
# checked. (MoE's all-to-all-v buffers: test_comm_threads's all_to_all_v cases.) TSan: the
# programs that exercise the threads backend's synchronization (communicator, faults and ranks
# leaving, DDP's overlap with the backward; the bad-input suite, nine units, runs under ASan only:
# its threads take the communicator's paths these cover). MPI is left out of both: Open MPI's own allocations and shared-memory transport are
# not sanitizer-clean. Only these targets are built: a sanitizer build is CI's most expensive
# part (each program compiles about twice as long as in the main build), so the subsets were
# cut to these 8 and 3 for CI's time budget (docs/benchmarks.md); `scripts/run-sanitizers.sh
# asan` with more targets is a local check. The programs that compile long and run briefly are
# compiled at -O0 (DTENSOR_TESTS_O0, the top-level CMakeLists.txt): instrumented code at -O1 took about
# twice the compile time (test_moe with ASan + UBSan: 74 s against 34 s of CPU); the two whose
# run dominates the phase (test_comm_threads, test_redistribute_oracle) stay at -O1. -O0 checks
# at least as much (no access is optimized away before instrumentation); the programs run slower.
# Under a sanitizer the test cases tagged [slow] are left out (tests/CMakeLists.txt: the oracle's
# (2, 2, 2) mesh, FSDP's ledger at N = 8 and its 50-step bf16 run; the main suite runs them): they
# were 95 % of the oracle's ASan run and half of FSDP's, on code paths the other cases cover.
# run-tests.sh (and so CI) runs this script unless DTENSOR_TEST_SANITIZERS=0: in the background at
# nice 19, beside its main suite and packaging checks, whose idle CPU these builds use.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DTENSOR_TEST_JOBS:-$(nproc)}
what=${1:-all}
# Ninja for a new build folder: it builds the listed programs side by side, where Make's top-level
# Makefile builds one target after another (.NOTPARALLEL), one core for most of these one-unit programs.
generator() { if [[ ! -f $1/CMakeCache.txt ]] && command -v ninja >/dev/null; then echo "-GNinja"; fi; }

# -g1: line tables, what a sanitizer report prints (file:line per frame); full -g only adds the
# local variables' descriptions, at a cost in compile time that the ASan build (the slowest part of CI)
# cannot afford.
# DTENSOR_TEST_GROUPS=OFF: one program per test file (tests/CMakeLists.txt), so that only the chosen
# programs below are compiled, not the groups that hold them.
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DDTENSOR_BUILD_TESTS=ON -DDTENSOR_BUILD_EXAMPLES=ON
        -DDTENSOR_BUILD_BENCHMARKS=OFF -DDTENSOR_WITH_MPI=OFF -DDTENSOR_WITH_CUDA=OFF -DDTENSOR_WITH_BLAS=ON
        -DDTENSOR_TEST_GROUPS=OFF)

if [[ $what == all || $what == asan ]]; then
  asan_tests=(test_tensor test_comm_threads test_redistribute_oracle test_ops_spaces test_hardening
              test_fsdp_parity test_cp_parity test_checkpoint)
  asan_o0="dtensor_catch_session;dtensor_catch_main;test_tensor;test_ops_spaces;test_hardening;test_fsdp_parity;test_cp_parity;test_checkpoint"
  cmake -S . -B build-asan $(generator build-asan) "${common[@]}" -DDTENSOR_SANITIZE="address;undefined" -DDTENSOR_TESTS_O0="$asan_o0" >/dev/null
  cmake --build build-asan -j"$jobs" --target "${asan_tests[@]}"
  regex="^($(IFS='|'; echo "${asan_tests[*]}"))\$"
  (cd build-asan &&
     ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$jobs" -R "$regex")
fi

if [[ $what == all || $what == tsan ]]; then
  tsan_tests=(test_comm_threads test_dtensor_faults test_optim)
  tsan_o0="dtensor_catch_session;dtensor_catch_main;test_dtensor_faults;test_optim"
  cmake -S . -B build-tsan $(generator build-tsan) "${common[@]}" -DDTENSOR_SANITIZE=thread -DDTENSOR_TESTS_O0="$tsan_o0" >/dev/null
  cmake --build build-tsan -j"$jobs" --target "${tsan_tests[@]}"
  regex="^($(IFS='|'; echo "${tsan_tests[*]}"))\$"
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
     ctest --output-on-failure -j"$jobs" -R "$regex")
fi
