#!/usr/bin/env bash
# examples/test_moe_dtype.sh TRAIN_GPT DTYPE: the MoE trained in DTYPE (bf16 or fp8) is the model
# the fp32 run builds — the same parameter count, the MoE header — and its loss falls. (Until
# 2026-11-30 `--dtype bf16 --experts` printed the MoE header and trained the dense model.)
set -euo pipefail
bin=$1 dtype=$2
flags=(--pp 2 --fsdp 2 --cp 1 --tp 2 --experts 4 --ep 2 --steps 20 --eval-every 20 --layers 2 --heads 4 --dim 32
       --seq 16 --batch 8)
f32=$("$bin" "${flags[@]}")
low=$("$bin" --dtype "$dtype" "${flags[@]}")
count() { grep -m1 -oE "^parameters: [0-9]+" <<< "$1" || echo "no parameter count"; }
echo "f32 MoE: $(count "$f32"); $dtype MoE: $(count "$low")"
if [[ $(count "$f32") != "$(count "$low")" ]]; then echo "FAILED: the $dtype model is not the fp32 MoE"; exit 1; fi
if ! grep -q "MoE: 4 experts, top-2, over ep 2" <<< "$low"; then echo "FAILED: no MoE header in $dtype"; exit 1; fi
if ! grep -q "train loss fell" <<< "$low"; then echo "FAILED: the $dtype MoE's loss did not fall"; exit 1; fi
echo "$dtype MoE OK"
