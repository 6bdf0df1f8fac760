#!/usr/bin/env bash
# Builds and runs the main job: train the demo MLP on the shipped digits20 data.
# Arguments go to the program (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh train_digits >/dev/null
exec build/examples/train_digits --data-dir data "$@"
