// bench/policies_cuda — bench/policies on a CUDA device (skips with a message without one):
// step time per optimizer step under every precision × stance × accumulation, the device
// synchronised around each timed step.
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
  if (!kiln::cu::device_available()) {
    std::printf("{\"bench\": \"policies\", \"backend\": \"cuda\", \"skipped\": \"%s\"}\n",
                kiln::cu::device_unavailable_reason().c_str());
    return 0;
  }
  kiln_bench::all_policies<kiln::cuda>("cuda", steps, 0, [](kiln::CudaExecutor& e) { e.synchronize(); });
}
