// kiln/doctor/host.hpp — the host facts that decide how fast kiln's CPU backend runs: the CPU,
// the vector extensions this build targets against those the CPU has (a build for AVX-512 on a
// CPU without it dies of SIGILL; one without it on a CPU that has it runs at half speed), which
// GEMM microkernel was compiled in, threads and OpenMP; and a GEMM on the CPU checked against a
// plain loop.
#pragma once

#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/config.hpp"
#include "kiln/core/cpu_model.hpp"
#include "kiln/doctor/report.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kiln::doctor {

namespace detail {

inline const char* gemm_microkernel() {
#if KILN_GEMM_AVX512
  return "AVX-512 fp32 12x32 tile";
#elif KILN_GEMM_AVX2
  return "AVX2/FMA fp32 6x16 tile";
#else
  return "portable fp32 (no AVX2 in the target: build with -march=native)";
#endif
}

}  // namespace detail

// The host section of the report; `cpu_ok` says whether the CPU can run this build at all.
inline Section examine_host(bool& cpu_ok) {
  Section s{"host"};
  s.fact("kiln", std::to_string(version_major) + "." + std::to_string(version_minor) + "." +
                     std::to_string(version_patch));
  s.fact("cpu", kiln::cpu_model());
  std::string targeted, missing, unused;
  cpu_ok = true;
  for (const auto& e : kiln::cpu_extensions()) {
    if (e.targeted) targeted += std::string(targeted.empty() ? "" : " ") + e.name;
    if (e.targeted && !e.present) {
      missing += std::string(missing.empty() ? "" : " ") + e.name;
      cpu_ok = false;
    }
    if (!e.targeted && e.present) unused += std::string(unused.empty() ? "" : " ") + e.name;
  }
  s.fact("build targets", targeted.empty() ? "baseline x86-64 (no vector extensions beyond SSE2)" : targeted);
  if (!missing.empty()) s.fact("MISSING on this CPU", missing + " (this build will die of SIGILL: rebuild here)");
  if (!unused.empty()) s.fact("CPU has, build unused", unused + " (rebuild with -march=native, KILN_NATIVE=ON)");
  s.fact("GEMM microkernel", detail::gemm_microkernel());
#if KILN_GEMM_BF16_NATIVE
  s.fact("bf16 GEMM", "AVX512-BF16 vdpbf16ps");
#else
  s.fact("bf16 GEMM", "emulated in fp32 (the target has no AVX512-BF16)");
#endif
  s.fact("hardware threads", std::to_string(std::thread::hardware_concurrency()));
#if defined(_OPENMP)
  s.fact("OpenMP", "yes, " + std::to_string(omp_get_max_threads()) + " threads by default (OMP_NUM_THREADS)");
#else
  s.fact("OpenMP", "no (kiln's CPU executor uses its own threads)");
#endif
  s.fact("CBLAS", cpu::gemm_have_cblas ? "built in (cpu::set_gemm_backend(gemm_backend::cblas))" : "not built in");

  // kiln's own GEMM against a plain triple loop, on small integers (exact in fp32).
  const index_t m = 37, n = 29, k = 53;
  std::vector<float> a(std::size_t(m * k)), b(std::size_t(k * n)), c(std::size_t(m * n)), ref(std::size_t(m * n));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 11) - 5);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 13) - 6);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double acc = 0;
      for (index_t p = 0; p < k; ++p) acc += double(a[std::size_t(i * k + p)]) * double(b[std::size_t(p * n + j)]);
      ref[std::size_t(i * n + j)] = float(acc);
    }
  cpu::gemm_own(cpu::trans::no, cpu::trans::no, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n, 1);
  index_t wrong = 0;
  for (std::size_t i = 0; i < c.size(); ++i) wrong += c[i] != ref[i];
  s.check("CPU GEMM 37x29x53", wrong == 0,
          wrong == 0 ? "equals the reference loop exactly" : std::to_string(wrong) + " of " + std::to_string(c.size()) +
                                                              " values differ from the reference loop");
  return s;
}

}  // namespace kiln::doctor
