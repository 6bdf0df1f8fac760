// bench/policies_cuda — bench/policies on a CUDA device (without one: a skip line and exit 0, or
// exit 2 when KILN_REQUIRE_DEVICE is set):
// step time per optimizer step under every precision × stance × accumulation, then the three
// modes side by side, the device synchronised around each timed step.
//
//   build/bench/policies_cuda [--steps 50]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/train.cuh"
#include "policies.hpp"

int main(int argc, char** argv) {
  int steps = 50;
  if (argc == 3 && std::string(argv[1]) == "--steps") steps = std::atoi(argv[2]);
  if (!kiln::cu::device_available()) return kiln::cu::report_no_device("policies_cuda");
  kiln_bench::all_policies<kiln::cuda>("cuda", steps, 0, [](kiln::CudaExecutor& e) { e.synchronize(); });
  kiln_bench::all_modes<kiln::cuda>("cuda", steps, 0, [](kiln::CudaExecutor& e) { e.synchronize(); });
}
