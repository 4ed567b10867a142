#!/usr/bin/env bash
# examples/test_mla.sh TRAIN_GPT: a Llama with DeepSeek's multi-head latent attention (--kv-lora-rank,
# nn/latent_attention.hpp) trains alike on one rank and split: the final train and validation
# losses after 4 AdamW steps (f32) under tp 2 x fsdp 2 (ZeRO-3, + SP), pp 2 x tp 2 and cp 2 (ring,
# load balanced) equal the one-rank run's within 1e-6 relative (the sums' order differs); the
# header names MLA and its shape, the parameter count is the same; the MLA flags' misuse is a
# usage error naming the flag (exit 2).
set -euo pipefail
bin=$1
model=(--arch llama --kv-lora-rank 32 --q-lora-rank 48 --qk-rope-dim 8 --qk-nope-dim 16 --v-head-dim 16
       --layers 2 --heads 4 --dim 32 --seq 16 --batch 8 --steps 4 --eval-every 4)
losses() { grep -oE 'final losses at step [0-9]+: train [^ ]+ validation [^ ]+' <<< "$1" | awk '{print $7, $9}'; }
count() { grep -m1 -oE "^parameters: [0-9]+" <<< "$1" || echo "no parameter count"; }
one=$("$bin" "${model[@]}" --pp 1 --dp 1 --fsdp 1 --cp 1 --tp 1)
grep -q "llama, MLA (q latent 48, kv latent 32, head: 16 + 8 rotary, v 16)" <<< "$one" ||
  { echo "FAIL: no MLA header"; exit 1; }
want=$(losses "$one")
[[ -n $want ]] || { echo "FAIL: no losses on one rank"; exit 1; }
echo "one rank: $(count "$one"), losses $want"
for mesh in "--pp 1 --dp 1 --fsdp 2 --cp 1 --tp 2" "--pp 2 --dp 1 --fsdp 1 --cp 1 --tp 2" "--pp 1 --dp 1 --fsdp 1 --cp 2 --tp 1"; do
  # shellcheck disable=SC2086
  out=$("$bin" "${model[@]}" $mesh)
  got=$(losses "$out")
  echo "$mesh: $(count "$out"), losses $got"
  [[ $(count "$out") == "$(count "$one")" ]] || { echo "FAIL: $mesh builds another model"; exit 1; }
  awk -v a="$want" -v b="$got" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    if (y[1] == "" || y[2] == "") exit 1;
    for (i = 1; i <= 2; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-6 * x[i]) exit 1 }
  }' || { echo "FAIL: $mesh's losses differ from one rank's by more than 1e-6 relative"; exit 1; }
done
refused() {  # flags, the message expected
  local rc=0 err
  err=$("$bin" "${@:2}" 2>&1 >/dev/null) || rc=$?
  [[ $rc == 2 && $err == *"$1"* ]] || { echo "FAIL: ${*:2}: exit $rc, wanted 2 naming \"$1\": $err"; exit 1; }
}
refused "needs --arch llama" --kv-lora-rank 32 --qk-rope-dim 8 --qk-nope-dim 16 --v-head-dim 16
refused "need --kv-lora-rank" --arch llama --q-lora-rank 48
refused "needs --qk-nope-dim" --arch llama --kv-lora-rank 32 --qk-rope-dim 8
refused "must be even" --arch llama --kv-lora-rank 32 --qk-rope-dim 7 --qk-nope-dim 16 --v-head-dim 16
refused "--generate with --kv-lora-rank" --arch llama --kv-lora-rank 32 --qk-rope-dim 8 --qk-nope-dim 16 --v-head-dim 16 --generate 5
refused "--kv-heads with --kv-lora-rank" --arch llama --kv-heads 2 --kv-lora-rank 32 --qk-rope-dim 8 --qk-nope-dim 16 --v-head-dim 16
echo "PASS: MLA trains alike on one rank, tp 2 x fsdp 2, pp 2 x tp 2 and cp 2; its flags are checked"
