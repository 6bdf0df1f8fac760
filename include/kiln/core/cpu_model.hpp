// kiln/core/cpu_model.hpp — the CPU's model name, as the kernel reports it (kiln-doctor's host
// facts, the autotuner's cache fingerprint).
#pragma once

#include <fstream>
#include <string>

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

}  // namespace kiln
