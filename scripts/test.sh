#!/usr/bin/env bash
# The README's test command, and exactly what CI runs (.ci/run calls it, nothing else): builds
# everything in build-tests/ and runs every test (CPU suites, compile-fail tests, header checks,
# the installed-package consumer, the MPI tests, and the CUDA suites, which ctest lists as skipped
# without a device), then the suites that -march changes once more from a portable build, then
# runs the readers' fuzzers for a bounded time from their committed seeds, and prints what each
# budgeted file cost to compile in this build beside its budget (README, "Compile time").
#
# build-tests/ is built to be tested, not timed (KILN_QUICK_BUILD): the examples and benchmarks
# the tests run at -O1, and CUDA code to PTX only (no GPU here compiles it; a device would load
# the PTX). scripts/train.sh, bench.sh and the benchmarks build in build/ at -O3.
#
# The portable build (build-portable/, KILN_NATIVE=OFF: no -march=native) compiles kiln's
# portable GEMM kernels and half-precision conversions, which a -march=native build never
# compiles on an AVX-512 machine. It builds the suites that code reaches (kiln_tests_portable,
# tests/CMakeLists.txt) at low priority while ctest runs; --portable-all builds and runs the
# whole CPU suite there instead (about 4 more minutes on 2 cores: more than CI's budget allows).
set -euo pipefail
cd "$(dirname "$0")/.."
portable_target=kiln_tests_portable
[ "${1:-}" = "--portable-all" ] && portable_target=kiln_tests_cpu
start=$EPOCHREALTIME
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f s", b - a }'; }
eval "$(bash scripts/deps.sh | grep '^export ' || true)"
bash scripts/deps.sh | grep -v '^export ' >&2 || true
# The peers' readers for the interop tests (TensorBoard's EventAccumulator, safetensors): a
# test-only venv, never a library dependency. torch is too large to fetch per run, so
# torch_interop skips; without a registry both tests skip, saying why.
if [ ! -x .venv-bench/bin/python ]; then
  { python3 -m venv .venv-bench && .venv-bench/bin/pip install -q tensorboard safetensors numpy; } ||
    echo "test.sh: could not install tensorboard / safetensors: their interop tests will skip"
fi
# The fuzzers' compiler (libFuzzer comes with clang).
command -v clang++-14 >/dev/null || command -v clang++ >/dev/null ||
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang-14 >/dev/null || true; }
cmake -S . -B build-tests -DCMAKE_BUILD_TYPE=Release -DKILN_QUICK_BUILD=ON >/dev/null
cmake --build build-tests -j"$(nproc)"
echo "test.sh: built build-tests/ ($(since "$start"))"
cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF -DKILN_WITH_CUDA=OFF \
  -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_TOOLS=OFF >/dev/null
nice -n 15 cmake --build build-portable -j"$(nproc)" --target "$portable_target" >build-portable/build.log 2>&1 &
portable_build=$!
status=0
ctest --test-dir build-tests --output-on-failure -j"$(nproc)" || status=$?
if ! wait "$portable_build"; then
  cat build-portable/build.log
  echo "test.sh: the portable (KILN_NATIVE=OFF) build of the CPU suite failed" >&2
  exit 1
fi
echo "test.sh: $portable_target from the portable build (KILN_NATIVE=OFF)"
"build-portable/tests/$portable_target" || status=$?
# The readers under libFuzzer (clang, ASan + UBSan), a bounded run each from the committed seeds:
# 10 s each (KILN_FUZZ_SECONDS for longer), which keeps the whole of CI under 30 minutes on a
# slow 2-core sitting (29.6 minutes with 20 s each, 2026-12-06; ~200 K executions per reader in 10 s).
bash scripts/fuzz.sh --seconds "${KILN_FUZZ_SECONDS:-10}" || status=$?
# Compile time, budgeted like speed (README, "Compile time"): the test build's own record of every
# budgeted file (-O1 programs, compiled two at a time), so a regression shows at the stop that
# made it. KILN_COMPILE_BUDGETS=1 adds the budgets' own measure — each row compiled alone in a
# Release build (build-compile-time/), about 4 minutes on 2 cores, which CI's 30-minute budget
# leaves out. Informational: a row over budget is printed as such, it does not fail the tests.
if [ "${KILN_COMPILE_BUDGETS:-0}" = 1 ]; then python3 bench/compile_time --compilers g++ --budgeted || true; fi
python3 bench/compile_time --from-log build-tests/compile_times.jsonl || true
echo "test.sh: done in $(since "$start") (exit $status)"
exit "$status"
