#!/usr/bin/env bash
# examples/test_plan_auto_search.sh PLAN_AT_SCALE TRAIN_GPT — train_gpt --plan auto and
# plan_at_scale --search choose the same plan for the same model and rank count: both enumerate
# every factorization (sim::SearchSpace::exhaustive, up to sim::exhaustive_gpus ranks), dry-run
# the 12 analytic best and rank them by the dry run's step (examples/plan_rescore.hpp). Each
# model below is run through both; the plan each prints first (sim::describe) must be the same
# and the trainer must say it ranked by the dry run. Prints PASS.
set -euo pipefail
plan=$1
train=$2
check() {
  local ranks=$1
  shift
  local s t
  s=$("$plan" --search --gpus "$ranks" --vocab 256 --mlp-ratio 4 --dtype f32 --top 1 "$@" | sed -n 's/^1\. \(.*\): step .*/\1/p')
  t=$("$train" --plan auto --ranks "$ranks" --steps 1 --eval-every 1 "$@" | tee /dev/stderr |
      sed -n "s/^  --.*  (\(.*\)): step .*(analytic .*/\1/p" | head -1)
  echo "ranks $ranks $*: search '$s', plan auto '$t'"
  if [[ -z $s || $s != "$t" ]]; then
    echo "FAIL: the two choose differently"
    exit 1
  fi
}
check 4 --layers 4 --dim 32 --heads 4 --seq 16 --batch 32
check 8 --layers 8 --dim 64 --heads 8 --seq 32 --batch 16
echo PASS
