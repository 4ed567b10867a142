#!/usr/bin/env bash
# examples/test_generate.sh TRAIN_GPT WORKDIR GENERATE — the generate program (train_gpt started as generate: examples/train_gpt.cpp)
# and --generate on the training mesh, end to end: a small MoE run
# on pp 2 x fsdp 2 x cp 2 x tp 2 (the main job's mesh, experts over ep 2) saves a checkpoint and
# generates; `generate --resume` on the same mesh prints the same text (the same weights, the
# same arithmetic); the trainer resumed at its last step generates it too without training;
# another mesh (one rank) generates from the checkpoint; bad use is a usage error. Prints PASS.
set -euo pipefail
bin=$1
dir=$2
gen=$3
rm -rf "$dir" && mkdir -p "$dir"
mesh=(--pp 2 --fsdp 2 --cp 2 --tp 2 --ep 2)
sample=(--generate 40 --prompt "The " --temperature 0.8 --top-k 20)
"$bin" "${mesh[@]}" --experts 4 --layers 2 --dim 32 --steps 4 --eval-every 4 --save-every 4 --save-dir "$dir/ckpt" \
  "${sample[@]}" >"$dir/train.log"
text() { sed -n '/^generated (/,$p' "$1" | tail -n +2; }  # the text may hold newlines
a=$(text "$dir/train.log")
grep -q "^generated (temperature 0.8, top-k 20, top-p 1, 40 characters, .*2 pipeline stages on 16 ranks" "$dir/train.log"
# The model's shape (2 layers, dim 32, 4 experts) comes from the checkpoint, not from flags.
"$gen" --resume "$dir/ckpt" "${mesh[@]}" "${sample[@]}" >"$dir/gen.log"
b=$(text "$dir/gen.log")
grep -q "resumed from $dir/ckpt at step 4" "$dir/gen.log"
if ! grep -q "^summary" "$dir/train.log" || grep -q "^summary" "$dir/gen.log"; then
  echo "FAIL: the training run has no summary, or generate trained"
  exit 1
fi
if [[ -z $a || $a != "$b" ]]; then
  echo "FAIL: generate --resume on the training mesh: '$b', the trainer's own: '$a'"
  exit 1
fi
# The trainer resumed at its last step with --generate: text only, the same.
"$bin" "${mesh[@]}" --experts 4 --layers 2 --dim 32 --steps 4 --resume "$dir/ckpt" "${sample[@]}" >"$dir/resume.log"
if [[ $(text "$dir/resume.log") != "$a" ]] || grep -q "^summary" "$dir/resume.log"; then
  echo "FAIL: train_gpt --resume at --steps --generate: '$(text "$dir/resume.log")' vs '$a'"
  exit 1
fi
# Another mesh: one rank (the checkpoint reshards), greedy by default, 200 characters.
"$gen" --resume "$dir/ckpt" --pp 1 --fsdp 1 --cp 1 --tp 1 --ep 1 >"$dir/one.log"
grep -q "^generated (greedy, 200 characters, .*1 pipeline stages on 1 ranks" "$dir/one.log"
[[ $(text "$dir/one.log" | wc -c) -gt 200 ]]
# Bad use: a usage error (exit 2) naming the problem, or the load's configuration check.
expect() {  # expect STATUS MESSAGE ARGS...
  local want=$1 message=$2 status=0
  shift 2
  "$gen" "$@" >"$dir/bad.log" 2>&1 || status=$?
  if [[ $status != "$want" ]] || ! grep -qF -- "$message" "$dir/bad.log"; then
    echo "FAIL: generate $* exited $status (want $want) without '$message':"
    cat "$dir/bad.log"
    exit 1
  fi
}
expect 2 "generate needs --resume DIR" --pp 1 --fsdp 1 --cp 1 --tp 1
expect 2 "--steps is a training flag" --resume "$dir/ckpt" --steps 5
expect 2 "--dtype: generate computes in float" --resume "$dir/ckpt" --dtype bf16
expect 2 "--device: this generate program runs on the CPU; a CUDA build's generate_cuda" --resume "$dir/ckpt" --device cuda
expect 2 "no checkpoint at $dir/missing" --resume "$dir/missing"
expect 1 "layers: 2 in the checkpoint, 3 here" --resume "$dir/ckpt" --pp 1 --fsdp 1 --cp 1 --tp 1 --ep 1 --layers 3
# Found by the outside catalogue (issue 44): a seed that is not a whole number aborted uncaught,
# -1 became 2^64 - 1; a multi-byte character was named by its first byte; runtime errors said train_gpt:.
expect 2 "--seed expects a whole number, got 'abc'" --resume "$dir/ckpt" --seed abc
expect 2 "--seed -1 is out of range" --resume "$dir/ckpt" --seed -1
expect 1 "--prompt: the character '😀' (4 bytes in UTF-8" --resume "$dir/ckpt" --pp 1 --fsdp 1 --cp 1 --tp 1 --ep 1 --prompt "a😀"
grep -q "^generate: " "$dir/bad.log" || { echo "FAIL: generate's runtime error does not start with generate:"; cat "$dir/bad.log"; exit 1; }
# Another text whose alphabet has the checkpoint's size but other characters (every byte + 1):
# refused by the checkpoint's vocabulary (its characters' hash), not generated in the other alphabet.
cat /usr/share/common-licenses/* | perl -pe 's/(.)/chr((ord($1) + 1) % 256)/ges' >"$dir/other.txt"
expect 1 "another model configuration: vocabulary: " --resume "$dir/ckpt" --pp 1 --fsdp 1 --cp 1 --tp 1 --ep 1 --data "$dir/other.txt"
"$gen" --help | grep -q "^usage: generate --resume DIR"
echo "PASS: '$a'"
