// The doctest runner for every CUDA suite in this folder.
//
// Without a usable device (no GPU, or a driver older than the runtime) it prints one line saying
// why and exits 77, which ctest reports as "Skipped" (the test's SKIP_RETURN_CODE): the CUDA tests
// are built wherever nvcc exists, and a machine without a GPU is not a failure — but not a pass
// either. KILN_REQUIRE_DEVICE=1 asks for a device (the GPU check script): then it exits 2. With a
// device, doctest runs normally (command-line options included).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "kiln/backend/cuda/device.cuh"

int main(int argc, char** argv) {
  constexpr int skipped = 77;  // tests/CMakeLists.txt: SKIP_RETURN_CODE
  if (!kiln::cu::device_available()) return kiln::cu::report_no_device("kiln CUDA tests") == 0 ? skipped : 2;
  std::printf("kiln CUDA tests: running on %s\n", kiln::cu::device_name().c_str());
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}
