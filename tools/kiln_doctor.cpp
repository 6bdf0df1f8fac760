// kiln-doctor — is training really going to run on the GPU, and if not, why not. Prints the host
// facts (CPU, vector extensions built for and present, GEMM kernel, threads, OpenMP), the CUDA
// driver and runtime versions, each device and whether this build has code for it, the
// libraries found at run time (cuBLASLt, cuDNN, NCCL), checks on the device against the CPU
// backend, and one verdict line. The same report is kiln::doctor::examine() (kiln/doctor/examine.hpp).
//
//   kiln-doctor                # exit 0 unless a check failed
//   kiln-doctor --expect-gpu   # exit 1 too when no GPU is usable (CI on a GPU machine)
#include <cstdio>
#include <cstring>
#include <exception>

#include "kiln/doctor/examine.hpp"

int main(int argc, char** argv) try {
  bool expect_gpu = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--expect-gpu") == 0) {
      expect_gpu = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::puts("usage: kiln-doctor [--expect-gpu]\nReports where kiln will train on this machine and why; exit 1 "
                "when a check fails, or with --expect-gpu when no GPU is usable.");
      return 0;
    } else {
      std::fprintf(stderr, "kiln-doctor: unknown option \"%s\" (see --help)\n", argv[i]);
      return 2;
    }
  }
  const kiln::doctor::Report report = kiln::doctor::examine();
  std::fputs(report.str().c_str(), stdout);
  if (!report.all_checks_passed()) return 1;
  if (expect_gpu && !report.gpu_usable) {
    std::fprintf(stderr, "kiln-doctor: --expect-gpu, but no GPU is usable: %s\n", report.verdict.c_str());
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kiln-doctor: %s\n", e.what());
  return 1;
}
