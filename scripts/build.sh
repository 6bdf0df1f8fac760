#!/usr/bin/env bash
# Configures and builds kiln (Release) into build/; extra arguments are build targets.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/deps.sh | grep '^export ' || true)"
bash scripts/deps.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
if [ $# -gt 0 ]; then
  for t in "$@"; do cmake --build build -j"$(nproc)" --target "$t"; done
else
  cmake --build build -j"$(nproc)"
fi
