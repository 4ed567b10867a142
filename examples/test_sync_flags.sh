#!/usr/bin/env bash
# examples/test_sync_flags.sh — train_gpt's DiLoCo option flags against the library (a CTest
# case, examples/CMakeLists.txt; docs/beyond-sync.md).
#
#   test_sync_flags.sh TRAINER WORKDIR
#
# 1. --sync diloco --outer-lr 1 --outer-momentum 0 is parallel::sync::DiLoCoOptions::local_sgd(H)
#    (--sync local-sgd): the final losses equal bit for bit — the flags reach the outer SGD.
# 2. Streaming DiLoCo: --fragments 2 (tau = 0) and --fragments 2 --overlap 1 --overlap-alpha 0.5
#    report the same payload bytes per step (the library's count, checked by the trainer against
#    traffic.hpp's formula), and the overlapped run differs (its outer updates land a step late).
# 3. --bf16-reduce: exactly half the payload bytes of the f32 run.
set -euo pipefail
trainer=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
model=(--pp 1 --dp 2 --fsdp 1 --cp 1 --tp 1 --layers 2 --heads 4 --dim 32 --seq 16 --batch 8 --steps 8 --eval-every 1000)
run() { "$trainer" "${model[@]}" "$@"; }
final() { grep -o 'final losses at step [0-9]*: train [^ ]* validation [^ ]*' "$1"; }
payload() { grep -o 'sync [a-z-]* on dp: [0-9]* all-reduce payload bytes per step' "$1" | grep -o '[0-9]* all-reduce' | cut -d' ' -f1; }

run --sync local-sgd --inner-steps 4 >"$work/local_sgd.log"
run --sync diloco --inner-steps 4 --outer-lr 1 --outer-momentum 0 >"$work/diloco_as_local_sgd.log"
a=$(final "$work/local_sgd.log") b=$(final "$work/diloco_as_local_sgd.log")
echo "local-sgd:                          $a"
echo "diloco --outer-lr 1 --outer-mom. 0: $b"
[[ -n $a && $a == "$b" ]] || { echo "FAIL: DiLoCo with outer SGD of rate 1, no momentum differs from local SGD"; exit 1; }
run --sync diloco --inner-steps 4 >"$work/diloco_default.log"
[[ $(final "$work/diloco_default.log") != "$a" ]] || { echo "FAIL: the outer flags change nothing"; exit 1; }

run --sync diloco --inner-steps 4 --fragments 2 >"$work/streaming.log"
run --sync diloco --inner-steps 4 --fragments 2 --overlap 1 --overlap-alpha 0.5 >"$work/overlapped.log"
run --sync diloco --inner-steps 4 --fragments 2 --bf16-reduce >"$work/bf16.log"
p_stream=$(payload "$work/streaming.log") p_overlap=$(payload "$work/overlapped.log") p_bf16=$(payload "$work/bf16.log")
echo "payload bytes per step: streaming $p_stream, overlapped $p_overlap, bf16 $p_bf16"
[[ -n $p_stream && $p_stream == "$p_overlap" ]] || { echo "FAIL: the overlap changed the bytes"; exit 1; }
# Printed rounded to a byte: half of an odd count is within one.
(( 2 * p_bf16 - p_stream <= 1 && p_stream - 2 * p_bf16 <= 1 )) || { echo "FAIL: --bf16-reduce does not halve the bytes"; exit 1; }
s=$(final "$work/streaming.log") o=$(final "$work/overlapped.log")
echo "streaming:  $s"
echo "overlapped: $o"
[[ -n $o && $s != "$o" ]] || { echo "FAIL: --overlap 1 --overlap-alpha 0.5 trained the same as the blocking run"; exit 1; }
[[ $o != *nan* && $o != *inf* ]] || { echo "FAIL: the overlapped run diverged"; exit 1; }
echo "PASS"
