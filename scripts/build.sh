#!/usr/bin/env bash
# Configures and builds kiln (Release) into build/; extra arguments are build targets. Each stage
# says what it did and how long it took (on stderr), so a first build is never a silent terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$EPOCHREALTIME
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }
eval "$(bash scripts/deps.sh | grep '^export ' || true)"
bash scripts/deps.sh | grep -v '^export ' >&2 || true
echo "build.sh: packages present ($(since "$t0"))" >&2
t0=$EPOCHREALTIME
# The CUDA targets: KILN_CUDA=auto (the default) builds them where nvcc exists and a GPU is
# visible — a machine without one cannot run them, and they are 40% of a first build of
# train_digits (on 2 cores: trained 46 s after train.sh starts without them, 80 s with them);
# KILN_CUDA=ON builds them anyway (to see that they compile, as scripts/test.sh does), OFF never.
cuda=${KILN_CUDA:-auto}
case "$cuda" in
  auto)
    if ! command -v nvcc >/dev/null; then
      cuda=OFF why="no nvcc"
    elif nvidia-smi -L 2>/dev/null | grep -q '^GPU' || ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
      cuda=ON why="nvcc and a GPU"
    else
      cuda=OFF why="nvcc, but no GPU is visible; KILN_CUDA=ON scripts/build.sh builds them anyway"
    fi ;;
  ON | on | 1) cuda=ON why="KILN_CUDA=ON" ;;
  OFF | off | 0) cuda=OFF why="KILN_CUDA=OFF" ;;
  *) echo "build.sh: KILN_CUDA must be auto, ON or OFF, not \"$cuda\"" >&2; exit 2 ;;
esac
# build/ is the timed build (-O3); scripts/test.sh tests in build-tests/. Both said every time, so
# a build/ configured otherwise by hand is -O3 again.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_QUICK_BUILD=OFF -DKILN_WITH_CUDA="$cuda" >/dev/null
echo "build.sh: configured build/ ($(since "$t0"); CUDA targets $cuda: $why)" >&2
t0=$EPOCHREALTIME
if [ $# -gt 0 ]; then
  for t in "$@"; do cmake --build build -j"$(nproc)" --target "$t"; done
  echo "build.sh: compiled $* ($(since "$t0"), $(nproc) at a time)" >&2
else
  cmake --build build -j"$(nproc)"
  echo "build.sh: compiled everything ($(since "$t0"), $(nproc) at a time)" >&2
fi
