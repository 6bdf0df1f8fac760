#!/usr/bin/env bash
# The prepared GPU check for a lent H200: build for sm_90, run the CUDA tests, run them again
# under compute-sanitizer memcheck, and run the benchmarks. Everything lands under $OUT
# (default ./out) as logs and JSON lines. Run from the repository root.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_BUILD_EXAMPLES=ON -DKILN_BUILD_BENCH=ON > "$OUT/configure.log" 2>&1
cmake --build build-gpu -j"$(nproc)" --target kiln_tests_cuda bench_fusion_cuda > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -50 "$OUT/build.log"; exit 1; }
build-gpu/tests/kiln_tests_cuda > "$OUT/cuda_tests.log" 2>&1; echo "cuda tests rc=$?" | tee -a "$OUT/summary.txt"
compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/kiln_tests_cuda > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?" | tee -a "$OUT/summary.txt"
tail -3 "$OUT/cuda_tests.log" "$OUT/memcheck.log"
for b in build-gpu/bench/*_cuda; do
  [ -x "$b" ] && "$b" >> "$OUT/bench.jsonl" 2>> "$OUT/bench.err"
done
exit 0
