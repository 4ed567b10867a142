#!/usr/bin/env bash
# scripts/run-tests.sh — set up, build and run the whole test suite.
#
#   scripts/run-tests.sh             # unit (threads), MPI (4 and 8 processes), packaging tests
#
# Environment: DTENSOR_TEST_BUILD (default build-tests) is the build folder; DTENSOR_TEST_JOBS
# the build parallelism (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh

build=${DTENSOR_TEST_BUILD:-build-tests}
jobs=${DTENSOR_TEST_JOBS:-$(nproc)}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDTENSOR_BUILD_TESTS=ON -DDTENSOR_BUILD_EXAMPLES=ON -DDTENSOR_BUILD_BENCHMARKS=ON \
      -DDTENSOR_WITH_MPI=ON -DDTENSOR_WITH_BLAS=ON
cmake --build "$build" -j"$jobs"
# Includes the examples, which check themselves against the full tensors (label example).
(cd "$build" && ctest --output-on-failure -j"$jobs")
scripts/test_packaging.sh
