#!/bin/sh
# examples/test_offload.sh TRAINER DIR — train_gpt --offload optimizer (docs/offload.md): the same
# final losses, every digit, as the run with AdamW's moments in memory, through a 4 KiB host buffer
# (the moments are ~50 times that); no file left in DIR after; a missing --offload-dir fails on
# both ranks (each names the failed ranks) and leaves nothing; a run whose AdamW state does not fit
# a --host-budget-mib fails clearly, and trains with --offload optimizer; --offload params (and
# optimizer,params) keeps the losses on ZeRO-3 over 3 ranks and on bf16 DDP; --sync local-sgd
# with the moments on disk keeps them; bad --offload params input fails on every rank.
# --offload activations (with optimizer, and alone through a 1F1B pipeline of 4 micro-batches)
# keeps the losses, every digit.
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
# --offload params (parallel/fully_shard.hpp offload_params_dir): the FSDP master shards in mapped
# files. ZeRO-3 over 3 ranks (uneven shards) and a bf16 DDP (its fp32 master on disk), each with
# the moments offloaded too: the in-memory run's losses, every digit; the summary reports the
# files' bytes; nothing left in DIR.
same() {  # same NAME FLAGS...: the run with and without --offload optimizer,params ends alike
  name=$1
  shift
  want=$("$trainer" "$@" | grep '^final losses')
  out=$("$trainer" "$@" --offload optimizer,params --offload-dir "$dir" --offload-buffer-kib 4)
  got=$(echo "$out" | grep '^final losses')
  if [ "$want" != "$got" ]; then
    echo "FAILED: --offload optimizer,params changed the $name run: '$want' vs '$got'"
    exit 1
  fi
  echo "$out" | grep '^offload (rank 0): master values' || { echo "FAILED: no params offload line ($name)"; exit 1; }
  [ -z "$(ls -A "$dir")" ] || { echo "FAILED: files left in $dir after the $name run"; exit 1; }
}
same zero3_3ranks --pp 1 --fsdp 3 --cp 1 --tp 1 --steps 3 --eval-every 3 --seq 16 --dim 32 --batch 6
same bf16_ddp --pp 1 --dp 2 --fsdp 1 --cp 1 --tp 1 --steps 3 --eval-every 3 --seq 16 --dim 32 --dtype bf16
# --sync with the moments on disk (no checkpoints): local SGD's replicas, the in-memory run's losses.
sync="--pp 1 --dp 2 --fsdp 1 --cp 1 --tp 1 --steps 4 --eval-every 4 --seq 16 --dim 32 --sync local-sgd --inner-steps 2"
want=$("$trainer" $sync | grep '^final losses')
got=$("$trainer" $sync --offload optimizer --offload-dir "$dir" --offload-buffer-kib 4 | grep '^final losses')
[ "$want" = "$got" ] || { echo "FAILED: --sync local-sgd with --offload optimizer: '$want' vs '$got'"; exit 1; }
# An fp32 DDP has no master apart from its values: --offload params is refused, naming why.
if err=$("$trainer" $flags --zero 1 --offload params --offload-dir "$dir" 2>&1); then
  echo "FAILED: --offload params at fp32 ZeRO-1 trained"
  exit 1
fi
echo "$err" | grep -q "the master values are the model's own" || { echo "FAILED: error was: $err"; exit 1; }
# A missing directory for the parameters: fully_shard fails on both ranks, nothing is made.
if err=$("$trainer" $flags --offload params --offload-dir "$dir/missing" 2>&1); then
  echo "FAILED: a missing --offload-dir for params trained"
  exit 1
fi
echo "$err" | grep -q 'fully_shard.*does not exist.*failed on rank(s) 0, 1 of 2' || { echo "FAILED: params error was: $err"; exit 1; }
[ ! -e "$dir/missing" ] && [ -z "$(ls -A "$dir")" ] || { echo "FAILED: files left after the missing params directory"; exit 1; }
rm -rf "$dir"
echo "offload OK: $offloaded"
