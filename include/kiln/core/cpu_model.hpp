// kiln/core/cpu_model.hpp — the CPU's model name, as the kernel reports it, and the vector
// extensions this build targets against those the CPU has (kiln-doctor's host facts, the
// autotuner's cache fingerprint).
#pragma once

#include <fstream>
#include <string>
#include <vector>

namespace kiln {

// /proc/cpuinfo's "model name"; a sentence saying so where there is none.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      const auto start = colon == std::string::npos ? colon : line.find_first_not_of(' ', colon + 1);
      if (start != std::string::npos) return line.substr(start);
    }
  }
  return "unknown (no /proc/cpuinfo model name)";
}

struct CpuExtension {
  const char* name;
  bool targeted;  // the compiler generated code that uses it
  bool present;   // the CPU running this has it
};

// The x86 extensions that decide kiln's CPU kernels, in order; none on other architectures.
inline std::vector<CpuExtension> cpu_extensions() {
  std::vector<CpuExtension> out;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  auto add = [&](const char* name, bool targeted, bool present) { out.push_back({name, targeted, present}); };
#if defined(__SSE4_2__)
  add("sse4.2", true, __builtin_cpu_supports("sse4.2"));
#else
  add("sse4.2", false, __builtin_cpu_supports("sse4.2"));
#endif
#if defined(__AVX2__)
  add("avx2", true, __builtin_cpu_supports("avx2"));
#else
  add("avx2", false, __builtin_cpu_supports("avx2"));
#endif
#if defined(__FMA__)
  add("fma", true, __builtin_cpu_supports("fma"));
#else
  add("fma", false, __builtin_cpu_supports("fma"));
#endif
#if defined(__AVX512F__)
  add("avx512f", true, __builtin_cpu_supports("avx512f"));
#else
  add("avx512f", false, __builtin_cpu_supports("avx512f"));
#endif
#if defined(__AVX512BF16__)
  add("avx512bf16", true, __builtin_cpu_supports("avx512bf16"));
#else
  add("avx512bf16", false, __builtin_cpu_supports("avx512bf16"));
#endif
#endif
  return out;
}

// The targeted ones, space-separated ("baseline" when none).
inline std::string targeted_extensions() {
  std::string out;
  for (const CpuExtension& e : cpu_extensions())
    if (e.targeted) out += std::string(out.empty() ? "" : " ") + e.name;
  return out.empty() ? "baseline" : out;
}

}  // namespace kiln
