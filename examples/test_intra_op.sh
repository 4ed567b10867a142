#!/usr/bin/env bash
# examples/test_intra_op.sh — train_gpt --intra-op-threads gives the same run bit for bit (a
# CTest case, examples/CMakeLists.txt; kernels/host/parallel.hpp, docs/host-kernels.md).
#
#   test_intra_op.sh TRAINER WORKDIR
#
# The same model trained with 1, 2 and 3 intra-op threads per rank (3: blocks that do not divide
# the rows), on 1 rank and on 2 ranks of the threads backend (a pool per rank): the final train
# and validation losses (17 digits, after 3 steps of AdamW) must be the same text. The sizes make the
# kernels split (1024 rows of dim 128: LayerNorm, GELU, AdamW and attention's 64 heads run in
# blocks), so a kernel whose bits depend on the thread count fails here.
set -euo pipefail
trainer=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
model=(--pp 1 --fsdp 1 --cp 1 --tp 1 --layers 2 --heads 4 --dim 128 --seq 64 --batch 16 --steps 3 --eval-every 3)
losses() { grep -oE 'final losses at step [0-9]+: train [^ ]+ validation [^ ]+' "$1"; }
for dp in 1 2; do
  for t in 1 2 3; do
    "$trainer" "${model[@]}" --dp "$dp" --intra-op-threads "$t" >"$work/dp${dp}_t${t}.log"
  done
  want=$(losses "$work/dp${dp}_t1.log")
  [[ -n $want ]] || { echo "FAIL: no losses in $work/dp${dp}_t1.log"; exit 1; }
  echo "dp $dp, 1 intra-op thread:"
  echo "$want"
  for t in 2 3; do
    got=$(losses "$work/dp${dp}_t${t}.log")
    [[ $got == "$want" ]] || { echo "FAIL: dp $dp with --intra-op-threads $t differs:"; echo "$got"; exit 1; }
  done
done
echo "PASS: 1, 2 and 3 intra-op threads train alike bit for bit (1 and 2 ranks)"
