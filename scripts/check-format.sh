#!/usr/bin/env bash
# scripts/check-format.sh — CI's format check: the C++ lines a change touches follow .clang-format
# (clang-format 19; apt installs it when missing). Older lines are left as they are: reformatting
# the whole tree at once (about 6% of its lines) would bury every change's history.
#
#   scripts/check-format.sh               # the lines changed since .clang-format was added (CI)
#   scripts/check-format.sh main          # the lines changed since main: a branch's own
#   scripts/check-format.sh --fix [BASE]  # rewrite those lines in place (git clang-format)
#
# Exit 1 with the diff that would fix the layout when a touched line is off.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
if [[ ${1:-} == --fix ]]; then fix=1; shift; fi
base=${1:-$(git log --diff-filter=A --format=%H -- .clang-format | tail -1)}
if [[ -z $base ]]; then echo "check-format: .clang-format is not committed; nothing to compare with"; exit 1; fi
if ! command -v clang-format-19 >/dev/null; then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "check-format: installing clang-format-19"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang-format-19
fi
files=('*.hpp' '*.cpp' '*.cuh' '*.cu' '*.h')
if [[ $fix == 1 ]]; then
  git clang-format-19 --binary clang-format-19 --force "$base" -- "${files[@]}" || true
  exit 0
fi
if out=$(git clang-format-19 --binary clang-format-19 --diff "$base" -- "${files[@]}"); then
  echo "check-format: every C++ line changed since ${base:0:12} follows .clang-format"
  exit 0
fi
echo "$out"
echo "check-format: the lines above, changed since ${base:0:12}, do not follow .clang-format (fix: scripts/check-format.sh --fix $base)"
exit 1
