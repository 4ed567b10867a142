#!/usr/bin/env bash
# examples/test_interop.sh TRAIN_GPT WORKDIR — --export, --init-from and --generate end to end:
# train 3 steps on pp 2 x fsdp 2 x tp 2 (ZeRO-3, DualPipeV), export the weights and generate 32
# characters; then start a one-rank run from the exported file (--init-from), take one
# step at a learning rate far below float's resolution (the weights stay the same bits) and
# generate again: the text must be the same. Prints PASS.
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
# Sampled at temperature 1 (seeded by --seed, the same in every run): the text follows the
# logits closely, so other weights give another text (the control run below).
model=(--layers 4 --heads 4 --dim 32 --seq 16 --batch 8 --generate 32 --prompt "The " --temperature 1)
"$bin" --pp 2 --dp 1 --fsdp 2 --cp 1 --tp 2 --schedule dualpipev --microbatches 4 --steps 3 "${model[@]}" \
  --export "$dir/model.safetensors" >"$dir/a.log"
"$bin" --pp 1 --dp 1 --fsdp 1 --cp 1 --tp 1 --steps 1 --lr 1e-30 --init-from "$dir/model.safetensors" "${model[@]}" >"$dir/b.log"
text() { sed -n '/^generated (/,$p' "$1" | tail -n +2; }  # the text may hold newlines
a=$(text "$dir/a.log")
b=$(text "$dir/b.log")
grep -q "weights exported to $dir/model.safetensors" "$dir/a.log"
grep -q "weights from $dir/model.safetensors" "$dir/b.log"
if [[ -z $a || $a != "$b" ]]; then
  echo "FAIL: generated text differs: '$a' vs '$b'"
  exit 1
fi
# Control: the same one-rank run from the random init generates something else.
"$bin" --pp 1 --dp 1 --fsdp 1 --cp 1 --tp 1 --steps 1 --lr 1e-30 "${model[@]}" >"$dir/d.log"
if [[ $(text "$dir/d.log") == "$a" ]]; then
  echo "FAIL: the run without --init-from generates the same text: the test cannot tell"
  exit 1
fi
# The file is plain safetensors: 8-byte length, then a JSON header naming the GPT's tensors (after
# the __metadata__ with each tensor's checksum), and every tensor's checksum in it.
head -c 8192 "$dir/model.safetensors" | tail -c +9 | grep -aq '"dtype":"F32"'
head -c 8192 "$dir/model.safetensors" | grep -aq '"dtensor.sum64:h.0.attn.qkv.weight":"[0-9a-f]\{16\}"'
# The exported file damaged after writing (bytes zeroed in a tensor's data): --init-from refuses it.
cp "$dir/model.safetensors" "$dir/damaged.safetensors"
size=$(stat -c %s "$dir/damaged.safetensors")
dd if=/dev/zero of="$dir/damaged.safetensors" bs=1 seek=$((size - 64)) count=32 conv=notrunc status=none
if "$bin" --pp 1 --dp 1 --fsdp 1 --cp 1 --tp 1 --steps 1 --init-from "$dir/damaged.safetensors" "${model[@]}" >"$dir/e.log" 2>&1; then
  echo "FAIL: --init-from loaded a damaged file"
  exit 1
fi
grep -q "damaged.safetensors: tensor '.*': its data's checksum is" "$dir/e.log" || { echo "FAIL: damaged file:"; cat "$dir/e.log"; exit 1; }
# Where Python has safetensors and numpy (pip; Debian 12 packages neither, so CI skips this):
# Python reads the exported file, writes it again its own way, and a run started from that file
# generates the same text.
python=${DTENSOR_PYTHON:-python3}
if "$python" -c "import safetensors.numpy" 2>/dev/null; then
  "$python" - "$dir/model.safetensors" "$dir/python.safetensors" <<'PY'
import sys
from safetensors.numpy import load_file, save_file
tensors = load_file(sys.argv[1])
assert tensors and all(t.dtype.name == "float32" for t in tensors.values()), "not all F32"
assert "wte.weight" in tensors and "h.0.attn.qkv.weight" in tensors, sorted(tensors)
save_file(tensors, sys.argv[2], metadata={"format": "pt"})
PY
  "$bin" --pp 1 --dp 1 --fsdp 1 --cp 1 --tp 2 --steps 1 --lr 1e-30 --init-from "$dir/python.safetensors" "${model[@]}" >"$dir/c.log"
  c=$(text "$dir/c.log")
  if [[ $a != "$c" ]]; then
    echo "FAIL: from the file Python wrote: '$c' vs '$a'"
    exit 1
  fi
  echo "python cross-check: read by Python's safetensors, written back by it, loaded on tp 2"
else
  echo "python cross-check skipped: $python has no safetensors module"
fi
echo "PASS: '$a'"
