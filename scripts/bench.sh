#!/usr/bin/env bash
# Builds the benchmarks and runs them; JSON lines go to stdout (and to $1 when given).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh bench_fusion bench_gemm bench_train_step bench_dropout bench_policies >/dev/null
out=${1:-/dev/null}
{
  build/bench/fusion
  build/bench/gemm 2>/dev/null
  build/bench/train_step
  build/bench/dropout
  build/bench/policies
} | tee "$out"
