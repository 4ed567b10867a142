#!/usr/bin/env bash
# examples/test_top_p.sh TRAIN_GPT WORKDIR — --top-p reaches models::generate: with a nucleus of
# P = 1e-9 only the most likely character survives each draw (the sort keeps ties in index
# order, as greedy's first-largest does), so sampling at temperature 1 must give the greedy
# run's text; the same run with --top-p 1 (all characters) must not, else the test cannot tell.
# The same --seed everywhere: the weights are the same bits in the three runs. Prints PASS.
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
model=(--pp 1 --dp 1 --fsdp 1 --cp 1 --tp 1 --layers 2 --heads 2 --dim 16 --seq 16 --batch 4 --steps 2 --generate 32)
text() { sed -n '/^generated (/,$p' "$1" | tail -n +2; }  # the text may hold newlines
"$bin" "${model[@]}" >"$dir/greedy.log"
"$bin" "${model[@]}" --temperature 1 --top-p 1e-9 >"$dir/nucleus.log"
"$bin" "${model[@]}" --temperature 1 --top-p 1 >"$dir/all.log"
grep -q '^generated (temperature 1, top-k 0, top-p 1e-09,' "$dir/nucleus.log"
g=$(text "$dir/greedy.log")
n=$(text "$dir/nucleus.log")
a=$(text "$dir/all.log")
if [[ -z $g || $g != "$n" ]]; then
  echo "FAIL: --top-p 1e-9 at temperature 1 is not greedy: '$n' vs '$g'"
  exit 1
fi
if [[ $a == "$g" ]]; then
  echo "FAIL: --top-p 1 samples the greedy text too: the test cannot tell"
  exit 1
fi
echo "PASS: greedy = top-p 1e-9: '$g'; top-p 1: '$a'"
