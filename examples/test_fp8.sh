#!/bin/sh
# examples/test_fp8.sh TRAINER [ARGS...] — train_gpt --dtype fp8 (the host emulation of FP8 training,
# docs/fp8.md; with TRAINER train_gpt_cuda and ARGS --device cuda, cuBLASLt's FP8 GEMMs on the GPU)
# against --dtype bf16 over the same 20 steps of a tiny model, on 1 rank and on
# tp 2 (+ SP): the final train and validation losses of fp8 within 1% (relative) of bf16's on
# the same mesh, not equal to them (the Linears did quantize), and the tp 2 fp8 run within 0.1%
# of the 1-rank fp8 run (equal scales on every rank: the amaxes are max-all-reduced). Measured
# when written (host): fp8/bf16 differ by 0.03-0.16%, fp8 tp 2 / 1 rank by 0.01-0.03%. A usage error
# for --dtype fp8 with --checkpoint. On the GPU without a usable one: prints SKIP.
set -eu
trainer=$1
shift
model="--layers 2 --heads 2 --dim 32 --seq 16 --batch 8 --steps 20 --eval-every 20"
one="--pp 1 --fsdp 1 --cp 1 --tp 1"
tp2="--pp 1 --fsdp 1 --cp 1 --tp 2"
# "train validation" of a run's final losses (all digits).
losses() { "$trainer" "$@" $model | sed -n 's/^final losses at step 20: train \([^ ]*\) validation \([^ ]*\)$/\1 \2/p'; }
if ! out=$("$trainer" "$@" $model $one --dtype fp8 2>&1); then
  case "$out" in
    *"needs a usable GPU"*) echo "$out" | grep "needs a usable GPU"; echo "SKIP: no usable GPU"; exit 0 ;;
  esac
  echo "$out"
  echo "FAILED: the fp8 run"
  exit 1
fi
header=$(echo "$out" | grep '^train_gpt[a-z_]*: mesh')
case "$header" in
  *"dtype fp8 (E4M3/E5M2"*) ;;
  *) echo "FAILED: the fp8 run's header does not name fp8: $header"; exit 1 ;;
esac
# within A B TOL WHAT: each of the two losses of A within TOL (relative) of B's.
within() {
  awk -v a="$1" -v b="$2" -v tol="$3" -v what="$4" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= 2; i++) {
      d = x[i] - y[i]; if (d < 0) d = -d;
      if (x[i] == "" || y[i] == "" || d > tol * y[i]) { printf "FAILED: %s: %s vs %s (tolerance %s)\n", what, a, b, tol; exit 1 }
    }
    printf "%s: %s vs %s (within %s)\n", what, a, b, tol }'
}
fp8_one=$(losses "$@" $one --dtype fp8)
bf16_one=$(losses "$@" $one --dtype bf16)
fp8_tp2=$(losses "$@" $tp2 --dtype fp8)
bf16_tp2=$(losses "$@" $tp2 --dtype bf16)
within "$fp8_one" "$bf16_one" 0.01 "fp8 vs bf16, 1 rank"
within "$fp8_tp2" "$bf16_tp2" 0.01 "fp8 vs bf16, tp 2"
within "$fp8_tp2" "$fp8_one" 0.001 "fp8 tp 2 vs 1 rank"
if [ "$fp8_one" = "$bf16_one" ]; then
  echo "FAILED: fp8 equals bf16 to every digit ($fp8_one): the Linears did not quantize"
  exit 1
fi
if err=$("$trainer" "$@" $model $one --dtype fp8 --checkpoint 2>&1 > /dev/null); then
  echo "FAILED: --dtype fp8 --checkpoint ran"
  exit 1
fi
case "$err" in
  *"--dtype fp8 with --checkpoint"*) ;;
  *) echo "FAILED: no usage error for --dtype fp8 --checkpoint: $err"; exit 1 ;;
esac
echo "fp8 OK"
