// bench/bench_policy.hpp — the policy a benchmark program runs: fp32, or bf16_mixed in the
// programs built with KILN_BENCH_BF16_MIXED (bench_resnet50_step_bf16, bench_convnet_bf16: one
// policy per program, so each keeps one program's compile time).
#pragma once

#include "kiln/policy/policy.hpp"

namespace kiln_bench {
#if defined(KILN_BENCH_BF16_MIXED)
using Policy = kiln::policy<kiln::precision::bf16_mixed>;
#else
using Policy = kiln::policy<>;
#endif
inline const char* const precision = Policy::precision::name;
}  // namespace kiln_bench
