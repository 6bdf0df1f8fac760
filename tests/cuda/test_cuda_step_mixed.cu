// kiln::train::Step on CUDA against the CPU: bf16_mixed and fp16_mixed (step_support.hpp).
#include "step_support.hpp"

using namespace kiln_cuda_step_test;

TEST_CASE("Step on CUDA trains as on the CPU, with the predicted launches: bf16_mixed and fp16_mixed, both stances") {
  SUBCASE("bf16_mixed") { compare<kiln::policy<kiln::precision::bf16_mixed, kiln::accumulate<2>>>(3e-2); }
  SUBCASE("fp16_mixed") { compare<kiln::policy<kiln::precision::fp16_mixed, kiln::accumulate<2>>>(5e-3); }
  SUBCASE("fp16_mixed force_eager") {
    compare<kiln::policy<kiln::precision::fp16_mixed, kiln::stance::force_eager, kiln::accumulate<2>>>(5e-3);
  }
}
