#!/usr/bin/env bash
# scripts/check-clang.sh — CI's clang job (.ci/run): the oldest clang supported (14, Debian 12's
# default clang++) and the newest installed (19..16), each at -Wall -Wextra -Wpedantic -Werror,
# -fsyntax-only (parsing and template instantiation, no object files), over:
#   - one generated translation unit that includes every public header (include/dtensor/**.hpp;
#     each header alone is compiled by g++ in the test suite), and
#   - the examples that instantiate most of the library: train_gpt.cpp (227 of the 252 headers)
#     with both compilers, plan_at_scale.cpp (the dry-run planner, include/dtensor/sim) with the
#     newest only.
#
#   scripts/check-clang.sh                         # clang++-14 and the newest; apt installs what is missing
#   CXX=clang++-17 scripts/check-clang.sh          # only that compiler, the full list
#
# Debian 12 (bookworm) installs clang-14 (the default clang++), clang-15, clang-16 and, from
# bookworm-updates, clang-19. Measured 2026-11-29 on the shared 2-core machine with clang-14: all
# headers 9 s, train_gpt 24 s, plan_at_scale 63 s (the list before, with clang-16, took about
# 5 minutes: quickstart 13 s, plan_at_scale 141 s, train_gpt 80 s, test_trace 69 s; test_trace,
# quickstart and test_pipeline_schedule add no header that these do not parse).
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
trap 'rm -f "$all_headers"' EXIT
{
  while IFS= read -r h; do
    if [[ ${#mpi_flags[@]} -eq 0 ]] && grep -q '<mpi.h>' "$h"; then continue; fi
    echo "#include <${h#include/}>"
  done < <(find include/dtensor -name '*.hpp' | LC_ALL=C sort)
  echo "int main() { return 0; }"
} > "$all_headers"
if [[ ${#mpi_flags[@]} -eq 0 ]]; then echo "check-clang: no mpicxx; the MPI backend's headers are left out"; fi

failed=0
check() {  # check COMPILER FILE...
  local cxx=$1 f start
  shift
  echo "check-clang: $("$cxx" --version | head -1)"
  for f in "$@"; do
    start=$SECONDS
    local extra=()
    if [[ $f == "$all_headers" ]]; then extra=("${mpi_flags[@]}"); fi
    # clang 19 flags libstdc++ 12's own std::get_temporary_buffer (deprecated in C++20), which
    # std::stable_sort calls: a warning, not an error.
    if "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -Wno-error=deprecated-declarations \
         -I include -I examples -I tests "${extra[@]}" "$f"; then
      echo "ok: ${f/#$all_headers/every public header} ($((SECONDS - start)) s, $cxx)"
    else
      echo "FAILED: ${f/#$all_headers/every public header} ($cxx)"
      failed=1
    fi
  done
}

if [[ -n ${CXX:-} ]]; then
  command -v "$CXX" >/dev/null || { echo "check-clang: $CXX not found"; exit 1; }
  check "$CXX" "$all_headers" examples/train_gpt.cpp examples/plan_at_scale.cpp
  exit $failed
fi

command -v clang++-14 >/dev/null || apt_install clang-14
newest=""
for v in 19 18 17 16; do
  if command -v "clang++-$v" >/dev/null; then newest=clang++-$v; break; fi
done
if [[ -z $newest ]]; then apt_install clang-19; newest=clang++-19; fi
check clang++-14 "$all_headers" examples/train_gpt.cpp
check "$newest" "$all_headers" examples/train_gpt.cpp examples/plan_at_scale.cpp
exit $failed
