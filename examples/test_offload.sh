#!/bin/sh
# examples/test_offload.sh TRAINER DIR — train_gpt --offload optimizer (docs/offload.md): the same
# final losses, every digit, as the run with AdamW's moments in memory, through a 4 KiB host buffer
# (the moments are ~50 times that); no file left in DIR after; a missing --offload-dir fails on
# both ranks (each names the failed ranks) and leaves nothing.
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
if err=$("$trainer" $flags --offload optimizer --offload-dir "$dir/missing" 2>&1); then
  echo "FAILED: a missing --offload-dir trained"
  exit 1
fi
echo "$err" | grep -q 'does not exist.*failed on rank(s) 0, 1 of 2' || { echo "FAILED: error was: $err"; exit 1; }
[ ! -e "$dir/missing" ] || { echo "FAILED: $dir/missing was made"; exit 1; }
rm -rf "$dir"
echo "offload OK: $offloaded"
