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
# build/ is the timed build (-O3); scripts/test.sh tests in build-tests/. OFF said every time, so a
# build/ configured otherwise by hand is -O3 again.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_QUICK_BUILD=OFF >/dev/null
echo "build.sh: configured build/ ($(since "$t0"))" >&2
t0=$EPOCHREALTIME
if [ $# -gt 0 ]; then
  for t in "$@"; do cmake --build build -j"$(nproc)" --target "$t"; done
  echo "build.sh: compiled $* ($(since "$t0"), $(nproc) at a time)" >&2
else
  cmake --build build -j"$(nproc)"
  echo "build.sh: compiled everything ($(since "$t0"), $(nproc) at a time)" >&2
fi
