#!/usr/bin/env bash
# scripts/run-main.sh — the main job: set up, build and run the GPT trainer on the threads backend.
#
#   scripts/run-main.sh                       # 16 threads: PP x FSDP x CP x TP + SP x EP (MoE blocks), all at once
#   scripts/run-main.sh --pp 1 --cp 1 --dp 2 --tp 4 --steps 100   # extra arguments go to train_gpt (--help)
#
# Installs the missing Debian packages, builds build-main/ (Release, OpenBLAS GEMMs) and runs
# examples/train_gpt.cpp on the files under /usr/share/common-licenses.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DTENSOR_MAIN_BUILD:-build-main}
# --help (or -h) anywhere: the usage, before installing or building anything. From the built
# trainer when there is one (generated from its flag table, examples/train_gpt.hpp), else a note.
for a in "$@"; do
  if [[ $a == --help || $a == -h ]]; then
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'
    echo
    if [[ -x $build/examples/train_gpt ]]; then exec "$build/examples/train_gpt" --help; fi
    # The flags' help is generated from train_gpt's flag table (examples/train_gpt.hpp): build it first.
    echo "train_gpt is not built yet: scripts/run-main.sh builds it, then $build/examples/train_gpt --help lists every flag"
    exit 0
  fi
done
# DTENSOR_MAIN_TRAINER=PROGRAM: run that trainer (one built elsewhere; the docs test's) with the
# arguments below, no set-up and no build.
trainer=${DTENSOR_MAIN_TRAINER:-}
if [[ -z $trainer ]]; then
  scripts/setup-deps.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTENSOR_WITH_BLAS=ON -DDTENSOR_BUILD_TESTS=OFF \
        -DDTENSOR_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" -j"$(nproc)" --target train_gpt
  trainer=$build/examples/train_gpt
fi
# Without flags: all the parallelisms at once on 16 threads: pipeline (2 stages, 1F1B over 4
# micro-batches) x FSDP (2 shards, ZeRO-3) x context (2, ring attention) x tensor (2) with
# sequence parallelism, and MoE blocks (4 experts, top-2, dropless) split over 2 expert ranks (of
# the fsdp x cp ranks); any flags replace that (train_gpt --help lists them; e.g. no flags but
# --steps 100: the dense model on pp 2 x fsdp 2 x cp 2 x tp 2 + SP).
if [[ $# -eq 0 ]]; then
  # A checkpoint every 100 steps into $build/train_gpt_ckpt (replaced atomically); continue the run
  # on any mesh, e.g. one rank: scripts/run-main.sh --pp 1 --fsdp 1 --cp 1 --tp 1 --experts 4
  # --resume build-main/train_gpt_ckpt --steps 400 (docs/training.md).
  set -- --pp 2 --fsdp 2 --cp 2 --tp 2 --experts 4 --ep 2 --steps 300 --eval-every 50 \
         --trace "$build/train_gpt_trace.json" --plot "$build/train_gpt_loss.svg" \
         --save-every 100 --save-dir "$build/train_gpt_ckpt"  # where they went: printed at the end
fi
exec "$trainer" "$@"
