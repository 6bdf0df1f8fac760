// bench/policies — the MLP's training step on the CPU under every precision × stance ×
// accumulation, then the three modes side by side (bench/policies.hpp), one JSON line each.
//
//   build/bench/policies [--steps 30] [--threads 1] [--only policies|modes]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "policies.hpp"

int main(int argc, char** argv) {
  int steps = 30, threads = 1;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--only") only = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: policies [--steps N] [--threads N] [--only policies|modes]\n");
      return 2;
    }
  }
  if (only.empty() || only == "policies")
    kiln_bench::all_policies<kiln::host>("cpu", steps, threads, [](kiln::CpuExecutor&) {});
  if (only.empty() || only == "modes") kiln_bench::all_modes<kiln::host>("cpu", steps, threads, [](kiln::CpuExecutor&) {});
}
