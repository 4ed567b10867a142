#!/usr/bin/env bash
# scripts/check-clang.sh — CI's clang job (.ci/run): the examples and a test subset through clang at
# -Wall -Wextra -Wpedantic -Werror (syntax and template instantiation only: -fsyntax-only, no
# object files).
#
#   scripts/check-clang.sh                 # the newest clang++-19..16 installed; none: apt installs clang-19
#   CXX=clang++-14 scripts/check-clang.sh  # the oldest clang supported
#
# Debian 12 (bookworm) installs clang-14 (the default clang++), clang-15, clang-16 and, from
# bookworm-updates, clang-19. On the 2-core CI machine it takes about 5 minutes (measured
# 2026-11-25: quickstart 13 s, plan_at_scale 141 s, train_gpt 80 s, test_trace 69 s with
# clang-16, the machine shared).
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-}
if [[ -z $cxx ]]; then
  for v in 19 18 17 16; do
    if command -v "clang++-$v" >/dev/null; then cxx=clang++-$v; break; fi
  done
fi
if [[ -z $cxx ]]; then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "check-clang: no clang++ 16 to 19 found; installing clang-19"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang-19
  cxx=clang++-19
fi
command -v "$cxx" >/dev/null || { echo "check-clang: $cxx not found (Debian 12: apt-get install clang-19)"; exit 1; }
echo "check-clang: $("$cxx" --version | head -1)"
files=(examples/quickstart.cpp examples/plan_at_scale.cpp examples/train_gpt.cpp
       tests/unit/test_trace.cpp tests/unit/test_pipeline_schedule.cpp)
failed=0
for f in "${files[@]}"; do
  start=$SECONDS
  if "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -I include -I examples -I tests "$f"; then
    echo "ok: $f ($((SECONDS - start)) s, $cxx)"
  else
    echo "FAILED: $f ($cxx)"
    failed=1
  fi
done
exit $failed
