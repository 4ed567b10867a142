#!/usr/bin/env bash
# examples/test_generate_cuda.sh TRAIN_GPT_CUDA TRAIN_GPT WORKDIR — --generate with --device cuda:
# the model and its KV caches in GPU memory (issue 42). A run on pp 2 x cp 2 x tp 2 (8 rank threads
# sharing the GPU: the pipeline's messages, the context-split KV cache, the heads over tp) trains a
# small GPT, saves it and generates greedily; the same checkpoint resumed on the GPU generates the
# same text, so does the generate program on the GPU (generate_cuda), and resumed on the host
# (train_gpt) the same tokens. Prints PASS; without a usable GPU
# prints the CUDA error and "SKIP" (CTest passes on either, as the other cuda examples do).
set -euo pipefail
gpu=$1
host=$2
dir=$3
rm -rf "$dir" && mkdir -p "$dir"
mesh=(--pp 2 --fsdp 1 --cp 2 --tp 2)
model=(--layers 2 --dim 64 --heads 4 --seq 32)
sample=(--generate 40 --prompt "The ")
if ! "$gpu" --device cuda "${mesh[@]}" "${model[@]}" --steps 100 --eval-every 100 --save-every 100 --save-dir "$dir/ckpt" \
  "${sample[@]}" >"$dir/gpu.log" 2>&1; then
  if grep -q "needs a usable GPU" "$dir/gpu.log"; then
    grep "needs a usable GPU" "$dir/gpu.log"
    echo "SKIP: no usable GPU"
    exit 0
  fi
  cat "$dir/gpu.log"
  echo "FAIL: train_gpt_cuda --generate"
  exit 1
fi
text() { sed -n '/^generated (/,$p' "$1" | tail -n +2; }  # the text may hold newlines
a=$(text "$dir/gpu.log")
grep -q "^generated (greedy, 40 characters, KV cache; 2 pipeline stages on 8 ranks" "$dir/gpu.log" || {
  cat "$dir/gpu.log"
  echo "FAIL: no generation line"
  exit 1
}
# The GPU again from the checkpoint, without training: the same text.
"$gpu" --device cuda "${mesh[@]}" "${model[@]}" --steps 100 --resume "$dir/ckpt" "${sample[@]}" >"$dir/gpu-resume.log" 2>&1
b=$(text "$dir/gpu-resume.log")
# The generate program on the GPU (generate_cuda, the link beside train_gpt_cuda; --device cuda
# is its default): the model's shape from the checkpoint, the same text.
"$(dirname "$gpu")/generate_cuda" --resume "$dir/ckpt" "${mesh[@]}" "${sample[@]}" >"$dir/generate.log" 2>&1 || {
  cat "$dir/generate.log"
  echo "FAIL: generate_cuda --resume"
  exit 1
}
d=$(text "$dir/generate.log")
# The host from the same checkpoint: the same tokens (greedy: the first largest logit; a
# trained model's top two logits differ by far more than the GPU's rounding does from the host's).
"$host" "${mesh[@]}" "${model[@]}" --steps 100 --resume "$dir/ckpt" "${sample[@]}" >"$dir/host.log" 2>&1
c=$(text "$dir/host.log")
if [[ -z $a || $a != "$b" ]]; then
  echo "FAIL: the GPU resumed generated '$b', the GPU's training run '$a'"
  exit 1
fi
if [[ $a != "$d" ]]; then
  echo "FAIL: generate_cuda generated '$d', train_gpt_cuda '$a'"
  exit 1
fi
if [[ $a != "$c" ]]; then
  echo "FAIL: the host generated '$c', the GPU '$a'"
  exit 1
fi
echo "generated on the GPU and on the host: '$a'"
echo PASS
