// kiln/doctor/examine.hpp — kiln-doctor as a library call: kiln::doctor::examine() returns the
// report (doctor/report.hpp) of the host and, in a translation unit nvcc compiles with the CUDA
// backend, of the CUDA driver, runtime, libraries and devices (doctor/cuda.cuh).
//
//   const auto report = kiln::doctor::examine();
//   std::fputs(report.str().c_str(), stdout);   // facts, checks, "verdict: training will run on ..."
#pragma once

#include "kiln/config.hpp"
#include "kiln/doctor/host.hpp"

#if KILN_CUDA_COMPILER
#include "kiln/doctor/cuda.cuh"
#else
namespace kiln::doctor {
// A build without nvcc: the host, and why there is no GPU path.
inline Report examine() {
  Report r;
  bool cpu_ok = true;
  r.sections.push_back(examine_host(cpu_ok));
  r.verdict = cpu_ok ? "training will run on the CPU: this build has no CUDA backend (it was compiled without nvcc; "
                       "configure where nvcc is on PATH, or under /usr/local/cuda)"
                     : "this build cannot run on this CPU (it targets extensions the CPU lacks): rebuild here";
  return r;
}
}  // namespace kiln::doctor
#endif
