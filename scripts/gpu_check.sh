#!/usr/bin/env bash
# The prepared GPU check for a lent H200: build for sm_90, run the CUDA tests, the training-step
# and fusion benchmarks, the train_digits example on the GPU and (for comparison) on the CPU,
# and the CUDA tests again under compute-sanitizer memcheck. Everything lands under $OUT
# (default ./out) as logs and JSON lines, with a short summary in $OUT/summary.txt. Run from
# the repository root.
#
# It is sized to finish in about 8 minutes on 16 cores: only the needed targets are built,
# every step runs under `timeout`, and no step may run past the budget (GPU_CHECK_BUDGET_S,
# default 480 s from the start; the build alone at most GPU_CHECK_BUILD_S, default 300 s); a
# step that would start with under 10 s left is skipped. One failing step does not stop the
# others; the exit status is 1 when any step failed. JOBS (default 16) sets the build's -j.
set -uo pipefail
OUT=${OUT:-out}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
BUILD_CAP=${GPU_CHECK_BUILD_S:-300}
JOBS=${JOBS:-16}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
: > "$OUT/bench.jsonl"
: > "$OUT/bench.err"
export PATH=/usr/local/cuda/bin:$PATH
failed=0

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

# step NAME CAP_S STDOUT STDERR CMD... — runs CMD under timeout min(CAP_S, budget left),
# appending its output to STDOUT and STDERR (may be the same file); notes rc and seconds.
step() {
  local name=$1 cap=$2 out=$3 err=$4 t0=$SECONDS rc
  shift 4
  local left=$((BUDGET - SECONDS))
  local limit=$((cap < left ? cap : left))
  if ((limit < 10)); then
    note "$name: SKIPPED (budget of ${BUDGET} s spent)"
    return 125
  fi
  timeout -k 10 "$limit" "$@" >> "$out" 2>> "$err"
  rc=$?
  local why=""
  ((rc == 124 || rc == 137)) && why=", timed out after ${limit} s"
  note "$name: rc=$rc ($((SECONDS - t0)) s$why)"
  return $rc
}

# ---- device, configure, build ----------------------------------------------------------------
step nvidia-smi 30 "$OUT/gpu.txt" "$OUT/gpu.txt" \
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv || failed=1

targets=(kiln_tests_cuda bench_fusion_cuda bench_train_step_cuda train_digits)
gen=()
[ -f build-gpu/CMakeCache.txt ] || ! command -v ninja > /dev/null || gen=(-G Ninja)
cfg=(cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
     -DKILN_BUILD_EXAMPLES=ON -DKILN_BUILD_BENCH=ON)
if ! step configure 120 "$OUT/configure.log" "$OUT/configure.log" "${cfg[@]}" -DKILN_BUILD_TESTS=ON; then
  failed=1  # most likely doctest is missing: keep the benchmarks and the example
  step configure-without-tests 120 "$OUT/configure.log" "$OUT/configure.log" "${cfg[@]}" -DKILN_BUILD_TESTS=OFF
  targets=(bench_fusion_cuda bench_train_step_cuda train_digits)
fi

# A target counts as built when its program exists after the build: the programs are removed
# first (objects stay, so a rerun only relinks), so a stale one never passes for a new one.
declare -A bin=([kiln_tests_cuda]=build-gpu/tests/kiln_tests_cuda [bench_fusion_cuda]=build-gpu/bench/fusion_cuda
                [bench_train_step_cuda]=build-gpu/bench/train_step_cuda [train_digits]=build-gpu/examples/train_digits)
for t in "${targets[@]}"; do rm -f "${bin[$t]}"; done
if grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' build-gpu/CMakeCache.txt 2> /dev/null; then
  step build "$BUILD_CAP" "$OUT/build.log" "$OUT/build.log" cmake --build build-gpu -j"$JOBS" --target "${targets[@]}" -- -k 0
else
  # CMake's Makefiles build several --target's one after another (.NOTPARALLEL): side by side here.
  for t in "${targets[@]}"; do
    step "build $t" "$BUILD_CAP" "$OUT/build_$t.log" "$OUT/build_$t.log" cmake --build build-gpu -j"$JOBS" --target "$t" &
  done
  wait
fi
declare -A built=()
for t in "${targets[@]}"; do
  if [ -x "${bin[$t]}" ]; then built[$t]=1; else note "build $t: FAILED (see $OUT/build*.log)"; failed=1; fi
done
cat "$OUT"/build*.log 2> /dev/null | grep -E 'error|warning' | head -40 > "$OUT/build_problems.txt"

# run TARGET NAME CAP_S STDOUT STDERR CMD... — step, when TARGET was built.
run() {
  local t=$1 name=$2
  shift 2
  if [ -z "${built[$t]:-}" ]; then
    note "$name: SKIPPED ($t not built)"
    failed=1
    return
  fi
  step "$name" "$@" || failed=1
}

# ---- runs, the quick and new ones first; memcheck last, with what is left ----------------------
run kiln_tests_cuda cuda-tests 120 "$OUT/cuda_tests.log" "$OUT/cuda_tests.log" build-gpu/tests/kiln_tests_cuda
run bench_train_step_cuda bench-train-step-cuda 120 "$OUT/bench.jsonl" "$OUT/bench.err" \
  build-gpu/bench/train_step_cuda
run train_digits train-digits-cuda 300 "$OUT/train_digits_cuda.log" "$OUT/train_digits_cuda.log" \
  build-gpu/examples/train_digits --data-dir data
# The same binary on the CPU backend: with no visible device it falls back to the CPU.
run train_digits train-digits-cpu 120 "$OUT/train_digits_cpu.log" "$OUT/train_digits_cpu.log" \
  env CUDA_VISIBLE_DEVICES= build-gpu/examples/train_digits --data-dir data
run bench_fusion_cuda bench-fusion-cuda 120 "$OUT/bench.jsonl" "$OUT/bench.err" build-gpu/bench/fusion_cuda
run kiln_tests_cuda memcheck 300 "$OUT/memcheck.log" "$OUT/memcheck.log" \
  compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/kiln_tests_cuda

# ---- summary ---------------------------------------------------------------------------------
{
  echo "---- results (total $SECONDS s)"
  sed -n 2p "$OUT/gpu.txt" 2> /dev/null
  for f in cuda_tests memcheck; do
    [ -f "$OUT/$f.log" ] && grep -E '^\[doctest\] (test cases|assertions)|ERROR SUMMARY|skipped' "$OUT/$f.log" | sed "s/^/$f: /"
  done
  grep '"train_step"' "$OUT/bench.jsonl"
  echo "fusion_cuda: $(grep -c '"fusion"' "$OUT/bench.jsonl") lines in bench.jsonl"
  for d in cuda cpu; do
    [ -f "$OUT/train_digits_$d.log" ] && grep -aE '^(device:|final test accuracy|fusion report)' \
      "$OUT/train_digits_$d.log" | sed "s/^/train_digits_$d: /"
  done
  [ -s "$OUT/bench.err" ] && { echo "bench.err:"; tail -n 5 "$OUT/bench.err"; }
  [ -s "$OUT/build_problems.txt" ] && echo "build problems: $(wc -l < "$OUT/build_problems.txt") lines in build_problems.txt"
} >> "$OUT/summary.txt" 2> /dev/null
echo "========== summary"
cat "$OUT/summary.txt"
exit $failed
