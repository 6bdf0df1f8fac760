#!/usr/bin/env bash
# Builds everything and runs every test (CPU suites, compile-fail tests, header checks, the
# installed-package consumer, and the CUDA suites, which skip without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
