#!/usr/bin/env bash
# Kill test for checkpoints (issue 11): runs train_digits with a checkpoint after every optimizer
# step and SIGKILLs it at random moments (many of them inside a save, which is most of what such a
# run does); after every kill `train_digits --verify-checkpoints` must find every checkpoint in
# the directory whole (it loads and verifies each one), and the next run must resume from one.
#
#   scripts/kill_test.sh [--kills 200] [--bin build/examples/train_digits] [--data-dir data]
#
# Prints the count of kills (and of those that landed inside a save, leaving a temporary file), of
# verifications passed, of runs that resumed and of invalid checkpoints seen (must be 0); exits
# non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
kills=200
bin=build/examples/train_digits
data=data
while [ $# -gt 0 ]; do
  case "$1" in
    --kills) kills=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data-dir) data=$2; shift 2 ;;
    *) echo "usage: $0 [--kills N] [--bin PATH] [--data-dir DIR]" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "kill_test: $bin is missing; build first (scripts/build.sh)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dir=$work/ckpt
verified=0 resumed=0 invalid=0 saved_once=0 mid_save=0
RANDOM=42
for ((i = 1; i <= kills; i++)); do
  # --threads 1 and a small batch: many short steps, so kills land at every phase of a step.
  "$bin" --data-dir "$data" --checkpoint-dir "$dir" --checkpoint-every 1 --keep 2 --resume --epochs 1000 \
    --batch 32 >"$work/run.log" 2>&1 &
  pid=$!
  # 50-650 ms: startup (reading the data, resuming) takes ~100-200 ms, so some kills land there.
  sleep "0.$(printf '%03d' $((50 + RANDOM % 600)))"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  grep -q "^resumed from" "$work/run.log" && resumed=$((resumed + 1))
  # A temporary file left behind: the kill landed inside a save (the next run removes it).
  ls -a "$dir" 2>/dev/null | grep -q '\.tmp\.' && mid_save=$((mid_save + 1))
  if out=$("$bin" --checkpoint-dir "$dir" --verify-checkpoints 2>&1); then
    verified=$((verified + 1))
    saved_once=1
  else
    bad=$(printf '%s\n' "$out" | grep -c '^INVALID' || true)
    invalid=$((invalid + bad))
    if [ "$bad" -gt 0 ] || [ "$saved_once" -eq 1 ]; then
      echo "kill $i: verification failed:" >&2
      printf '%s\n' "$out" >&2
    fi
  fi
  if grep -q "no checkpoint loads" "$work/run.log"; then
    echo "kill $i: the run found no loadable checkpoint:" >&2
    cat "$work/run.log" >&2
    invalid=$((invalid + 1))
  fi
done
steps=$(ls "$dir" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1)
echo "kill test: $kills kills ($mid_save inside a save); $verified verifications passed (all checkpoints loaded and verified); $resumed runs resumed from a checkpoint; $invalid invalid checkpoints; newest checkpoint at optimizer step ${steps:-none}"
[ "$invalid" -eq 0 ] && [ "$saved_once" -eq 1 ] && [ "$verified" -ge $((kills - 3)) ]
