#!/usr/bin/env bash
# The -O2 compile time and peak memory of bench/compile/user_fsdp_tp.cpp against several versions
# of the headers, interleaved (docs/benchmarks.md, "A user's FSDP x TP program: compile time and
# memory"):
#
#   bench/compile/measure.sh [-r ROUNDS] [-w WORKDIR] [-g] VERSION...
#
# -g fixes GCC's garbage-collector thresholds (--param ggc-min-expand=100 --param
# ggc-min-heapsize=131072, this machine's defaults written out): GCC's peak moves in steps with
# where its collections fall, and the defaults depend on the machine's RAM.
#
# A VERSION is a commit of this repository (its include/ is taken with git archive) or a directory
# holding an include/ (a worktree with uncommitted changes). Each round compiles every version in
# turn, each compile after bench/compile/reference_unit.cpp (standard library only, unchanged: its
# user time gauges the machine's load). One line per compile:
#   round version user_s elapsed_s peak_MB text_bytes reference_user_s load_average_1min
# Nothing here is built by CMake. Run it on a quiet machine, or read the reference's column.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
rounds=3
work=${TMPDIR:-/tmp}/dtensor-ctime
gc_flags=()
while getopts "r:w:g" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    w) work=$OPTARG ;;
    g) gc_flags=(--param ggc-min-expand=100 --param ggc-min-heapsize=131072) ;;
    *) echo "usage: $0 [-r ROUNDS] [-w WORKDIR] [-g] VERSION..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-r ROUNDS] [-w WORKDIR] [-g] VERSION..." >&2; exit 2; }
mkdir -p "$work"
cxx=${CXX:-g++}
flags=(-std=c++20 -O2 -c)
flags+=("${gc_flags[@]}")

declare -A include_of
for v in "$@"; do
  if [ -d "$v/include" ]; then
    include_of[$v]=$(cd "$v" && pwd)/include
  else
    commit=$(git -C "$repo" rev-parse --short "$v^{commit}")
    if [ ! -d "$work/$commit/include" ]; then
      mkdir -p "$work/$commit"
      git -C "$repo" archive "$commit" include | tar -x -C "$work/$commit"
    fi
    include_of[$v]=$work/$commit/include
  fi
done

timed() {  # prints "user elapsed peak_kB" of the compile given
  /usr/bin/time -f "%U %e %M" -o "$work/time.txt" "$@" >/dev/null
  cat "$work/time.txt"
}

echo "# $(${cxx} --version | head -1); $(lscpu | grep 'Model name' | sed 's/  */ /g'); $(nproc) cores"
[ ${#gc_flags[@]} -eq 0 ] || echo "# ${gc_flags[*]}"
echo "# round version user_s elapsed_s peak_MB text_bytes reference_user_s load_1min"
for ((r = 1; r <= rounds; ++r)); do
  for v in "$@"; do
    read -r ref_user _ _ < <(timed "$cxx" "${flags[@]}" "$here/reference_unit.cpp" -o "$work/reference.o")
    load=$(cut -d' ' -f1 /proc/loadavg)
    read -r user elapsed peak_kb < <(timed "$cxx" "${flags[@]}" -I"${include_of[$v]}" "$here/user_fsdp_tp.cpp" \
      -o "$work/user.o")
    text=$(size "$work/user.o" | awk 'NR == 2 { print $1 }')
    echo "$r $v $user $elapsed $((peak_kb / 1024)) $text $ref_user $load"
  done
done
