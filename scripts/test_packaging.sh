#!/usr/bin/env bash
# scripts/test_packaging.sh — every way of consuming dtensor, built and run against this tree.
# Each consumer runs the same distributed program (tests/packaging/smoke_check.hpp: a 4-rank
# DTensor redistribution checked against the full tensor) on the threads backend, and where MPI
# is installed the same on MPI under mpiexec -n 4.
#
#   1. plain headers   a copy of include/ and `c++ -std=c++20 -pthread`, nothing else
#   2. CMake package   cmake --install to a temporary prefix: the installed tree, the version
#                      file, a find_package consumer (COMPONENTS mpi, OPTIONAL_COMPONENTS cuda
#                      nccl) and configure-only probes of the config's component rules
#   3. in-tree         an add_subdirectory consumer and a FetchContent (local path) consumer
#   4. vcpkg           the port's own portfile.cmake run with stand-ins for the vcpkg helpers
#                      (tests/packaging/vcpkg/run_portfile.cmake), its tree moved to where
#                      `vcpkg install` puts it, and the find_package consumer built against it
#   5. Conan 2         conan create with the test_package (default options; with_mpi, and
#                      with_cuda/with_nccl where CUDA and NCCL are installed), offline in a
#                      private CONAN_HOME with no remote; components through CMakeDeps;
#                      validate() rejecting impossible configurations
#
# Needs CMake >= 3.25, a C++20 compiler and python3 with venv (Debian: python3-venv). Optional:
# MPI + Boost.MPI, a CBLAS, the CUDA toolkit + NCCL (their consumers run where they are found).
# The network is used only for `pip install conan` (PyPI), once: the venv is kept.
#
# Environment:
#   DTENSOR_JOBS=2                build parallelism
#   DTENSOR_PACKAGING_MPI=auto    1: the MPI consumers must run; 0: skip them; auto: 1 if mpiexec
#                                 is on PATH
#   DTENSOR_PACKAGING_BLAS=auto   1/0/auto (a cblas.h under /usr/include or /usr/local/include):
#                                 install and check the blas component
#   DTENSOR_CONAN_VENV=~/.cache/dtensor/conan-venv   the venv that holds conan (made if missing)
#   DTENSOR_KEEP_TMP=1            keep the temporary directory (printed at the end)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PKG="$ROOT/tests/packaging"
JOBS=${DTENSOR_JOBS:-2}
CXX=${CXX:-c++}
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
# What OpenMPI needs in a container (root, more ranks than cores), for the mpiexec runs of CTest.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

T=$(mktemp -d "${TMPDIR:-/tmp}/dtensor-packaging.XXXXXX")
PASSED=0
FAILED=0
cleanup() {
  if [[ "${DTENSOR_KEEP_TMP:-0}" == 1 ]]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
START=$SECONDS
STEP_NAME=""
STEP_START=$SECONDS
TIMINGS=""
step() {
  if [[ -n "$STEP_NAME" ]]; then
    TIMINGS+=$(printf '  %-58s %4ds' "$STEP_NAME" $((SECONDS - STEP_START)))$'\n'
  fi
  STEP_NAME=$1
  STEP_START=$SECONDS
  if [[ -n "$1" ]]; then printf '\n==== %s\n' "$1"; fi
}
fail() {
  echo "test_packaging: FAILED in '$STEP_NAME': $*" >&2
  FAILED=1
  echo "packaging: $PASSED passed, $FAILED failed"
  exit 1
}
ok() { PASSED=$((PASSED + 1)); echo "ok: $*"; }
# logged <log> <command...> — run quietly; on failure show the log and stop.
logged() {
  local log=$1; shift
  "$@" >"$log" 2>&1 || { cat "$log"; fail "$*"; }
}
# configure <source> <build> [cmake args...]; prints the lines the consumer projects report.
configure() {
  local src=$1 bld=$2; shift 2
  logged "$bld.configure.log" cmake -S "$src" -B "$bld" "${GEN[@]}" "$@"
  grep -E '^-- (consumer|dtensor|test_package):' "$bld.configure.log" || true
}
# build_and_test <build> <what> — build, then run its CTest tests (there must be some).
build_and_test() {
  logged "$1.build.log" cmake --build "$1" -j "$JOBS"
  logged "$1.ctest.log" ctest --test-dir "$1" --output-on-failure --no-tests=error --timeout 180
  grep -E '^ *[0-9]+/[0-9]+ Test|tests passed' "$1.ctest.log"
  ok "$2"
}
# probe <name> <expect: 0|fail> <regex> [cmake args...] — configure tests/packaging/find_probe
# (a bare find_package(dtensor ${PROBE_ARGS})) and check its result and output.
probe() { probe_configure "$@"; probe_check "$1" "$2" "$3"; }
probe_configure() {  # its configure: the log in probe-<name>.log, the exit status in probe-<name>.rc
  local bld="$T/probe-$1" rc=0
  shift 3
  cmake -S "$PKG/find_probe" -B "$bld" "${GEN[@]}" "$@" >"$bld.log" 2>&1 || rc=$?
  echo "$rc" >"$bld.rc"
}
probe_check() {  # probe_check <name> <expect> <regex>: the verdict on a finished configure
  local name=$1 expect=$2 pattern=$3 bld="$T/probe-$1" rc
  rc=$(cat "$bld.rc")
  if [[ "$expect" == 0 && $rc != 0 ]] || [[ "$expect" == fail && $rc == 0 ]] \
     || ! grep -qE -- "$pattern" "$bld.log"; then
    cat "$bld.log"; fail "probe $name: expected rc $expect and /$pattern/, got rc $rc"
  fi
  ok "probe $name: $(grep -m1 -oE -- "$pattern" "$bld.log")"
}
# probe_later <as probe>: queued; run_probes configures the queued probes in two lanes side by
# side (each configure is one single-threaded cmake: one after another they left a core idle),
# then checks each, in order, as probe does.
PROBE_QUEUE=()
probe_later() {
  local q
  printf -v q '%q ' "$@"
  PROBE_QUEUE+=("$q")
}
run_probes() {
  local i lane args=()
  (
    for ((i = 0; i < ${#PROBE_QUEUE[@]}; i += 2)); do
      eval "args=(${PROBE_QUEUE[i]})"
      probe_configure "${args[@]}"
    done
  ) &
  lane=$!
  for ((i = 1; i < ${#PROBE_QUEUE[@]}; i += 2)); do
    eval "args=(${PROBE_QUEUE[i]})"
    probe_configure "${args[@]}"
  done
  wait "$lane"
  for ((i = 0; i < ${#PROBE_QUEUE[@]}; i++)); do
    eval "args=(${PROBE_QUEUE[i]})"
    probe_check "${args[@]:0:3}"
  done
  PROBE_QUEUE=()
}
# probe_targets <build> — the usage requirements of the component targets a probe defined.
probe_targets() { grep -E '^-- probe-target:' "$T/probe-$1.log" | sed 's/^-- //'; }

resolve() {  # resolve <value of DTENSOR_PACKAGING_X> <auto-detected 0|1>
  case "$1" in 1|0) echo "$1" ;; auto|"") echo "$2" ;; *) fail "expected 0, 1 or auto, got '$1'" ;; esac
}
HAVE_MPI=$(resolve "${DTENSOR_PACKAGING_MPI:-auto}" "$(command -v mpiexec >/dev/null && echo 1 || echo 0)")
HAVE_BLAS=$(resolve "${DTENSOR_PACKAGING_BLAS:-auto}" \
  "$(find /usr/include /usr/local/include -name cblas.h -print -quit 2>/dev/null | grep -q . && echo 1 || echo 0)")
ONOFF=(OFF ON)
echo "test_packaging: $ROOT -> $T (jobs $JOBS, MPI consumers: ${ONOFF[$HAVE_MPI]}, blas: ${ONOFF[$HAVE_BLAS]})"

# ---------------------------------------------------------------------------------------------
step "1. plain headers: c++ -std=c++20 -I <copy of include> -pthread"
mkdir -p "$T/plain"
cp -r "$ROOT/include" "$T/plain/include"
# Compiled in the background, beside steps 2 to 2c (one compiler on one core while those run
# cmake's single-threaded configures); run and checked at the end of 2c.
"$CXX" -std=c++20 -I "$T/plain/include" -pthread "$PKG/smoke.cpp" -o "$T/plain/smoke" >"$T/plain.log" 2>&1 &
plain_pid=$!
echo "(compiling in the background; run after step 2c)"

# ---------------------------------------------------------------------------------------------
step "2. cmake --install to a prefix; the installed tree and version file"
P="$T/prefix"
configure "$ROOT" "$T/build" -DDTENSOR_BUILD_TESTS=OFF -DDTENSOR_BUILD_EXAMPLES=OFF \
  -DDTENSOR_BUILD_BENCHMARKS=OFF -DDTENSOR_WITH_MPI=${ONOFF[$HAVE_MPI]} \
  -DDTENSOR_WITH_BLAS=${ONOFF[$HAVE_BLAS]} -DCMAKE_INSTALL_PREFIX="$P"
logged "$T/install.log" cmake --install "$T/build"
diff <(cd "$ROOT/include" && find dtensor -type f | sort) <(cd "$P/include" && find dtensor -type f | sort) \
  || fail "the installed include/dtensor differs from the source tree's (see the diff above)"
expected=(dtensorConfig.cmake dtensorConfigVersion.cmake dtensorTargets.cmake FindCUDNN.cmake FindNCCL.cmake)
if [[ $HAVE_MPI == 1 ]]; then expected+=(dtensor_mpiTargets.cmake); fi
if [[ $HAVE_BLAS == 1 ]]; then expected+=(dtensor_blasTargets.cmake); fi
diff <(printf '%s\n' "${expected[@]}" | sort) <(cd "$P/share/dtensor" && ls | sort) \
  || fail "share/dtensor holds other files than expected (see the diff above)"
ok "installed: $(cd "$P/include" && find dtensor -type f | wc -l) headers, share/dtensor/{${expected[*]}}"
# The version file, asked as find_package asks it: SameMinorVersion, and ARCH_INDEPENDENT (a
# 32-bit consumer accepts it too).
cat >"$T/version-check.cmake" <<'EOF'
cmake_minimum_required(VERSION 3.25)
string(REPLACE "." ";" _v "${PACKAGE_FIND_VERSION}")
list(GET _v 0 PACKAGE_FIND_VERSION_MAJOR)
list(GET _v 1 PACKAGE_FIND_VERSION_MINOR)
include("${VERSION_FILE}")
foreach(v COMPATIBLE UNSUITABLE)
  if(PACKAGE_VERSION_${v})
    set(${v} TRUE)
  else()
    set(${v} FALSE)
  endif()
endforeach()
message("${PACKAGE_FIND_VERSION}/${CMAKE_SIZEOF_VOID_P}: compatible=${COMPATIBLE} unsuitable=${UNSUITABLE}")
EOF
version_is() {  # version_is <asked version> <sizeof void*> <compatible: TRUE|FALSE>
  local out
  out=$(cmake -DVERSION_FILE="$P/share/dtensor/dtensorConfigVersion.cmake" -DPACKAGE_FIND_VERSION="$1" \
              -DCMAKE_SIZEOF_VOID_P="$2" -P "$T/version-check.cmake" 2>&1)
  [[ "$out" == *"compatible=$3 unsuitable=FALSE"* ]] || fail "version file: asked $1 with sizeof(void*)=$2: $out"
}
version_is 0.1 8 TRUE
version_is 0.1 4 TRUE
version_is 0.2 8 FALSE
version_is 1.0 8 FALSE
ok "dtensorConfigVersion.cmake: 0.1 accepted on 64 and 32 bits (ARCH_INDEPENDENT), 0.2 and 1.0 refused"

step "2b. find_package consumer of the installed prefix"
configure "$PKG/find_package" "$T/consumer-find" -DCMAKE_PREFIX_PATH="$P" -DCONSUMER_MPI=${ONOFF[$HAVE_MPI]}
grep -q "from $P/share/dtensor" "$T/consumer-find.configure.log" || fail "the consumer did not find $P"
build_and_test "$T/consumer-find" "find_package consumer"
HAVE_GPU=0
if grep -q 'cuda=TRUE nccl=TRUE' "$T/consumer-find.configure.log"; then HAVE_GPU=1; fi

step "2c. package config: component rules (configure-only probes)"
PP=(-DCMAKE_PREFIX_PATH="$P")
NO_MPI=(-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
NO_CUDA=(-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
probe_later optional-mpi-missing 0 'found=1 mpi=FALSE/no-target' \
  "${PP[@]}" "${NO_MPI[@]}" "-DPROBE_ARGS=REQUIRED;OPTIONAL_COMPONENTS;mpi"
probe_later required-mpi-missing fail 'mpi: MPI \(C\+\+\) not found' \
  "${PP[@]}" "${NO_MPI[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;mpi"
probe_later optional-gpu-missing 0 'found=1 mpi=[A-Z]+/[a-z-]+ blas=/no-target cuda=FALSE/no-target nccl=FALSE/no-target' \
  "${PP[@]}" "${NO_CUDA[@]}" "-DPROBE_ARGS=0.1;REQUIRED;OPTIONAL_COMPONENTS;mpi;cuda;nccl"
probe_later required-cuda-missing fail 'cuda: CUDA toolkit not found' \
  "${PP[@]}" "${NO_CUDA[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;cuda"
probe_later nccl-needs-mpi fail 'nccl: .*needs the mpi component' \
  "${PP[@]}" "${NO_MPI[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;nccl"
probe_later unknown-component fail 'nope: unknown component' "${PP[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;nope"
probe_later version-too-new fail 'Could not find a configuration file for package "dtensor"' \
  "${PP[@]}" "-DPROBE_ARGS=0.2;REQUIRED"
if [[ $HAVE_MPI == 1 ]]; then
  probe_later default-components 0 'found=1 mpi=TRUE/target' "${PP[@]}" "-DPROBE_ARGS=REQUIRED"
  probe_later exported-mpi 0 'mpi=TRUE/target' "${PP[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;mpi"
else
  probe_later default-components 0 'found=1 mpi=/no-target' "${PP[@]}" "-DPROBE_ARGS=REQUIRED"
fi
if [[ $HAVE_BLAS == 1 ]]; then
  probe_later exported-blas 0 'blas=TRUE/target' "${PP[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;blas"
fi

run_probes
wait "$plain_pid" || { cat "$T/plain.log"; fail "the plain-headers compile (step 1, in the background)"; }
"$T/plain/smoke" || fail "the plain-headers program"
ok "plain headers (step 1)"

# ---------------------------------------------------------------------------------------------
step "3. add_subdirectory consumer"
configure "$PKG/add_subdirectory" "$T/consumer-subdir" -DDTENSOR_SOURCE_DIR="$ROOT" -DCONSUMER_MPI=${ONOFF[$HAVE_MPI]}
build_and_test "$T/consumer-subdir" "add_subdirectory consumer"

step "3b and 3c. FetchContent consumers: a local path; from git at a commit (docs/consuming.md's snippet)"
# The two side by side (each builds one program: one core), 3c's output shown after 3b's.
# 3c: the checkout's own repository at its HEAD commit, as a user names a commit of the public
# one (what is not committed yet is not in it: the program is the same smoke check).
fetch_git_pid=""
if git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1; then
  (
    configure "$PKG/fetchcontent" "$T/consumer-fetch-git" -DDTENSOR_GIT_REPOSITORY="$ROOT" \
      -DDTENSOR_GIT_TAG="$(git -C "$ROOT" rev-parse HEAD)"
    build_and_test "$T/consumer-fetch-git" "FetchContent consumer (git, GIT_TAG $(git -C "$ROOT" rev-parse --short HEAD))"
  ) >"$T/fetch-git.out" 2>&1 &
  fetch_git_pid=$!
else
  echo "skipped 3c: $ROOT is not a git checkout"
fi
configure "$PKG/fetchcontent" "$T/consumer-fetch" -DDTENSOR_SOURCE_DIR="$ROOT"
build_and_test "$T/consumer-fetch" "FetchContent consumer"
if [[ -n $fetch_git_pid ]]; then
  echo "-- 3c:"
  if ! wait "$fetch_git_pid"; then cat "$T/fetch-git.out"; fail "3c, the FetchContent consumer from git (output above)"; fi
  cat "$T/fetch-git.out"
  PASSED=$((PASSED + 1))  # its ok line was counted in the subshell
fi

# ---------------------------------------------------------------------------------------------
step "4. vcpkg port: portfile with emulated helpers, then a find_package consumer"
V="$T/vcpkg"
# run_port <features> <work dir>: the portfile, then what `vcpkg install` does with its result:
# the package tree copied into installed/<triplet>.
run_port() {
  logged "$2.log" cmake -DPORT_DIR="$ROOT/packaging/vcpkg/ports/dtensor" -DWORK_DIR="$2" \
    -DFEATURES="$1" -P "$PKG/vcpkg/run_portfile.cmake"
  grep -E 'run_portfile:' "$2.log"
  mkdir -p "$2/installed/x64-linux"
  cp -a "$2/packages/dtensor_x64-linux/." "$2/installed/x64-linux/"
  rm -rf "$2/packages" "$2/buildtrees"
}
run_port core "$V"
ok "vcpkg port (core): configured, installed, fixed up and checked"
# The cuda/nccl link checks ran in 2b against the same config file: not built again here.
configure "$PKG/find_package" "$T/consumer-vcpkg" -DCMAKE_PREFIX_PATH="$V/installed/x64-linux" \
  -DCONSUMER_MPI=${ONOFF[$HAVE_MPI]} -DDTENSOR_SMOKE_GPU=OFF
grep -q "from $V/installed/x64-linux/share/dtensor" "$T/consumer-vcpkg.configure.log" \
  || fail "the vcpkg consumer did not find the vcpkg tree"
# The core port exported no component: dtensor::mpi here is the one the config defines.
build_and_test "$T/consumer-vcpkg" "vcpkg consumer"
# The port stamped at a commit (packaging/vcpkg/make-port.sh): its source is that commit, fetched
# by vcpkg_from_git, so the installed headers are the commit's and the port's files (vcpkg's
# binary-cache key) name it.
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  sha=$(git -C "$ROOT" rev-parse HEAD)
  logged "$T/make-port.log" "$ROOT/packaging/vcpkg/make-port.sh" "$T/stamped" --ref "$sha" --url "file://$ROOT"
  grep -q "set(DTENSOR_GIT_REF \"$sha\")" "$T/stamped/dtensor/source.cmake" || fail "the stamped port does not name $sha"
  grep -q '"homepage": ' "$T/stamped/dtensor/vcpkg.json" || fail "the stamped port has no homepage"
  logged "$T/vcpkg-stamped.log" cmake -DPORT_DIR="$T/stamped/dtensor" -DWORK_DIR="$V-stamped" -DFEATURES=core \
    -P "$PKG/vcpkg/run_portfile.cmake"
  mkdir -p "$T/at-commit"
  git -C "$ROOT" archive "$sha" include | tar -x -C "$T/at-commit"
  diff -r "$T/at-commit/include" "$V-stamped/packages/dtensor_x64-linux/include" \
    || fail "the stamped port's headers are not those of commit $sha"
  ok "vcpkg port stamped at $sha: fetched with vcpkg_from_git, headers of that commit"
else
  echo "skipped: the stamped vcpkg port needs a git checkout"
fi
if [[ $HAVE_MPI == 1 ]]; then
  # The port with its backend features: each component is then exported by the port's build.
  # It must be the same target as the one the config defines from the core port: compare both
  # trees (and the cmake --install prefix) as a consumer sees them.
  features="core;mpi" comps="mpi"
  if [[ $HAVE_BLAS == 1 ]]; then features+=";blas" comps+=";blas"; fi
  if [[ $HAVE_GPU == 1 ]]; then features+=";cuda;nccl" comps+=";cuda;nccl"; fi
  run_port "$features" "$V-features"
  ok "vcpkg port ($features): configured, installed, fixed up and checked"
  for c in ${comps//;/ }; do
    [[ -f "$V-features/installed/x64-linux/share/dtensor/dtensor_${c}Targets.cmake" ]] \
      || fail "the $c feature did not export dtensor::$c"
  done
  probe vcpkg-core-comps 0 'mpi=TRUE/target' -DCMAKE_PREFIX_PATH="$V/installed/x64-linux" "-DPROBE_ARGS=REQUIRED;COMPONENTS;$comps"
  probe vcpkg-feature-comps 0 'mpi=TRUE/target' -DCMAKE_PREFIX_PATH="$V-features/installed/x64-linux" "-DPROBE_ARGS=REQUIRED;COMPONENTS;$comps"
  diff <(probe_targets vcpkg-core-comps) <(probe_targets vcpkg-feature-comps) \
    || fail "a component defined by the config differs from the exported one (diff above)"
  diff <(probe_targets vcpkg-core-comps | grep 'dtensor::mpi ') <(probe_targets exported-mpi) \
    || fail "dtensor::mpi of the vcpkg tree differs from the cmake --install one"
  ok "components identical whether exported or defined by the config:"$'\n'"$(probe_targets vcpkg-feature-comps)"
fi

# ---------------------------------------------------------------------------------------------
step "5. Conan 2: conan create + test_package (offline)"
# The test_package is self-contained (conan copies that folder alone); its programs are copies of
# tests/packaging's, which every other consumer runs: they must not drift apart.
for f in smoke.cpp mpi_smoke.cpp smoke_check.hpp; do
  cmp -s "$ROOT/test_package/$f" "$PKG/$f" || fail "test_package/$f differs from tests/packaging/$f (copy it over)"
done
grep -q '\.\./' "$ROOT/test_package/CMakeLists.txt" && fail "test_package/CMakeLists.txt reaches outside test_package/"
ok "test_package self-contained; its programs are tests/packaging's"
VENV=${DTENSOR_CONAN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtensor/conan-venv}
# Conan comes from PyPI (network) the first time, into a venv kept between runs. Where it cannot
# be installed (no network) the Conan steps are skipped, and say so, unless
# DTENSOR_PACKAGING_CONAN=1 makes them required.
HAVE_CONAN=1
if ! "$VENV/bin/conan" --version 2>/dev/null | grep -q 'Conan version 2\.'; then
  echo "+ python3 -m venv $VENV && pip install 'conan>=2,<3'"
  rm -rf "$VENV"
  if ! { python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install --quiet 'conan>=2,<3'; } >"$T/pip.log" 2>&1; then
    if [[ ${DTENSOR_PACKAGING_CONAN:-auto} == 1 ]]; then cat "$T/pip.log"; fail "could not install conan (see above)"; fi
    tail -3 "$T/pip.log"
    echo "SKIPPED: the Conan steps (5, 5b): conan could not be installed (python3-venv missing, or no network for pip)"
    HAVE_CONAN=0
  fi
fi
if [[ $HAVE_CONAN == 1 ]]; then
conan() { "$VENV/bin/conan" "$@"; }
export CONAN_HOME="$T/conan_home"
mkdir -p "$CONAN_HOME"
logged "$T/conan-profile.log" conan profile detect --force
logged "$T/conan-remote.log" conan remote remove '*'   # offline: a header-only package needs none
conan --version
# The test_package builds in $T (not in the tree), with no CMakeUserPresets.json in the tree.
CONAN_ARGS=(-c "tools.build:jobs=$JOBS"
            -c "tools.cmake.cmake_layout:test_folder=$T/conan-test" -c "tools.cmake.cmaketoolchain:user_presets=")
if [[ ${#GEN[@]} -gt 0 ]]; then CONAN_ARGS+=(-c tools.cmake.cmaketoolchain:generator=Ninja); fi
create() {
  echo "+ conan create . $*"
  (cd "$ROOT" && conan create . "${CONAN_ARGS[@]}" "$@") >"$T/conan.log" 2>&1 \
    || { cat "$T/conan.log"; fail "conan create $*"; }
  grep -E '^-- test_package:|^ *[0-9]+/[0-9]+ Test|tests passed' "$T/conan.log"
  ok "conan create $* (test_package ran)"
}
# The default profile as `conan profile detect` writes it (g++ 12: gnu17): the package brings C++20.
grep -E '^compiler\.cppstd=' "$CONAN_HOME/profiles/default" || true
create
# The documented flag too, with the backends this machine has.
extra=()
if [[ $HAVE_MPI == 1 ]]; then extra+=(-o '&:with_mpi=True'); fi
if [[ $HAVE_BLAS == 1 ]]; then extra+=(-o '&:with_blas=True'); fi
if [[ $HAVE_MPI == 1 && $HAVE_GPU == 1 ]]; then extra+=(-o '&:with_cuda=True' -o '&:with_nccl=True'); fi
create -s compiler.cppstd=20 "${extra[@]}"

step "5b. Conan: find_package COMPONENTS through CMakeDeps; validate()"
# A consumer of the default package (with_mpi=False), as `conan install` sets it up.
cd "$T"
# (Run from $T: conan install writes a CMakeUserPresets.json into the current folder otherwise.)
logged "$T/conan-install.log" conan install -c "tools.cmake.cmaketoolchain:user_presets=" --requires "dtensor/$(sed -nE 's/^project\(dtensor VERSION ([0-9.]+).*/\1/p' "$ROOT/CMakeLists.txt")" \
  -g CMakeDeps -g CMakeToolchain --output-folder "$T/conan-consumer"
cd "$ROOT"
CT=(-DCMAKE_TOOLCHAIN_FILE="$T/conan-consumer/conan_toolchain.cmake" -DCMAKE_BUILD_TYPE=Release)
probe conan-optional-mpi 0 'found=1 mpi=FALSE/no-target' "${CT[@]}" "-DPROBE_ARGS=REQUIRED;OPTIONAL_COMPONENTS;mpi;cuda;nccl"
probe conan-required-mpi fail 'mpi: the package was created without -o "dtensor/\*:with_mpi=True"' \
  "${CT[@]}" "-DPROBE_ARGS=REQUIRED;COMPONENTS;mpi"
# invalid <expected message> <options...> — validate() must refuse the configuration.
invalid() {
  local pattern=$1; shift
  if (cd "$ROOT" && conan create . "${CONAN_ARGS[@]}" "$@") >"$T/conan-invalid.log" 2>&1; then
    fail "conan create $* should have been rejected"
  fi
  grep -q -- "$pattern" "$T/conan-invalid.log" || { cat "$T/conan-invalid.log"; fail "conan: expected /$pattern/"; }
  ok "rejected ($*): $(grep -m1 -o -- "$pattern.*" "$T/conan-invalid.log")"
}
invalid 'with_nccl=True needs with_cuda=True' -o '&:with_nccl=True' -o '&:with_mpi=True'
invalid 'with_nccl=True needs with_mpi=True' -o '&:with_nccl=True' -o '&:with_cuda=True'
invalid 'dtensor needs C++20' -s compiler=gcc -s compiler.version=10
fi  # HAVE_CONAN

step ""
printf '\ntest_packaging: all ok in %ds\n%s' $((SECONDS - START)) "$TIMINGS"
echo "packaging: $PASSED passed, $FAILED failed"
