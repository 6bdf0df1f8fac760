#!/usr/bin/env bash
# Builds everything and runs every test (CPU suites, compile-fail tests, header checks, the
# installed-package consumer, the MPI tests, and the CUDA suites, which ctest lists as skipped
# without a device), then the suites that -march changes once more from a portable build.
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
bash scripts/build.sh
cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF -DKILN_WITH_CUDA=OFF \
  -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_TOOLS=OFF >/dev/null
nice -n 15 cmake --build build-portable -j"$(nproc)" --target "$portable_target" >build-portable/build.log 2>&1 &
portable_build=$!
status=0
ctest --test-dir build --output-on-failure -j"$(nproc)" || status=$?
if ! wait "$portable_build"; then
  cat build-portable/build.log
  echo "test.sh: the portable (KILN_NATIVE=OFF) build of the CPU suite failed" >&2
  exit 1
fi
echo "test.sh: $portable_target from the portable build (KILN_NATIVE=OFF)"
"build-portable/tests/$portable_target" || status=$?
exit "$status"
