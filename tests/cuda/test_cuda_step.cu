// kiln::train::Step on CUDA against the CPU: fp32 and tf32, both stances (step_support.hpp).
#include "step_support.hpp"

using namespace kiln_cuda_step_test;

TEST_CASE("Step on CUDA trains as on the CPU, with the predicted launches: fp32 and tf32, both stances") {
  SUBCASE("fp32") { compare<kiln::policy<kiln::accumulate<2>>>(2e-4); }
  SUBCASE("tf32") { compare<kiln::policy<kiln::precision::tf32, kiln::accumulate<2>>>(2e-2); }
  SUBCASE("fp32 force_eager") { compare<kiln::policy<kiln::stance::force_eager, kiln::accumulate<2>>>(2e-4); }
}

