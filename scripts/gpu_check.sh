#!/usr/bin/env bash
# The prepared GPU check for a lent H200, run from the repository root:
#   OUT=/some/dir scripts/gpu_check.sh
# builds for sm_90 and runs, with KILN_REQUIRE_DEVICE=1 (so nothing can "pass" by skipping):
#   the CUDA tests; the benchmarks (train_step_cuda beside PyTorch CUDA eager, policies_cuda with
#   the modes side by side, fusion_cuda, kernels_cuda); train_digits (also --mode reduce_overhead:
#   CUDA graphs, and --mode max_autotune twice: cuBLASLt algorithms timed, then read from the cache) and train_cnn_digits on the GPU and, for comparison,
#   on the CPU; train_cifar (ResNet-9) at batch 512 beside PyTorch CUDA eager and compiled
#   (bench/torch_convnet.py --device cuda); and
#   compute-sanitizer's memcheck, racecheck and initcheck on chosen subsets of the CUDA tests. The
#   CUDA tests include the world-size-1 NCCL group and the data-parallel Step through it
#   (tests/cuda/test_cuda_dist.cu).
# Everything lands under $OUT (default ./out): logs, bench.jsonl (one JSON line per measurement)
# and summary.txt, which the script prints at the end.
#
# Sized for 8 minutes of a 16-core machine (scripts/README.md has the measured compile times):
# one `-j` build of only the needed targets (Ninja when present), every step under `timeout`
# with its own cap, and a total budget (GPU_CHECK_BUDGET_S, default 480 s): a step that would
# start with under 10 s left is skipped — and a skipped step fails the check. One failing step
# never stops the others. Exit status: 0 when every step ran and passed, 1 otherwise; 2 at once
# when there is no usable device (nvidia-smi fails) — the reason is printed.
set -uo pipefail
OUT=${OUT:-out}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
BUILD_CAP=${GPU_CHECK_BUILD_S:-240}
JOBS=${JOBS:-16}
BUILD=${GPU_CHECK_BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
: > "$OUT/bench.jsonl"
: > "$OUT/bench.err"
export PATH=/usr/local/cuda/bin:$PATH
export KILN_REQUIRE_DEVICE=1
failed=0

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

# step NAME CAP_S STDOUT STDERR CMD... — runs CMD under timeout min(CAP_S, budget left),
# appending its output to STDOUT and STDERR (may be the same file); notes rc and seconds. A
# step the budget cannot start counts as a failure.
step() {
  local name=$1 cap=$2 out=$3 err=$4 t0=$SECONDS rc
  shift 4
  local left=$((BUDGET - SECONDS))
  local limit=$((cap < left ? cap : left))
  if ((limit < 10)); then
    note "$name: SKIPPED (budget of ${BUDGET} s spent)"
    failed=1
    return 125
  fi
  timeout -k 10 "$limit" "$@" >> "$out" 2>> "$err"
  rc=$?
  local why=""
  ((rc == 124 || rc == 137)) && why=", timed out after ${limit} s"
  note "$name: rc=$rc ($((SECONDS - t0)) s$why)"
  ((rc == 0)) || failed=1
  return $rc
}

# ---- the device, first: without one there is nothing to check ---------------------------------
if ! nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$OUT/gpu.txt" 2>&1; then
  note "no usable GPU: nvidia-smi failed: $(tail -n 1 "$OUT/gpu.txt")"
  exit 2
fi
note "gpu: $(sed -n 2p "$OUT/gpu.txt")"

# ---- inputs the build and the examples need, with no registry to install from -----------------
# doctest: the tests fall back to third_party/doctest when it is not installed (CMake says so).
# zlib: without its headers kiln reads data/x for data/x.gz, so decompress beside them.
if [ ! -f /usr/include/zlib.h ]; then
  note "zlib.h missing: decompressing data/*.gz beside the originals"
  for f in data/*.gz; do gunzip -kf "$f"; done
fi
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer 2> /dev/null)

# ---- configure and build: one -j build of the needed targets ----------------------------------
targets=(kiln_tests_cuda bench_train_step_cuda bench_policies_cuda bench_fusion_cuda bench_kernels_cuda train_digits
         train_cnn_digits train_cifar train_gpt kiln-doctor)
declare -A bin=([kiln_tests_cuda]=$BUILD/tests/kiln_tests_cuda [bench_train_step_cuda]=$BUILD/bench/train_step_cuda
                [bench_policies_cuda]=$BUILD/bench/policies_cuda [bench_fusion_cuda]=$BUILD/bench/fusion_cuda
                [bench_kernels_cuda]=$BUILD/bench/kernels_cuda [train_digits]=$BUILD/examples/train_digits
                [train_cnn_digits]=$BUILD/examples/train_cnn_digits [train_cifar]=$BUILD/examples/train_cifar
                [train_gpt]=$BUILD/examples/train_gpt
                [kiln-doctor]=$BUILD/tools/kiln-doctor)
gen=()
[ -f "$BUILD/CMakeCache.txt" ] || ! command -v ninja > /dev/null || gen=(-G Ninja)
step configure 120 "$OUT/configure.log" "$OUT/configure.log" cmake -S . -B "$BUILD" "${gen[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_BUILD_TESTS=ON -DKILN_BUILD_EXAMPLES=ON \
  -DKILN_BUILD_BENCH=ON
# The programs are removed first (objects stay, so a rerun only relinks): a stale one never
# passes for a new one.
for t in "${targets[@]}"; do rm -f "${bin[$t]}"; done
step build "$BUILD_CAP" "$OUT/build.log" "$OUT/build.log" cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"
declare -A built=()
for t in "${targets[@]}"; do
  if [ -x "${bin[$t]}" ]; then built[$t]=1; else note "build $t: FAILED (see $OUT/build.log)"; failed=1; fi
done
grep -E 'error|warning' "$OUT/build.log" | head -40 > "$OUT/build_problems.txt"
# Per-file compile times (Ninja's log), slowest first: what the build bound is made of.
[ -f "$BUILD/.ninja_log" ] && awk 'NR > 1 { printf "%.1f s %s\n", ($2 - $1) / 1000, $4 }' "$BUILD/.ninja_log" |
  sort -rn | head -20 > "$OUT/compile_times.txt"

# run TARGET NAME CAP_S STDOUT STDERR CMD... — step, when TARGET was built.
run() {
  local t=$1 name=$2
  shift 2
  if [ -z "${built[$t]:-}" ]; then
    note "$name: SKIPPED ($t not built)"
    failed=1
    return
  fi
  step "$name" "$@"
}

T=$BUILD/tests/kiln_tests_cuda
# ---- issue 12: the doctor's verdict (it must name the device and pass its device checks) and the
# memory plan on the device ----------------------------------------------------------------------
run kiln-doctor doctor 30 "$OUT/doctor.log" "$OUT/doctor.log" "$BUILD/tools/kiln-doctor" --expect-gpu
run train_digits plan-cuda 30 "$OUT/plan_cuda.log" "$OUT/plan_cuda.log" "$BUILD/examples/train_digits" --plan --batch 1024
# ---- tests, benchmarks, examples --------------------------------------------------------------
run kiln_tests_cuda cuda-tests 120 "$OUT/cuda_tests.log" "$OUT/cuda_tests.log" "$T"
# Issue 30: nanoGPT's baby GPT on the device (kiln's fp32 attention kernels, the whole step one
# CUDA graph under reduce_overhead): its final validation loss against the CPU's 1.88, ms per
# iteration.
run train_gpt train-gpt-cuda 120 "$OUT/train_gpt_cuda.log" "$OUT/train_gpt_cuda.log" \
  "$BUILD/examples/train_gpt" --data-dir data
run train_gpt train-gpt-bf16-cuda 120 "$OUT/train_gpt_bf16_cuda.log" "$OUT/train_gpt_bf16_cuda.log" \
  "$BUILD/examples/train_gpt" --data-dir data --precision bf16_mixed
# train_step_cuda runs PyTorch's CUDA eager step itself (bench/torch_train_step.py --device cuda,
# python3 from PATH) in the same run, and fails under KILN_REQUIRE_DEVICE when it got no times.
run bench_train_step_cuda bench-train-step-cuda 90 "$OUT/bench.jsonl" "$OUT/bench.err" "$BUILD/bench/train_step_cuda"
run bench_policies_cuda bench-policies-cuda 60 "$OUT/bench.jsonl" "$OUT/bench.err" "$BUILD/bench/policies_cuda"
run bench_kernels_cuda bench-kernels-cuda 60 "$OUT/bench.jsonl" "$OUT/bench.err" "$BUILD/bench/kernels_cuda"
run bench_fusion_cuda bench-fusion-cuda 60 "$OUT/bench.jsonl" "$OUT/bench.err" "$BUILD/bench/fusion_cuda"
run train_digits train-digits-cuda 60 "$OUT/train_digits_cuda.log" "$OUT/train_digits_cuda.log" \
  "$BUILD/examples/train_digits" --data-dir data
# Issue 13: the step captured as a CUDA graph and replayed (its accuracy and epoch time against
# the line above; bench/policies_cuda has the step times side by side).
run train_digits train-digits-graphs-cuda 60 "$OUT/train_digits_graphs_cuda.log" "$OUT/train_digits_graphs_cuda.log" \
  "$BUILD/examples/train_digits" --data-dir data --mode reduce_overhead
# cuBLASLt autotuning: the first run times the heuristic's top algorithms per plan (the report
# lists each choice against the heuristic's), the second reads them from the cache.
for pass in 1 2; do
  KILN_CACHE_DIR="$OUT/tune-cache" run train_digits train-digits-autotune-$pass-cuda 90 \
    "$OUT/train_digits_autotune_$pass.log" "$OUT/train_digits_autotune_$pass.log" \
    "$BUILD/examples/train_digits" --data-dir data --mode max_autotune
done
# The same binary on the CPU backend: no visible device, and no device required for this run.
# Issue 11: 4 epochs + --resume to 10 end bit for bit where 10 epochs in one go end, on the GPU.
run train_digits resume-cuda 60 "$OUT/resume_cuda.log" "$OUT/resume_cuda.log" \
  bash scripts/resume_check.sh --bin "$BUILD/examples/train_digits" --data-dir data
run train_digits train-digits-cpu 60 "$OUT/train_digits_cpu.log" "$OUT/train_digits_cpu.log" \
  env CUDA_VISIBLE_DEVICES= KILN_REQUIRE_DEVICE=0 "$BUILD/examples/train_digits" --data-dir data
# Issue 10: the convnets on the GPU (cuDNN) and the CNN on the CPU for comparison; ResNet-9's
# images/s at batch 512 beside PyTorch CUDA eager and torch.compile on the same layers.
run train_cnn_digits train-cnn-digits-cuda 90 "$OUT/train_cnn_digits_cuda.log" "$OUT/train_cnn_digits_cuda.log" \
  "$BUILD/examples/train_cnn_digits" --data-dir data
run train_cnn_digits train-cnn-digits-cpu 90 "$OUT/train_cnn_digits_cpu.log" "$OUT/train_cnn_digits_cpu.log" \
  env CUDA_VISIBLE_DEVICES= KILN_REQUIRE_DEVICE=0 "$BUILD/examples/train_cnn_digits" --data-dir data
run train_cifar train-cifar-cuda 90 "$OUT/train_cifar_cuda.log" "$OUT/train_cifar_cuda.log" \
  "$BUILD/examples/train_cifar" --batch 512 --synthetic-images 16384 --epochs 3
step torch-convnet-cuda 150 "$OUT/bench.jsonl" "$OUT/bench.err" \
  python3 bench/torch_convnet.py --device cuda --models resnet9_w32 --batches 512 --variants eager,compiled

# ---- compute-sanitizer on chosen subsets (doctest's -sf: source files; -tce: cases left out) ----
# --report-api-errors no: the runtime tests fail API calls on purpose (cudaSetDevice(-1), a
# 1 PiB cudaMalloc); everything else stays an error. The subsets keep memcheck to the step, the
# layers, the optimizers, the loader, the scaler, the row kernels and the streams (without the
# 2^26-element cases); racecheck to the kernels with shared memory; initcheck to the step.
sanitize() {
  local tool=$1 cap=$2
  shift 2
  if [ -z "$SANITIZER" ]; then
    note "$tool: SKIPPED (compute-sanitizer not found)"
    failed=1
    return
  fi
  run kiln_tests_cuda "$tool" "$cap" "$OUT/$tool.log" "$OUT/$tool.log" \
    "$SANITIZER" --tool "$tool" --report-api-errors no --error-exitcode 9 "$T" "$@"
}
sanitize memcheck 120 -sf='*test_cuda_step*,*test_cuda_modes*,*test_cuda_nn*,*test_cuda_optim_loader*,*test_cuda_grad_scaler*,*test_cuda_kernels*,*test_cuda_rowwise*,*test_cuda_streams*,*test_cuda_linear*' \
  -tce='*non-blocking stream*,*waits for the kernel*,*waits for the work*,*(large)*'
sanitize racecheck 45 -sf='*test_cuda_kernels*,*test_cuda_rowwise*,*test_cuda_gpt*' -tce='*(large)*,GPT*'
sanitize initcheck 45 -sf='*test_cuda_step*,*test_cuda_grad_scaler*,*test_cuda_modes*'

# ---- nothing may have been skipped -------------------------------------------------------------
if grep -l -i -E '(^|: |")skipped' "$OUT"/*.log "$OUT/bench.jsonl" > "$OUT/skipped.txt" 2> /dev/null; then
  note "FAILED: a program skipped its work: $(tr '\n' ' ' < "$OUT/skipped.txt")"
  failed=1
fi

# ---- summary ---------------------------------------------------------------------------------
{
  echo "---- results (total $SECONDS s)"
  [ -f "$OUT/doctor.log" ] && grep -E '^(verdict|  device|  cuDNN|  cuBLASLt|  NCCL|  (ok|FAIL) )' "$OUT/doctor.log" |
    sed "s/^/doctor: /"
  for f in cuda_tests memcheck racecheck initcheck; do
    [ -f "$OUT/$f.log" ] && grep -E '^\[doctest\] (test cases|assertions)|ERROR SUMMARY|RACECHECK SUMMARY|skipped|FAILED' \
      "$OUT/$f.log" | sed "s/^/$f: /"
  done
  grep -h -E '"(train_step|policies|kernels|fusion|convnet)' "$OUT/bench.jsonl"
  [ -f "$OUT/train_cifar_cuda.log" ] && grep -aE '^(device:|epoch|final test accuracy)' "$OUT/train_cifar_cuda.log" |
    sed "s/^/train_cifar_cuda: /"
  for f in train_gpt_cuda train_gpt_bf16_cuda; do
    [ -f "$OUT/$f.log" ] && grep -aE '^(device:|final val loss|[0-9.]+ kernels per training step)' "$OUT/$f.log" |
      sed "s/^/$f: /"
  done
  [ -f "$OUT/train_digits_graphs_cuda.log" ] && grep -aE '^(mode |final test accuracy)' \
    "$OUT/train_digits_graphs_cuda.log" | sed "s/^/train_digits_graphs_cuda: /"
  for d in cuda cpu; do
    [ -f "$OUT/train_digits_$d.log" ] && grep -aE '^(device:|final test accuracy|[0-9.]+ kernels per training step)' \
      "$OUT/train_digits_$d.log" | sed "s/^/train_digits_$d: /"
    [ -f "$OUT/train_cnn_digits_$d.log" ] && grep -aE '^(device:|final test accuracy|[0-9.]+ kernels per training step)' \
      "$OUT/train_cnn_digits_$d.log" | sed "s/^/train_cnn_digits_$d: /"
  done
  [ -s "$OUT/bench.err" ] && { echo "bench.err:"; tail -n 5 "$OUT/bench.err"; }
  [ -s "$OUT/build_problems.txt" ] && echo "build problems: $(wc -l < "$OUT/build_problems.txt") lines in build_problems.txt"
  [ -s "$OUT/compile_times.txt" ] && { echo "slowest compiles:"; head -5 "$OUT/compile_times.txt"; }
} >> "$OUT/summary.txt" 2> /dev/null
echo "========== summary"
cat "$OUT/summary.txt"
exit $failed
