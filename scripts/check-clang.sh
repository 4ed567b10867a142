#!/usr/bin/env bash
# scripts/check-clang.sh — the examples and a test subset through clang at -Wall -Wextra -Werror
# (syntax and template instantiation only: -fsyntax-only, no object files).
#
#   scripts/check-clang.sh                 # clang++-16 (Debian 12: apt-get install clang-16)
#   CXX=clang++-14 scripts/check-clang.sh  # the oldest clang supported
#
# Not part of scripts/run-tests.sh: on the 2-core CI machine it takes about 5 minutes (measured
# 2026-11-25: quickstart 13 s, plan_at_scale 141 s, train_gpt 80 s, test_trace 69 s with
# clang-16, the machine shared), over the 4 minutes a CI addition may cost.
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-clang++-16}
command -v "$cxx" >/dev/null || { echo "check-clang: $cxx not found (Debian 12: apt-get install clang-16)"; exit 1; }
files=(examples/quickstart.cpp examples/plan_at_scale.cpp examples/train_gpt.cpp
       tests/unit/test_trace.cpp tests/unit/test_pipeline_schedule.cpp)
failed=0
for f in "${files[@]}"; do
  start=$SECONDS
  if "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I include -I examples -I tests "$f"; then
    echo "ok: $f ($((SECONDS - start)) s, $cxx)"
  else
    echo "FAILED: $f ($cxx)"
    failed=1
  fi
done
exit $failed
