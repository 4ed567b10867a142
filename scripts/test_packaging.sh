#!/usr/bin/env bash
# scripts/test_packaging.sh — every way of consuming dtensor, built and run against this tree:
#
#   1. plain headers    a copy of include/ and `g++ -std=c++20 -pthread`, nothing else
#   2. CMake package    cmake --install to a temporary prefix; a find_package consumer
#                       (COMPONENTS mpi, OPTIONAL_COMPONENTS cuda nccl); probes of the config's
#                       component logic (missing optional, missing required, unknown, version)
#   3. in-tree          an add_subdirectory consumer and a FetchContent (local path) consumer
#   4. vcpkg            the port's own portfile.cmake run with stand-ins for the vcpkg helpers
#                       (tests/packaging/vcpkg/run_portfile.cmake), the package tree moved to an
#                       "installed" tree, and the find_package consumer built against it
#   5. Conan 2          conan create with the test_package (core; with_mpi, plus with_cuda and
#                       with_nccl when the CUDA toolkit and NCCL are here), offline in a private
#                       CONAN_HOME with no remote; validate() rejecting impossible configurations
#
# Needs CMake >= 3.25, a C++20 compiler, MPI + Boost.MPI (as the MPI tests do) and Python 3
# (conan is pip-installed if missing). Work happens in a temporary directory, removed at the end
# unless DTENSOR_KEEP_TMP=1. Jobs: DTENSOR_JOBS (default 2).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PKG="$ROOT/tests/packaging"
JOBS=${DTENSOR_JOBS:-2}
CXX=${CXX:-g++}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS

T=$(mktemp -d "${TMPDIR:-/tmp}/dtensor-packaging.XXXXXX")
cleanup() { if [[ "${DTENSOR_KEEP_TMP:-0}" == 1 ]]; then echo "kept $T"; else rm -rf "$T"; fi; }
trap cleanup EXIT

GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
START=$SECONDS
STEP_START=$SECONDS
TIMINGS=""
step() {
  if [[ -n "${STEP_NAME:-}" ]]; then TIMINGS+=$(printf '  %-44s %4ds\\n' "$STEP_NAME" $((SECONDS - STEP_START))); fi
  STEP_NAME=$1; STEP_START=$SECONDS
  [[ -n "$1" ]] && printf '\n==== %s\n' "$1"
  return 0
}
fail() { echo "test_packaging: FAILED: $*" >&2; exit 1; }
run() { echo "+ $*"; "$@"; }
# configure <source> <build> [cmake args...] — quiet unless it fails.
configure() {
  local src=$1 bld=$2; shift 2
  if ! cmake -S "$src" -B "$bld" "${GEN[@]}" "$@" >"$bld.log" 2>&1; then
    cat "$bld.log"; fail "configure $src"
  fi
  grep -E '^-- (consumer|dtensor):' "$bld.log" || true
}
build() { cmake --build "$1" -j "$JOBS" >"$1.build.log" 2>&1 || { cat "$1.build.log"; fail "build $1"; }; }
# run_all <build> <exe>... — run the executables that were built (smoke, smoke_mpi must exist).
run_all() {
  local bld=$1; shift
  for exe in "$@"; do
    if [[ -x "$bld/$exe" ]]; then "$bld/$exe" || fail "$bld/$exe"
    elif [[ "$exe" == smoke || "$exe" == smoke_mpi ]]; then fail "$bld/$exe was not built"; fi
  done
}
# probe <name> <expect rc: 0|fail> <pattern> [cmake args...] — configure-only find_package probe.
probe() {
  local name=$1 expect=$2 pattern=$3; shift 3
  local bld="$T/probe-$name" rc=0
  cmake -S "$PKG/find_probe" -B "$bld" "${GEN[@]}" "$@" >"$bld.log" 2>&1 || rc=$?
  if [[ "$expect" == 0 && $rc != 0 ]] || [[ "$expect" == fail && $rc == 0 ]] \
     || ! grep -qE -- "$pattern" "$bld.log"; then
    cat "$bld.log"; fail "probe $name: expected rc $expect and /$pattern/, got rc $rc"
  fi
  echo "probe $name: ok ($(grep -m1 -oE -- "$pattern" "$bld.log"))"
}
# Consumers build without optimization: they are compile-and-link checks with tiny runs.
NOSUB=(-DDTENSOR_BUILD_TESTS=OFF -DDTENSOR_BUILD_EXAMPLES=OFF -DDTENSOR_BUILD_BENCHMARKS=OFF)

# ---------------------------------------------------------------------------------------------
step "1. plain headers (g++ -std=c++20 -I include -pthread)"
mkdir -p "$T/plain"
cp -r "$ROOT/include" "$T/plain/include"
run "$CXX" -std=c++20 -I "$T/plain/include" -pthread "$PKG/smoke.cpp" -o "$T/plain/smoke"
"$T/plain/smoke" || fail "plain-headers smoke test"

# ---------------------------------------------------------------------------------------------
step "2. cmake --install + find_package consumer"
configure "$ROOT" "$T/build" "${NOSUB[@]}" -DDTENSOR_WITH_MPI=ON -DCMAKE_INSTALL_PREFIX="$T/prefix"
cmake --install "$T/build" >"$T/install.log" 2>&1 || { cat "$T/install.log"; fail "cmake --install"; }
for f in include/dtensor/comm/threads.hpp share/dtensor/dtensorConfig.cmake \
         share/dtensor/dtensorConfigVersion.cmake share/dtensor/dtensorTargets.cmake \
         share/dtensor/dtensor_mpiTargets.cmake; do
  [[ -f "$T/prefix/$f" ]] || fail "install: $f is missing"
done
grep -A1 'requested no architecture check' "$T/prefix/share/dtensor/dtensorConfigVersion.cmake" \
  | grep -q 'if("TRUE")' || fail "the version file is not ARCH_INDEPENDENT"
configure "$PKG/find_package" "$T/consumer-find" -DCMAKE_PREFIX_PATH="$T/prefix"
build "$T/consumer-find"
run_all "$T/consumer-find" smoke smoke_mpi smoke_cuda smoke_nccl

step "2b. package config: components, versions (configure-only probes)"
P=(-DCMAKE_PREFIX_PATH="$T/prefix")
probe optional-missing 0 'mpi=TRUE/target blas=/no-target cuda=FALSE/no-target nccl=FALSE/no-target' \
  "${P[@]}" "-DPROBE_ARGS=0.1;REQUIRED;COMPONENTS;mpi;OPTIONAL_COMPONENTS;cuda;nccl" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
probe required-missing fail 'cuda: CUDA toolkit not found' \
  "${P[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;mpi;cuda" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
probe unknown-component fail 'nope: unknown component' "${P[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;nope"
probe version-too-new fail 'Could not find a configuration file for package "dtensor"' \
  "${P[@]}" "-DPROBE_ARGS=0.99;REQUIRED"
probe default-components 0 'found=1 mpi=TRUE/target' "${P[@]}" "-DPROBE_ARGS=REQUIRED"

# ---------------------------------------------------------------------------------------------
step "3. add_subdirectory consumer"
configure "$PKG/add_subdirectory" "$T/consumer-subdir" -DDTENSOR_SOURCE_DIR="$ROOT"
build "$T/consumer-subdir"
run_all "$T/consumer-subdir" smoke smoke_mpi

step "3b. FetchContent (local path) consumer"
configure "$PKG/fetchcontent" "$T/consumer-fetch" -DDTENSOR_SOURCE_DIR="$ROOT"
build "$T/consumer-fetch"
run_all "$T/consumer-fetch" smoke

# ---------------------------------------------------------------------------------------------
step "4. vcpkg port (portfile run with stand-in helpers) + consumer"
V="$T/vcpkg"
cmake -DPORT_DIR="$ROOT/packaging/vcpkg/ports/dtensor" -DWORK_DIR="$V" -DFEATURES=core \
      -P "$PKG/vcpkg/run_portfile.cmake" >"$V.log" 2>&1 || { cat "$V.log"; fail "vcpkg portfile"; }
grep -E 'run_portfile:' "$V.log"
# `vcpkg install` copies the package tree into installed/<triplet> and drops the build trees.
mkdir -p "$V/installed/x64-linux"
cp -a "$V/packages/dtensor_x64-linux/." "$V/installed/x64-linux/"
rm -rf "$V/packages" "$V/buildtrees"
configure "$PKG/find_package" "$T/consumer-vcpkg" -DCMAKE_PREFIX_PATH="$V/installed/x64-linux" \
          -DCONSUMER_GPU_PROGRAMS=OFF     # step 2 built those; here the new part is dtensor::mpi
                                          # defined by the config (the port built no component)
grep -q "from $V/installed/x64-linux/share/dtensor" "$T/consumer-vcpkg.log" \
  || fail "the vcpkg consumer did not find the vcpkg tree"
build "$T/consumer-vcpkg"
run_all "$T/consumer-vcpkg" smoke smoke_mpi

# ---------------------------------------------------------------------------------------------
step "5. conan create + test_package (offline)"
if ! python3 -c 'import conan' 2>/dev/null; then
  run python3 -m pip install --quiet conan
fi
conan() { python3 -m conans.conan "$@"; }
export CONAN_HOME="$T/conan_home"
mkdir -p "$CONAN_HOME"
conan profile detect --force >/dev/null 2>&1
conan remote remove '*' >/dev/null 2>&1 || true        # offline: no remote is needed
conan --version
cp -r "$ROOT/test_package" "$T/test_package"            # its build folder stays out of the tree
CONAN_ARGS=(-s compiler.cppstd=20 -c "tools.build:jobs=$JOBS" -tf "$T/test_package")
create() {
  echo "+ conan create . $*"
  (cd "$ROOT" && conan create . --build=missing "${CONAN_ARGS[@]}" "$@") >"$T/conan.log" 2>&1 \
    || { cat "$T/conan.log"; fail "conan create $*"; }
  grep -E '^dtensor (test_package|mpi smoke)' "$T/conan.log"
}
create
if grep -qE 'nccl=TRUE' "$T/consumer-find.log"; then
  create -o '&:with_mpi=True' -o '&:with_cuda=True' -o '&:with_nccl=True'
else
  create -o '&:with_mpi=True'
fi
# validate(): impossible configurations are rejected.
invalid() {
  local pattern=$1; shift
  if (cd "$ROOT" && conan create . "${CONAN_ARGS[@]}" "$@") >"$T/conan-invalid.log" 2>&1; then
    fail "conan create $* should have been rejected"
  fi
  grep -q -- "$pattern" "$T/conan-invalid.log" || { cat "$T/conan-invalid.log"; fail "conan: expected /$pattern/"; }
  echo "rejected ($*): $(grep -m1 -o -- "$pattern.*" "$T/conan-invalid.log")"
}
invalid 'with_nccl=True needs with_cuda=True' -o '&:with_nccl=True' -o '&:with_mpi=True'
invalid 'with_nccl=True needs with_mpi=True' -o '&:with_nccl=True' -o '&:with_cuda=True'
invalid 'lower than the required C++ standard (20)' -s compiler.cppstd=17
invalid 'dtensor needs C++20' -s compiler=gcc -s compiler.version=9

step ""
printf '\ntest_packaging: all ok in %ds\n%b' $((SECONDS - START)) "$TIMINGS"
