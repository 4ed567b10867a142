#!/usr/bin/env bash
# scripts/run-main.sh — the main job: set up, build and run the example on the threads backend.
#
#   scripts/run-main.sh              # installs what is missing, builds build/, runs the example
#
# Extra arguments go to the example program.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDTENSOR_WITH_BLAS=ON -DDTENSOR_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target quickstart
exec build/examples/quickstart "$@"
