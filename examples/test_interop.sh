#!/usr/bin/env bash
# examples/test_interop.sh TRAIN_GPT WORKDIR — --export, --init-from and --generate end to end:
# train 3 steps on pp 2 x fsdp 2 x tp 2 (ZeRO-3, DualPipeV), export the weights and generate 24
# characters greedily; then start a one-rank run from the exported file (--init-from), take one
# step at a learning rate far below float's resolution (the weights stay the same bits) and
# generate again: the text must be the same. Prints PASS.
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
model=(--layers 2 --heads 4 --dim 32 --seq 16 --batch 8 --generate 24 --prompt "The ")
"$bin" --pp 2 --dp 1 --fsdp 2 --cp 1 --tp 2 --schedule dualpipev --microbatches 4 --steps 3 "${model[@]}" \
  --export "$dir/model.safetensors" >"$dir/a.log"
"$bin" --pp 1 --dp 1 --fsdp 1 --cp 1 --tp 1 --steps 1 --lr 1e-30 --init-from "$dir/model.safetensors" "${model[@]}" >"$dir/b.log"
text() { sed -n '/^generated (greedy/{n;p}' "$1"; }
a=$(text "$dir/a.log")
b=$(text "$dir/b.log")
grep -q "weights exported to $dir/model.safetensors" "$dir/a.log"
grep -q "weights from $dir/model.safetensors" "$dir/b.log"
if [[ -z $a || $a != "$b" ]]; then
  echo "FAIL: generated text differs: '$a' vs '$b'"
  exit 1
fi
# The file is plain safetensors: 8-byte length, then a JSON header naming the GPT's tensors.
head -c 200 "$dir/model.safetensors" | tail -c +9 | grep -q '"dtype":"F32"'
echo "PASS: '$a'"
