#!/bin/sh
# examples/test_offload.sh TRAINER DIR — train_gpt --offload optimizer (docs/offload.md): the same
# final losses, every digit, as the run with AdamW's moments in memory, through a 4 KiB host buffer
# (the moments are ~50 times that); no file left in DIR after; a missing --offload-dir fails on
# both ranks (each names the failed ranks) and leaves nothing; a run whose AdamW state does not fit
# a --host-budget-mib fails clearly, and trains with --offload optimizer. --offload activations (with
# optimizer, and alone through a 1F1B pipeline of 4 micro-batches) keeps the losses, every digit.
set -eu
trainer=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
flags="--pp 1 --fsdp 2 --cp 1 --tp 1 --steps 3 --eval-every 3 --seq 16 --dim 32"
plain=$("$trainer" $flags | grep '^final losses')
out=$("$trainer" $flags --offload optimizer --offload-dir "$dir" --offload-buffer-kib 4)
offloaded=$(echo "$out" | grep '^final losses')
if [ "$plain" != "$offloaded" ]; then
  echo "FAILED: --offload optimizer changed the run: '$plain' vs '$offloaded'"
  exit 1
fi
echo "$out" | grep '^offload (rank 0)' || { echo "FAILED: no offload summary line"; exit 1; }
if [ -n "$(ls -A "$dir")" ]; then
  echo "FAILED: files left in $dir: $(ls -A "$dir")"
  exit 1
fi
# --offload activations (nn/activation_offload.hpp): every block's saved state through a file.
out=$("$trainer" $flags --offload optimizer,activations --offload-dir "$dir" --offload-buffer-kib 4)
both=$(echo "$out" | grep '^final losses')
[ "$plain" = "$both" ] || { echo "FAILED: --offload optimizer,activations changed the run: '$plain' vs '$both'"; exit 1; }
echo "$out" | grep '^activation offload (rank 0)' || { echo "FAILED: no activation offload summary line"; exit 1; }
pipe="--pp 2 --fsdp 1 --cp 1 --tp 1 --steps 2 --eval-every 2 --seq 16 --dim 32 --layers 4 --schedule 1f1b --microbatches 4"
pipe_plain=$("$trainer" $pipe | grep '^final losses')
pipe_act=$("$trainer" $pipe --offload activations --offload-dir "$dir" | grep '^final losses')
[ "$pipe_plain" = "$pipe_act" ] || { echo "FAILED: --offload activations changed the 1F1B run: '$pipe_plain' vs '$pipe_act'"; exit 1; }
[ -z "$(ls -A "$dir")" ] || { echo "FAILED: files left in $dir after the activation offload runs"; exit 1; }
if err=$("$trainer" $pipe --offload activations --offload-dir "$dir/missing" 2>&1); then
  echo "FAILED: --offload activations with a missing --offload-dir trained"
  exit 1
fi
echo "$err" | grep -q 'nn::ActivationOffload.*does not exist.*failed on rank(s) 0, 1 of 2' || { echo "FAILED: error was: $err"; exit 1; }
# --host-budget-mib (docs/offload.md): DDP over 2 ranks, 1.6 M parameters. With AdamW's moments in
# memory the process holds 49 MiB after building, over a 45 MiB budget: an error on both ranks
# before training, naming the budget and the way out. With them on disk (the budget sizing the
# buffer) it holds 25 MiB plus the buffer, its first step stays within the budget, and the losses
# are the unbudgeted run's, every digit.
big="--pp 1 --dp 2 --fsdp 1 --cp 1 --tp 1 --steps 2 --eval-every 2 --seq 8 --batch 2 --dim 128 --layers 8"
free=$("$trainer" $big | grep '^final losses')
if err=$("$trainer" $big --host-budget-mib 45 2>&1); then
  echo "FAILED: a run over --host-budget-mib 45 trained"
  exit 1
fi
echo "$err" | grep -q 'after building the model and optimizer: .* over the budget of 45.000 MiB .* on rank(s) 0, 1 of 2.*--offload optimizer' ||
  { echo "FAILED: budget error was: $err"; exit 1; }
out=$("$trainer" $big --host-budget-mib 45 --offload optimizer --offload-dir "$dir")
budgeted=$(echo "$out" | grep '^final losses')
if [ "$free" != "$budgeted" ]; then
  echo "FAILED: --host-budget-mib 45 --offload optimizer changed the run: '$free' vs '$budgeted'"
  exit 1
fi
echo "$out" | grep '^host memory budget: 45.000 MiB' || { echo "FAILED: no budget line"; exit 1; }
[ -z "$(ls -A "$dir")" ] || { echo "FAILED: files left in $dir after the budgeted run"; exit 1; }
if err=$("$trainer" $flags --offload optimizer --offload-dir "$dir/missing" 2>&1); then
  echo "FAILED: a missing --offload-dir trained"
  exit 1
fi
echo "$err" | grep -q 'does not exist.*failed on rank(s) 0, 1 of 2' || { echo "FAILED: error was: $err"; exit 1; }
[ ! -e "$dir/missing" ] || { echo "FAILED: $dir/missing was made"; exit 1; }
rm -rf "$dir"
echo "offload OK: $offloaded"
