#!/usr/bin/env bash
# The prepared check for a lent GPU (an H200 or H100), run from the repository root:
#
#   OUT=DIR bash scripts/gpu_check.sh [--phase build|run|extra|gpt|all|LIST] [--dry-run] [--plan]
#
# A lease is 15 minutes of device time in all (the machine's start included), at most 10 minutes
# per command, on a machine with no network. So the check comes in phases, each one device call:
#   build  find cuDNN and NCCL (preflight), configure, build              (caps: 45 + 225 s)
#   run    the steps that decide pass / fail, most informative first: the doctor, the CUDA tests,
#          train_digits, train_cnn_digits (cuDNN), train_digits under CUDA graphs   (255 s)
#   extra  compute-sanitizer (initcheck, racecheck, memcheck subsets) and the CUDA benchmarks,
#          for what a lease has left; the benchmarks are informational (never fail the check)
#   gpt    issue 30's: build train_gpt and train nanoGPT's baby GPT on the device (380 s)
#   all    every phase in one call (the local dry run, or a machine with time to spare).
# Call `--phase build`, then `--phase run` at once (the machine keeps build-gpu/ while warm, 30 s).
# `--plan` prints each phase's worst case from the caps below and the lease arithmetic, and exits.
#
# Every call writes at most three files under $OUT, whatever happens (the lease returns at most 8):
#   summary.json  every step of the phases asked for: command, role (gate / info), cap, status
#                 (passed, failed, timed_out, not_run), exit code, seconds, doctest's test cases
#                 (a filter that matched none fails), and why; the device, the preflight's
#                 findings, the tests' "observed:" messages (what cuBLASLt was seen to do), the
#                 plan; "exit": the script's status;
#   logs.tar.gz   every log (build-gpu/gpu-check-logs/, kept across the calls of one machine);
#   bench.jsonl   the benchmarks' JSON lines.
# Exit status: 0 when every gate step of the phases ran and passed; 1 when one did not; 2 at once
# (within seconds) when there is no usable device — nvidia-smi missing, failing or silent —
# with summary.json naming the reason and every step not run; 3 for --dry-run, which runs the
# device check and the preflight and reports every step as not run, commands and all.
#
# Preflight: cuDNN and NCCL from the system, the CUDA toolkit, or a Python environment's
# nvidia/cudnn and nvidia/nccl wheels (whose libraries have only versioned names, libcudnn.so.9),
# passed to CMake by full path (KILN_CUDNN_INCLUDE_DIR / _LIBRARY, KILN_NCCL_...) and to the
# programs through LD_LIBRARY_PATH. GPU_CHECK_SEARCH (a colon list of directories) replaces the
# places searched — the dry-run test uses it to see a missing library named. A step that needs a
# missing library is reported not run, naming it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
BUILD=${GPU_CHECK_BUILD_DIR:-build-gpu}
JOBS=${JOBS:-16}
LEASE_S=900  # device time of a lease, the machine's start included
START_S=90   # a machine's start, counted against the lease (an estimate: 60-120 s seen)
phases=build,run dry=0 plan=0
while [ $# -gt 0 ]; do
  case "$1" in
    --phase) phases=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --plan) plan=1; shift ;;
    *) echo "usage: OUT=DIR $0 [--phase build|run|extra|gpt|all|LIST] [--dry-run] [--plan]" >&2; exit 64 ;;
  esac
done
[ "$phases" = all ] && phases=build,run,extra,gpt
LOGS=$BUILD/gpu-check-logs
mkdir -p "$OUT" "$LOGS"
rm -f "$OUT/summary.json" "$OUT/logs.tar.gz"
: > "$OUT/bench.jsonl"
export PATH=/usr/local/cuda/bin:$PATH
export KILN_REQUIRE_DEVICE=1
# World size 1 over the loopback: NCCL's bootstrap neither looks for nor waits on other interfaces.
export NCCL_SOCKET_IFNAME=lo

# ---- the steps: name, phase, role (gate: decides pass / fail; info: reported only), cap in
# seconds, what it needs (cudnn, nccl, sanitizer; "" nothing more than the build), command ------
T=$BUILD/tests/kiln_tests_cuda
S=compute-sanitizer
names=() phase_of=() role=() cap=() needs=() cmd=()
add() { names+=("$1"); phase_of+=("$2"); role+=("$3"); cap+=("$4"); needs+=("$5"); cmd+=("$6"); }
add configure build gate 45 "" "cmake -S . -B $BUILD \${GEN} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_BUILD_TESTS=ON -DKILN_BUILD_EXAMPLES=ON -DKILN_BUILD_BENCH=ON \${PREFLIGHT_CMAKE}"
add build build gate 225 "" "cmake --build $BUILD -j$JOBS --target kiln_tests_cuda kiln-doctor train_digits train_cnn_digits bench_kernels_cuda bench_train_step_cuda"
add doctor run gate 15 "" "$BUILD/tools/kiln-doctor --expect-gpu"
add cuda-tests run gate 140 "" "$T"
add train-digits-cuda run gate 40 "" "$BUILD/examples/train_digits --data-dir data"
add train-cnn-digits-cuda run gate 35 cudnn "$BUILD/examples/train_cnn_digits --data-dir data"
add train-digits-graphs-cuda run gate 25 "" "$BUILD/examples/train_digits --data-dir data --mode reduce_overhead"
# initcheck leaves out max_autotune's cases: their timing runs (8 candidates, 5 rounds or more per
# plan) under the tool's instrumentation would spend its cap on timing, not on checking.
add initcheck extra gate 45 sanitizer "$S --tool initcheck --report-api-errors no --error-exitcode 9 $T -sf='*test_cuda_step*,*test_cuda_grad_scaler*,*test_cuda_modes*' -tce='*max_autotune*'"
add racecheck extra gate 45 sanitizer "$S --tool racecheck --report-api-errors no --error-exitcode 9 $T -sf='*test_cuda_kernels*,*test_cuda_rowwise*' -tce='*(large)*'"
add memcheck extra gate 120 sanitizer "$S --tool memcheck --report-api-errors no --error-exitcode 9 $T -sf='*test_cuda_step*,*test_cuda_nn*,*test_cuda_optim_loader*,*test_cuda_grad_scaler*,*test_cuda_streams*,*test_cuda_linear*' -tce='*non-blocking stream*,*waits for the kernel*,*waits for the work*,*(large)*'"
add bench-kernels-cuda extra info 40 "" "$BUILD/bench/kernels_cuda"
add bench-train-step-cuda extra info 60 "" "$BUILD/bench/train_step_cuda"
# Issue 30's: nanoGPT's baby GPT on the device, fp32 and bf16_mixed (its own call: the GPT's
# program is a heavy translation unit of its own).
add build-gpt gpt gate 200 "" "cmake --build $BUILD -j$JOBS --target train_gpt"
add train-gpt-cuda gpt gate 90 "" "$BUILD/examples/train_gpt --data-dir data"
add train-gpt-bf16-cuda gpt info 90 "" "$BUILD/examples/train_gpt --data-dir data --precision bf16_mixed"

in_phases() { [[ ",$phases," == *",$1,"* ]]; }
phase_cap() {
  local p=$1 total=0 i
  for i in "${!names[@]}"; do [ "${phase_of[$i]}" = "$p" ] && total=$((total + cap[i])); done
  echo $total
}
plan_text() {
  local b r e
  b=$(phase_cap build) r=$(phase_cap run) e=$(phase_cap extra)
  echo "plan: phase caps (worst case): build ${b} s, run ${r} s, extra ${e} s"
  echo "plan: start ${START_S} + build ${b} + run ${r} = $((START_S + b + r)) s; with a rerun of run: $((START_S + b + 2 * r)) s of the lease's ${LEASE_S} s"
  echo "plan: extra ${e} s at its caps; build and run at theirs leave $((LEASE_S - START_S - b - r)) s: a third call only where they ended early"
  echo "plan: gpt $(phase_cap gpt) s at its caps, after build (configure): a lease of its own, or what is left"
}
if ((plan)); then
  plan_text
  exit 0
fi

# ---- JSON helpers -----------------------------------------------------------------------------
json_str() {  # a JSON string of $1
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/ }
  s=${s//$'\n'/ }
  printf '"%s"' "$s"
}
status=() rc=() secs=() cases=() why=()
for i in "${!names[@]}"; do status+=(not_run) rc+=(null) secs+=(0) cases+=(null) why+=(""); done
gpu_name="" reason="" exit_code=0
declare -A found_inc=() found_lib=()

write_summary() {
  local i first=1
  {
    printf '{"script": "gpu_check", "phases": %s, "dry_run": %s, "exit": %d, "reason": %s, "gpu": %s,\n' \
      "$(json_str "$phases")" "$([ $dry = 1 ] && echo true || echo false)" "$exit_code" "$(json_str "$reason")" \
      "$(json_str "$gpu_name")"
    printf ' "preflight": {'
    local lib sep=""
    for lib in cudnn nccl; do
      printf '%s"%s": {"found": %s, "include": %s, "library": %s}' "$sep" "$lib" \
        "$([ -n "${found_lib[$lib]:-}" ] && echo true || echo false)" "$(json_str "${found_inc[$lib]:-}")" \
        "$(json_str "${found_lib[$lib]:-}")"
      sep=", "
    done
    printf '},\n "observations": ['
    # What the tests observed of behaviour nobody has measured yet (their "observed:" messages,
    # e.g. what cuBLASLt's ReLU epilogue does with NaN).
    sep=""
    while IFS= read -r line; do
      printf '%s%s' "$sep" "$(json_str "$line")"
      sep=", "
    done < <(cat "$LOGS"/*.log 2> /dev/null | grep -aoE 'observed: .*' | sort -u)
    printf '],\n "plan": %s,\n "steps": [\n' "$(json_str "$(plan_text | tr '\n' ' ')")"
    for i in "${!names[@]}"; do
      in_phases "${phase_of[$i]}" || continue
      ((first)) || printf ',\n'
      first=0
      printf '  {"name": %s, "phase": "%s", "role": "%s", "cap_s": %d, "command": %s, "status": "%s", "rc": %s, "seconds": %d, "test_cases": %s, "reason": %s}' \
        "$(json_str "${names[$i]}")" "${phase_of[$i]}" "${role[$i]}" "${cap[$i]}" "$(json_str "${cmd[$i]}")" \
        "${status[$i]}" "${rc[$i]}" "${secs[$i]}" "${cases[$i]}" "$(json_str "${why[$i]}")"
    done
    printf '\n]}\n'
  } > "$OUT/summary.json"
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2> /dev/null || true
}
finish() {  # finish EXIT_CODE [REASON]: every step not yet run keeps `not_run` with REASON
  exit_code=$1
  [ -n "${2:-}" ] && reason=$2
  local i
  for i in "${!names[@]}"; do
    [ "${status[$i]}" = not_run ] && [ -z "${why[$i]}" ] && why[i]=${reason:-not reached}
  done
  write_summary
  echo "gpu_check: exit $exit_code${reason:+ ($reason)}; summary in $OUT/summary.json"
  exit "$exit_code"
}

# ---- the device first: without one there is nothing to check, and nothing waits --------------
if ! command -v nvidia-smi > /dev/null; then
  finish 2 "no usable GPU: nvidia-smi not found"
fi
if ! timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$LOGS/gpu.txt" 2>&1; then
  finish 2 "no usable GPU: nvidia-smi failed: $(tail -n 1 "$LOGS/gpu.txt")"
fi
gpu_name=$(head -n 1 "$LOGS/gpu.txt")
[ -n "$gpu_name" ] || finish 2 "no usable GPU: nvidia-smi listed no device"
echo "gpu: $gpu_name"

# ---- preflight: cuDNN and NCCL, wherever the image has them ----------------------------------
search=()
if [ -n "${GPU_CHECK_SEARCH:-}" ]; then
  IFS=: read -r -a search <<< "$GPU_CHECK_SEARCH"
else
  search=(/usr/local/cuda /usr/local/cuda/targets/x86_64-linux /usr /usr/local /usr/lib/x86_64-linux-gnu)
  for py in python3 /opt/torch/.venv/bin/python3 .venv-bench/bin/python; do
    command -v "$py" > /dev/null || continue
    while read -r site; do
      [ -d "$site/nvidia" ] && search+=("$site/nvidia/cudnn" "$site/nvidia/nccl" "$site/nvidia/cu13" "$site/nvidia")
    done < <(timeout 20 "$py" -c 'import site; print("\n".join(site.getsitepackages()))' 2> /dev/null)
  done
fi
find_one() {  # find_one NAME HEADER LIBRARY_STEM: the first root with both the header and the library
  local name=$1 header=$2 stem=$3 root inc lib
  for root in "${search[@]}"; do
    for inc in "$root/include" "$root"; do
      [ -f "$inc/$header" ] || continue
      for lib in "$root"/lib64/"$stem".so "$root"/lib/"$stem".so "$root"/lib/x86_64-linux-gnu/"$stem".so \
        "$root"/lib64/"$stem".so.[0-9]* "$root"/lib/"$stem".so.[0-9]* "$root"/"$stem".so*; do
        [ -f "$lib" ] || continue
        found_inc[$name]=$inc found_lib[$name]=$lib
        echo "preflight: $name: $header in $inc, library $lib" | tee -a "$LOGS/preflight.log"
        return 0
      done
    done
  done
  echo "preflight: $name NOT FOUND ($header with $stem.so* under: ${search[*]})" | tee -a "$LOGS/preflight.log"
  return 1
}
PREFLIGHT_CMAKE="" libdirs=""
missing=()
for name in cudnn nccl; do
  if find_one "$name" "$name.h" "lib$name"; then
    PREFLIGHT_CMAKE+=" -DKILN_${name^^}_INCLUDE_DIR=${found_inc[$name]} -DKILN_${name^^}_LIBRARY=${found_lib[$name]}"
    libdirs+=":$(dirname "${found_lib[$name]}")"
  else
    missing+=("$name")
  fi
done
export LD_LIBRARY_PATH=${libdirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
have_sanitizer=0
command -v "$S" > /dev/null && have_sanitizer=1
# zlib: without its headers kiln reads data/x for data/x.gz, so decompress beside them.
if [ ! -f /usr/include/zlib.h ] && ((!dry)); then
  for f in data/*.gz; do gunzip -kf "$f"; done
fi
GEN=""
[ -f "$BUILD/CMakeCache.txt" ] || ! command -v ninja > /dev/null || GEN="-G Ninja"

# ---- the steps ---------------------------------------------------------------------------------
failed=0
for i in "${!names[@]}"; do
  in_phases "${phase_of[$i]}" || continue
  name=${names[$i]} log="$LOGS/${names[$i]}.log"
  run_cmd=${cmd[$i]//\$\{GEN\}/$GEN}
  run_cmd=${run_cmd//\$\{PREFLIGHT_CMAKE\}/$PREFLIGHT_CMAKE}
  cmd[i]=$run_cmd
  need=${needs[$i]}
  if ((dry)); then
    why[i]="dry run: not executed"
  elif [ "$need" = cudnn ] || [ "$need" = nccl ]; then
    [ -n "${found_lib[$need]:-}" ] || why[i]="needs $need, which the preflight did not find"
  elif [ "$need" = sanitizer ] && ((!have_sanitizer)); then
    why[i]="needs compute-sanitizer, not on PATH"
  fi
  if [ "${phase_of[$i]}" != build ] && ((!dry)) && [ -z "${why[$i]}" ] && [ ! -x "${run_cmd%% *}" ] &&
    [[ "$run_cmd" != "$S "* ]]; then
    why[i]="${run_cmd%% *} is not built (phase build first, on the same warm machine)"
  fi
  if [ -n "${why[$i]}" ]; then
    [[ "${why[$i]}" == dry* ]] || { [ "${role[$i]}" = gate ] && failed=1; }
    echo "$name: not run (${why[$i]})"
    continue
  fi
  t0=$SECONDS
  timeout -k 10 "${cap[$i]}" bash -c "$run_cmd" >> "$log" 2>&1
  rc[i]=$?
  secs[i]=$((SECONDS - t0))
  if [[ $name == bench-* ]]; then grep -h '^{' "$log" >> "$OUT/bench.jsonl"; fi
  n=$(grep -aoE '^\[doctest\] test cases: *[0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+$')
  [ -n "$n" ] && cases[i]=$n
  if ((rc[i] == 124 || rc[i] == 137)); then
    status[i]=timed_out why[i]="stopped at its cap of ${cap[$i]} s"
  elif ((rc[i] != 0)); then
    status[i]=failed why[i]="exit status ${rc[$i]} (see $name.log)"
  elif [ -n "$n" ] && ((n == 0)); then
    status[i]=failed why[i]="its filter matched no test case"
  elif [ "${role[$i]}" = gate ] && grep -aqiE '(^|: |")skipped' "$log"; then
    status[i]=failed why[i]="a program skipped its work: $(grep -aiE -m1 '(^|: |")skipped' "$log" | cut -c1-160)"
  else
    status[i]=passed
  fi
  [ "${status[$i]}" = passed ] || { [ "${role[$i]}" = gate ] && failed=1; }
  echo "$name: ${status[$i]} (${secs[$i]} s${why[$i]:+, ${why[$i]}})"
done
((dry)) && finish 3 "dry run: device check and preflight only${missing[*]:+; missing: ${missing[*]}}"
((failed)) && finish 1 "a gate step did not pass${missing[*]:+; missing: ${missing[*]}}"
finish 0
