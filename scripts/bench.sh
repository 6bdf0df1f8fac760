#!/usr/bin/env bash
# Builds the benchmarks and runs them; JSON lines go to stdout (and to $1 when given).
#
# The CUDA benchmarks (train_step_cuda with its PyTorch CUDA peer, policies_cuda, fusion_cuda,
# kernels_cuda) are built and run too when a GPU answers (nvidia-smi -L) and the build has CUDA
# targets; KILN_BENCH_CUDA=1 asks for them anyway (without a device they print skip lines, or fail
# with KILN_REQUIRE_DEVICE=1), KILN_BENCH_CUDA=0 leaves them out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh bench_fusion bench_gemm bench_train_step bench_dropout bench_policies >/dev/null
cuda_benches=()
want_cuda=${KILN_BENCH_CUDA:-auto}
if [ "$want_cuda" = 1 ] || { [ "$want_cuda" = auto ] && nvidia-smi -L > /dev/null 2>&1; }; then
  if cmake --build build --target help 2> /dev/null | grep -q 'bench_kernels_cuda'; then
    cuda_benches=(train_step_cuda policies_cuda fusion_cuda kernels_cuda)
    bash scripts/build.sh "${cuda_benches[@]/#/bench_}" >/dev/null
  else
    echo "bench.sh: no CUDA benchmark targets in build/ (no nvcc, or KILN_WITH_CUDA=OFF): CUDA benchmarks left out" >&2
  fi
fi
out=${1:-/dev/null}
{
  build/bench/fusion
  build/bench/gemm 2>/dev/null
  build/bench/train_step
  build/bench/dropout
  build/bench/policies
  for b in "${cuda_benches[@]}"; do
    "build/bench/$b"
  done
} | tee "$out"
