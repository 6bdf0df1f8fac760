#!/usr/bin/env bash
# Builds and runs the main job: train the demo MLP on the shipped digits20 data. Arguments go to
# the program (see --help). Each stage — packages, configuring, compiling train_digits (its files
# as they start), training — is announced with its time on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$EPOCHREALTIME
echo "train.sh: building train_digits (packages, cmake, compile)" >&2
set +e
bash scripts/build.sh train_digits | { grep --line-buffered -E '^\[ *[0-9]+%\] (Building|Linking)' || true; } >&2
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || { echo "train.sh: the build failed (exit $status)" >&2; exit "$status"; }
echo "train.sh: training, $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }') after start:" \
  "build/examples/train_digits --data-dir data $*" >&2
exec build/examples/train_digits --data-dir data "$@"
