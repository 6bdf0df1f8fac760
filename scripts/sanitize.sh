#!/usr/bin/env bash
# The whole CPU test suite, the sanitized reader suites and train_digits under AddressSanitizer +
# UndefinedBehaviorSanitizer (gcc; every report fatal). CI runs the reader suites and train_digits
# on every run (ctest: sanitized, train_digits_sanitized; -O0 -g1, as tests/CMakeLists.txt says
# why); this adds the rest of the CPU suite at -O1 -g, about 20 minutes on a 2-core machine.
#   scripts/sanitize.sh [build dir, default build-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-sanitize}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=OFF -DKILN_SANITIZE_TESTS=ON -DKILN_BUILD_BENCH=OFF \
  -DKILN_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$dir" -j"$(nproc)" --target kiln_tests_cpu kiln_tests_sanitized train_digits_sanitized
ctest --test-dir "$dir" --output-on-failure -R '^(cpu|sanitized|train_digits_sanitized)$'
