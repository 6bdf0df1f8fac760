#!/usr/bin/env bash
# Builds the benchmarks and runs them; JSON lines go to stdout (and to $1 when given).
#
# The CUDA benchmarks (train_step_cuda with its PyTorch CUDA peer, policies_cuda, fusion_cuda,
# kernels_cuda) are built and run too when a GPU answers (nvidia-smi -L) and the build has CUDA
# targets; KILN_BENCH_CUDA=1 asks for them anyway (without a device they print skip lines, or fail
# with KILN_REQUIRE_DEVICE=1), KILN_BENCH_CUDA=0 leaves them out.
#
# --with-peers: first makes .venv-bench (python3 -m venv) when it is missing and installs the
# peers into it from PyPI — torch (its Linux wheel pulls about 3 GB of CUDA libraries; pass
# pip a CPU-only index through PIP_INDEX_URL / PIP_EXTRA_INDEX_URL where one is reachable),
# jax[cpu], threadpoolctl and numpy — unless they all import already. train_step and fusion use .venv-bench/bin/python for their peers whenever it exists
# (else /usr/bin/python3, whose torch 1.13 has no torch.compile and which has no jax: those peers
# print skip lines). Without the flag nothing is installed. pip's output goes to stderr.
#
#   bash scripts/bench.sh [--with-peers] [OUT_FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
with_peers=0
if [ "${1:-}" = --with-peers ]; then
  with_peers=1
  shift
fi
if [ "$with_peers" = 1 ]; then
  venv=.venv-bench
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2
  py=$venv/bin/python
  if ! "$py" -c 'import torch, jax, threadpoolctl, numpy' 2>/dev/null; then
    "$py" -c 'import torch' 2>/dev/null ||
      "$py" -m pip install torch >&2
    "$py" -m pip install "jax[cpu]" threadpoolctl numpy >&2
  fi
fi
want_cuda=${KILN_BENCH_CUDA:-auto}
# build.sh leaves the CUDA targets out where no GPU is visible, unless they are asked for.
[ "$want_cuda" = 1 ] && export KILN_CUDA=ON
bash scripts/build.sh bench_fusion bench_gemm bench_train_step bench_dropout bench_policies bench_convnet >/dev/null
cuda_benches=()
if [ "$want_cuda" = 1 ] || { [ "$want_cuda" = auto ] && nvidia-smi -L > /dev/null 2>&1; }; then
  if cmake --build build --target help 2> /dev/null | grep -q 'bench_kernels_cuda'; then
    cuda_benches=(train_step_cuda policies_cuda fusion_cuda kernels_cuda)
    bash scripts/build.sh "${cuda_benches[@]/#/bench_}" >/dev/null
  else
    echo "bench.sh: no CUDA benchmark targets in build/ (no nvcc, or built without them: KILN_CUDA=OFF): CUDA benchmarks left out" >&2
  fi
fi
out=${1:-/dev/null}
{
  build/bench/fusion
  build/bench/gemm 2>/dev/null
  build/bench/train_step
  build/bench/dropout
  build/bench/policies
  build/bench/convnet
  for b in "${cuda_benches[@]}"; do
    "build/bench/$b"
  done
} | tee "$out"
