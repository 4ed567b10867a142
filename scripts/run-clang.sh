#!/usr/bin/env bash
# scripts/run-clang.sh — CI's clang job: the examples and a test subset built with the newest clang
# Debian 12 installs (clang-19 from bookworm's updates; clang-16 also works; clang 14, the default
# `clang++`, is refused by CMake), warnings as errors (-Wall -Wextra -Werror, DTENSOR_WERROR), then
# the subset run. About 5 minutes on 2 cores.
#
#   scripts/run-clang.sh                 # installs clang-19 with apt when no clang >= 16 is found
#   CXX=clang++-16 scripts/run-clang.sh  # a given compiler
#
# Environment: DTENSOR_CLANG_BUILD (default build-clang) is the build folder, DTENSOR_TEST_JOBS the
# build parallelism (default: the number of cores), DTENSOR_CLANG_TARGETS the targets to build
# (default below: what g++ alone would not catch — the programs users copy and the headers' hard
# template code: ops rules, pipeline schedules, the DTensor API).
set -euo pipefail
cd "$(dirname "$0")/.."

cxx=${CXX:-}
if [[ -z $cxx || $cxx != *clang* ]]; then
  cxx=""
  for v in 19 18 17 16; do
    if command -v "clang++-$v" >/dev/null; then cxx=clang++-$v; break; fi
  done
fi
if [[ -z $cxx ]]; then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "run-clang: no clang >= 16 found; installing clang-19"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang-19
  cxx=clang++-19
fi
echo "run-clang: $($cxx --version | head -1)"

build=${DTENSOR_CLANG_BUILD:-build-clang}
jobs=${DTENSOR_TEST_JOBS:-$(nproc)}
targets=(${DTENSOR_CLANG_TARGETS:-quickstart train_gpt plan_at_scale test_dtensor_api test_ops_matmul test_pipeline_schedule})
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" -DDTENSOR_BUILD_TESTS=ON -DDTENSOR_BUILD_EXAMPLES=ON \
      -DDTENSOR_WITH_MPI=ON -DDTENSOR_WITH_BLAS=ON -DDTENSOR_WERROR=ON
start=$SECONDS
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
echo "run-clang: built ${targets[*]} in $((SECONDS - start)) s, no warnings"
# The tests among the targets, by their CTest names (an example's own checks run as example_*).
regex=$(printf '%s\n' "${targets[@]}" | grep '^test_' | paste -sd'|')
(cd "$build" && ctest --output-on-failure -j"$jobs" -R "^(${regex})$" -E "_np[0-9]")
"$build/examples/quickstart" >/dev/null
"$build/examples/train_gpt" --pp 2 --fsdp 1 --cp 1 --tp 2 --steps 2 --schedule dualpipev --microbatches 4 >/dev/null
echo "run-clang: passed"
