#!/usr/bin/env bash
# scripts/gpu-kit.sh — fetch, here, what a bare GPU machine lacks to build dtensor's CUDA tests.
#
#   scripts/gpu-kit.sh [--with-build BUILD] [DIR]   # default DIR: .gpu-kit (ignored by git)
#
# A lent GPU machine has nvcc, CMake, ninja and Python with pip's NCCL, but no network and no
# Debian packages beyond its image: no Catch2 and no Google Benchmark. This script downloads their
# Debian 12 packages (apt-get download: no install, no root needed beyond apt's cache) into
# DIR/debs; scripts/gpu-check.sh unpacks them there with `dpkg -x` into a private prefix and points
# CMake at it. Both libraries are small (Catch2 is a single header; libbenchmark one shared library).
# OpenBLAS, Boost.MPI and OpenMPI are not carried: the GPU build needs none of them (host GEMMs
# fall back to the library's own kernels; NCCL is bootstrapped through MPI and needs one GPU per
# rank, so on a one-GPU machine the several-ranks-on-one-GPU mode cuda_threads stands in for it).
#
# --with-build BUILD also copies a CUDA build made here (scripts/gpu-check.sh's build step, or any
# build with -DDTENSOR_WITH_CUDA=ON) into DIR/BUILD without its object files: the executables,
# CMakeCache.txt and CTest's files, a few tens of MiB. `gpu-check.sh --prebuilt --build DIR/BUILD`
# then spends the GPU machine's minutes on running, not compiling.
set -euo pipefail
cd "$(dirname "$0")/.."
with_build=""
if [[ ${1:-} == --with-build ]]; then with_build=$2; shift 2; fi
kit=${1:-.gpu-kit}
if [[ -n $with_build ]]; then
  [[ -f $with_build/CMakeCache.txt ]] || { echo "gpu-kit: $with_build is not a configured build" >&2; exit 1; }
  dest=$kit/$(basename "$with_build")
  rm -rf "$dest"
  (cd "$with_build" && find . -path '*/CMakeFiles' -prune -o -type f \( -perm -u+x -o -name CTestTestfile.cmake \
     -o -name CMakeCache.txt \) -print) | while read -r f; do
    mkdir -p "$dest/$(dirname "$f")" && cp -p "$with_build/$f" "$dest/$f"
  done
  strip --strip-debug $(find "$dest" -type f -perm -u+x) 2>/dev/null || true
  echo "gpu-kit: $(du -sh "$dest" | cut -f1) of $with_build copied to $dest"
fi
mkdir -p "$kit/debs"
packages=(catch2 libbenchmark-dev libbenchmark1debian)
(cd "$kit/debs" && apt-get download "${packages[@]}")
ls -l "$kit/debs"
echo "gpu-kit: ${#packages[@]} packages in $kit/debs; carry '$kit' to the GPU machine with the checkout"
