#!/usr/bin/env bash
# scripts/setup-deps.sh — install the Debian 12 packages dtensor's build, tests and examples use.
#
#   scripts/setup-deps.sh            # apt-get update + install what is missing (root or sudo)
#
# The core and the threads backend need only g++ >= 12 and CMake >= 3.25; the rest is optional
# (MPI backend, CBLAS, Catch2 tests, Google Benchmark, a venv for the Conan packaging test).
set -euo pipefail

# ninja-build: the test scripts' build tool. It starts the longest units first (in the order the
# build defines them) and builds several targets at once; Make's generated top-level Makefile is
# .NOTPARALLEL across targets and defers a target's compiles until its dependencies are built,
# which left one core idle for much of CI (docs/benchmarks.md, "CI").
packages=(build-essential cmake ninja-build catch2 libbenchmark-dev libopenblas-dev
          libboost-mpi-dev libopenmpi-dev openmpi-bin python3-venv)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Where the CUDA toolkit is installed: the cudnn-frontend headers for cuDNN attention (not in
# Debian; a pinned release from its PyPI wheel into ~/.cache/dtensor, nothing system-wide).
"$(dirname "$0")/fetch-cudnn-frontend.sh" || echo "setup-deps: cudnn-frontend not fetched (CUDA attention without cuDNN)"
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup-deps: all packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
