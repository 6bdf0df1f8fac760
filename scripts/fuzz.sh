#!/usr/bin/env bash
# Builds the libFuzzer harnesses in fuzz/ with clang (ASan + UBSan) and runs each for a bounded
# time from its committed seed corpus (fuzz/corpus/<name>, cut from the shipped data and test
# fixtures). A crash, a sanitizer report or an exception other than kiln::DataError fails the run
# and leaves the input in build-fuzz/crash-<name>-*; make it a regression test
# (tests/cpu/test_fuzz_regressions.cpp) when it happens.
#
#   scripts/fuzz.sh [--seconds 60] [name ...]      # names: idx csv checkpoint image (default: all)
#
# Prints one line per harness: executions, corpus size, coverage (libFuzzer's final stats).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=(idx csv checkpoint image)
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$cxx" ]; then
  echo "fuzz.sh: no clang++ (libFuzzer needs clang; apt-get install clang-14)" >&2
  exit 2
fi
out=build-fuzz
mkdir -p "$out"
# One harness: build, run, report (a line on stdout; the log's tail on stderr when it fails).
fuzz_one() {
  local name=$1 bin=$out/fuzz_$1
  local libs=(-lz)
  # The image decoder needs libjpeg and libpng (scripts/deps.sh installs them).
  [ "$name" = image ] && libs+=(-DKILN_HAVE_JPEG=1 -DKILN_HAVE_PNG=1 -ljpeg -lpng)
  "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude -DKILN_HAVE_ZLIB=1 "fuzz/fuzz_$name.cpp" "${libs[@]}" -o "$bin" || return 1
  local corpus=$out/corpus_$name  # the seeds plus what this run finds; the committed seeds stay as they are
  mkdir -p "$corpus"
  local log=$out/fuzz_$name.log
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$bin" -max_total_time="$seconds" -print_final_stats=1 \
      -rss_limit_mb=2048 -max_len=65536 -timeout=10 -artifact_prefix="$out/crash-$name-" \
      "$corpus" "fuzz/corpus/$name" >"$log" 2>&1; then
    local execs cov units
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    units=$(ls "$corpus" | wc -l)
    echo "fuzz $name: ${execs:-?} executions in ${seconds} s, no crash; ${cov:-cov: ?}, corpus $units inputs"
  else
    echo "fuzz $name: FAILED — see $log and $out/crash-$name-*" >&2
    tail -40 "$log" >&2
    return 1
  fi
}
# The harnesses run side by side, one per core (each libFuzzer run is single-threaded).
status=0
pids=()
for name in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 0.2; done
  fuzz_one "$name" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit "$status"
