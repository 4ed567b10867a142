#!/usr/bin/env bash
# examples/test_resume.sh — train_gpt's checkpoints end to end (a CTest case, examples/CMakeLists.txt).
#
#   [DTENSOR_LAUNCH="mpiexec -n 4"] test_resume.sh TRAINER WORKDIR TOLERANCE SAVE_AT TOTAL "SAVE_MESH_FLAGS" "RESUME_MESH_FLAGS" [--bad-input] -- MODEL_FLAGS...
#
# 1. straight: TOTAL steps on the saving mesh;
# 2. SAVE_AT steps on the saving mesh with --save-every SAVE_AT;
# 3. resumed from that checkpoint on the resuming mesh up to TOTAL.
# The final train and validation losses (printed with all their digits) of 3 must equal 1's:
# TOLERANCE 0 means bit for bit, else within that relative difference.
# --bad-input also checks that resuming with another model configuration or another text's
# alphabet (of the same size), or from a checkpoint
# missing a data file, is an error naming the cause, and that the checkpoint is still whole
# (it resumes again).
set -euo pipefail
trainer=$1 work=$2 tolerance=$3 save_at=$4 total=$5 save_mesh=$6 resume_mesh=$7
shift 7
bad_input=0
if [[ ${1:-} == --bad-input ]]; then bad_input=1; shift; fi
[[ ${1:-} == -- ]] && shift
model=("$@")
rm -rf "$work" && mkdir -p "$work"
# shellcheck disable=SC2086  # the mesh flags are words
# DTENSOR_LAUNCH: a launcher's words before the trainer ("mpiexec -n 4" for the MPI cases).
read -r -a launch <<<"${DTENSOR_LAUNCH:-}"
run() { "${launch[@]}" "$trainer" "${model[@]}" --eval-every 1000 "$@"; }
final() { grep -o 'final losses at step [0-9]*: train [^ ]* validation [^ ]*' "$1"; }

run $save_mesh --steps "$total" >"$work/straight.log"
run $save_mesh --steps "$save_at" --save-every "$save_at" --save-dir "$work/ckpt" >"$work/save.log"
grep -q "step *$save_at  checkpoint saved to $work/ckpt" "$work/save.log"
run $resume_mesh --steps "$total" --resume "$work/ckpt" >"$work/resume.log"
grep -q "resumed from $work/ckpt at step $save_at" "$work/resume.log"
want=$(final "$work/straight.log") got=$(final "$work/resume.log")
echo "straight: $want"
echo "resumed:  $got"
if [[ $tolerance == 0 ]]; then
  [[ $want == "$got" ]] || { echo "FAIL: the resumed run differs from the straight one"; exit 1; }
else
  awk -v a="$want" -v b="$got" -v tol="$tolerance" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; ++i) if (x[i] ~ /^[0-9.eE+-]+$/ && i > 4) {
      d = x[i] - y[i]; if (d < 0) d = -d; s = x[i] < 0 ? -x[i] : x[i];
      if (d > tol * s) { print "FAIL: " x[i] " vs " y[i] " beyond relative " tol; exit 1 }
    } }'
fi
if [[ $bad_input == 1 ]]; then
  # Another model configuration: refused by name, nothing trained.
  if run $resume_mesh --steps "$total" --resume "$work/ckpt" --seed 7 >"$work/bad_config.log" 2>&1; then
    echo "FAIL: resumed with another seed"; exit 1
  fi
  grep -q "another model configuration: seed: 1 in the checkpoint, 7 here" "$work/bad_config.log" ||
    { cat "$work/bad_config.log"; exit 1; }
  # Another text with an alphabet of the same size but other characters (every byte + 1):
  # refused, since the checkpoint records the vocabulary's characters, not only their number.
  cat /usr/share/common-licenses/* | perl -pe 's/(.)/chr((ord($1) + 1) % 256)/ges' >"$work/other.txt"
  if run $resume_mesh --steps "$total" --resume "$work/ckpt" --data "$work/other.txt" >"$work/bad_vocab.log" 2>&1; then
    echo "FAIL: resumed with another text's alphabet"; exit 1
  fi
  grep -q "another model configuration: vocabulary: [0-9]* characters, hash [0-9]* in the checkpoint" "$work/bad_vocab.log" ||
    { cat "$work/bad_vocab.log"; exit 1; }
  # A missing piece (a rank's data file gone): refused, naming the file.
  cp -r "$work/ckpt" "$work/broken"
  rm "$work/broken/rank-00001.bin"
  if run $resume_mesh --steps "$total" --resume "$work/broken" >"$work/bad_piece.log" 2>&1; then
    echo "FAIL: resumed from a checkpoint missing a file"; exit 1
  fi
  grep -q "broken/rank-00001.bin of piece .* is missing" "$work/bad_piece.log" || { cat "$work/bad_piece.log"; exit 1; }
  # No checkpoint lost: the original still resumes to the same losses.
  run $resume_mesh --steps "$total" --resume "$work/ckpt" >"$work/again.log"
  [[ $(final "$work/again.log") == "$got" ]] || { echo "FAIL: the checkpoint changed"; exit 1; }
fi
echo "PASS"
