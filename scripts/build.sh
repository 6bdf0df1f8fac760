#!/usr/bin/env bash
# Configures and builds kiln (Release) into build/; extra arguments are build targets.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/deps.sh | grep '^export ' || true)"
bash scripts/deps.sh >/dev/null
# KILN_QUICK_BUILD=ON (CI sets it): the examples and benchmarks at -O1 — CI compiles them and runs
# the tests, it times nothing. Said every time, so a later plain build is -O3 again.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_QUICK_BUILD="${KILN_QUICK_BUILD:-OFF}" >/dev/null
if [ $# -gt 0 ]; then
  for t in "$@"; do cmake --build build -j"$(nproc)" --target "$t"; done
else
  cmake --build build -j"$(nproc)"
fi
