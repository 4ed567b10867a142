#!/usr/bin/env bash
# scripts/check-clang.sh — CI's clang job (.ci/run): the oldest clang supported (14, Debian 12's
# default clang++) and the newest installed (19..16), each at -Wall -Wextra -Wpedantic -Werror,
# -fsyntax-only (parsing and template instantiation, no object files), over:
#   - one generated translation unit that includes every public header (include/dtensor/**.hpp;
#     each header alone is compiled by g++ in the test suite), and
#   - the examples that instantiate most of the library: train_gpt.cpp (the trainer) and
#     plan_auto_dry.cpp (the dry run of every model, include/dtensor/sim and models/) with both
#     compilers, plan_at_scale.cpp (the planner's reports and search) with the newest.
#
#   scripts/check-clang.sh                         # clang++-14 and the newest; apt installs what is missing
#   CXX=clang++-17 scripts/check-clang.sh          # only that compiler, the full list
#
# Debian 12 (bookworm) installs clang-14 (the default clang++), clang-15, clang-16 and, from
# bookworm-updates, clang-19. Measured 2026-11-29 on a quiet 2-core machine, the compiles two at a
# time: clang-19 train_gpt 25 s, all headers 7 s, plan_at_scale 5 s; clang-14 train_gpt 21 s, all
# headers 5 s, plan_auto_dry 20 s; the whole job 33 s before plan_auto_dry was added.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
apt_install() {
  echo "check-clang: installing $1"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$1"
}

# Every public header in one translation unit; the MPI backend's headers need mpi.h (without an
# MPI installation they are left out, and said so).
mpi_flags=()
if command -v mpicxx >/dev/null && mpi_show=$(mpicxx -showme:compile 2>/dev/null); then
  read -r -a mpi_flags <<< "$mpi_show"
  mpi_flags=("${mpi_flags[@]/#-I/-isystem}")  # MPI's own headers are not ours to warn about
elif command -v mpicxx >/dev/null && mpi_show=$(mpicxx -compile_info 2>/dev/null); then  # MPICH
  for w in $mpi_show; do [[ $w == -I* ]] && mpi_flags+=("-isystem${w#-I}"); done
fi
all_headers=$(mktemp --suffix=.cpp)
{
  while IFS= read -r h; do
    if [[ ${#mpi_flags[@]} -eq 0 ]] && grep -q '<mpi.h>' "$h"; then continue; fi
    echo "#include <${h#include/}>"
  done < <(find include/dtensor -name '*.hpp' | LC_ALL=C sort)
  echo "int main() { return 0; }"
} > "$all_headers"
if [[ ${#mpi_flags[@]} -eq 0 ]]; then echo "check-clang: no mpicxx; the MPI backend's headers are left out"; fi

# The compiles run side by side, as many at once as there are cores (DTENSOR_TEST_JOBS): each
# is one single-threaded compiler, and one after another they left a core idle for about two
# minutes of CI. Each job's output is kept and printed whole when it ends.
jobs=${DTENSOR_TEST_JOBS:-$(nproc)}
logs=$(mktemp -d)
trap 'rm -f "$all_headers"; rm -rf "$logs"' EXIT
failed=0
running=0
njob=0
check_one() {  # check_one COMPILER FILE: one compile, its verdict on the last line of output
  local cxx=$1 f=$2 start=$SECONDS extra=()
  if [[ $f == "$all_headers" ]]; then extra=("${mpi_flags[@]}"); fi
  # clang 19 flags libstdc++ 12's own std::get_temporary_buffer (deprecated in C++20), which
  # std::stable_sort calls: a warning, not an error.
  if "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -Wno-error=deprecated-declarations \
       -I include -I examples -I tests "${extra[@]}" "$f"; then
    echo "ok: ${f/#$all_headers/every public header} ($((SECONDS - start)) s, $cxx)"
  else
    echo "FAILED: ${f/#$all_headers/every public header} ($cxx)"
    return 1
  fi
}
reap() {  # wait for one running job; a failed one fails the script
  if ! wait -n; then failed=1; fi
  running=$((running - 1))
}
check() {  # check COMPILER FILE...: queue one job per file
  local cxx=$1 f
  shift
  echo "check-clang: $("$cxx" --version | head -1)"
  for f in "$@"; do
    while ((running >= jobs)); do reap; done
    njob=$((njob + 1))
    check_one "$cxx" "$f" > "$logs/$njob.log" 2>&1 &
    running=$((running + 1))
  done
}
finish() {  # wait for the rest, print every job's output in order
  while ((running > 0)); do reap; done
  local i
  for ((i = 1; i <= njob; i++)); do cat "$logs/$i.log"; done
  exit $failed
}

newest_installed() {
  local v
  for v in 19 18 17 16; do
    if command -v "clang++-$v" >/dev/null; then echo "clang++-$v"; return; fi
  done
}
ensure_compilers() {  # clang-14 and a newest one, installed when missing
  command -v clang++-14 >/dev/null || apt_install clang-14
  if [[ -z $(newest_installed) ]]; then apt_install clang-19; fi
}

# --install-only: install the compilers and stop (.ci/run starts this during the main build, so that
# the download does not wait for the build).
if [[ ${1:-} == --install-only ]]; then
  ensure_compilers
  exit 0
fi

if [[ -n ${CXX:-} ]]; then
  command -v "$CXX" >/dev/null || { echo "check-clang: $CXX not found"; exit 1; }
  check "$CXX" "$all_headers" examples/train_gpt.cpp examples/plan_auto_dry.cpp examples/plan_at_scale.cpp
  finish
fi

ensure_compilers
newest=$(newest_installed)
# The longest compile (train_gpt) first, so that the others fill the second core beside it.
check "$newest" examples/train_gpt.cpp "$all_headers" examples/plan_auto_dry.cpp examples/plan_at_scale.cpp
check clang++-14 examples/train_gpt.cpp "$all_headers" examples/plan_auto_dry.cpp
finish
