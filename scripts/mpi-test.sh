#!/usr/bin/env bash
# scripts/mpi-test.sh — list an MPI test program's tests, then run them under mpirun.
#
#   scripts/mpi-test.sh build-mpi/tests/mpi/test_comm_mpi              # 4 ranks, all tests
#   scripts/mpi-test.sh -n 8 build-mpi/tests/mpi/test_comm_mpi "[mpi]"  # 8 ranks, Catch2 filter
#   scripts/mpi-test.sh --list build-mpi/tests/mpi/test_comm_mpi       # list only (no mpirun)
#   scripts/mpi-test.sh -n 8 --mpirun "--hostfile hosts --mca btl tcp,self" PROG "[mpi]"  # mpirun args
#
# Listing needs no MPI (the test main skips MPI_Init for --list-*). Running sets what OpenMPI
# needs in a container: running as root, more ranks than cores, idle ranks that yield the CPU,
# no single-copy (CMA) transport; and a 30 s dtensor timeout. Arguments after PROGRAM go to the
# test program (Catch2 options); each --mpirun ARGS before it goes to mpirun (split at spaces).
# Every DTENSOR_* variable set here (and OPENBLAS_*, which picks the BLAS kernels) is forwarded
# with -x, so that ranks mpirun starts on other hosts run with the same settings (the ranks
# check that they agree at start-up: include/dtensor/comm/env_agreement.hpp).
set -euo pipefail

ranks=4
list_only=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    --list) list_only=1; shift ;;
    --mpirun) read -r -a words <<<"$2"; extra+=("${words[@]}"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "$0: unknown option '$1' (mpirun's options go with --mpirun '...'; the program's after it)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [-n RANKS] [--list] [--mpirun ARGS]... [--] PROGRAM [catch2 args...]" >&2; exit 2; }
prog="$1"; shift

echo "== tests in ${prog}:"
"${prog}" --list-test-names-only "$@" || true  # Catch2 exits with the number of tests listed
if [[ ${list_only} -eq 1 ]]; then exit 0; fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl_base_warn_component_unused=0
# As under CTest: a collective that hangs becomes a dtensor Error after 30 s, not 5 minutes.
export DTENSOR_TIMEOUT_MS="${DTENSOR_TIMEOUT_MS:-30000}"
mpirun_flags=()
if [[ "$(mpirun --version 2>/dev/null)" == *"Open MPI"* ]]; then
  mpirun_flags=(--allow-run-as-root --oversubscribe)
  for v in $(compgen -e | grep -E '^(DTENSOR_|OPENBLAS_)' || true); do mpirun_flags+=(-x "${v}"); done
fi
mpirun_flags+=("${extra[@]}")
echo "== mpirun ${mpirun_flags[*]} -n ${ranks} ${prog} $*"
exec mpirun "${mpirun_flags[@]}" -n "${ranks}" "${prog}" "$@"
