// bench/mlp_step.hpp — what bench/train_step (CPU) and bench/train_step_cuda share: the model
// (MLP 400-256-128-10, ReLU), the median (timing.hpp), and the PyTorch side of the comparison
// (bench/torch_train_step.py, run through popen; its JSON lines are read back as
// batch -> torch_ms). Plain host C++: nvcc compiles it too.
#pragma once

#include <stdio.h>  // popen, pclose (POSIX)

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kiln/nn/activation.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/sequential.hpp"
#include "timing.hpp"

#ifndef KILN_SOURCE_DIR  // bench/CMakeLists.txt defines it; by hand, run from the repository root
#define KILN_SOURCE_DIR "."
#endif

namespace kiln_bench {

using Mlp = kiln::nn::Sequential<kiln::nn::Linear<400, 256>, kiln::nn::ReLU, kiln::nn::Linear<256, 128>,
                                 kiln::nn::ReLU, kiln::nn::Linear<128, 10>>;

// Runs `python bench/torch_train_step.py <args>` and returns batch -> torch_ms from its JSON
// lines; empty when the script cannot run or skips (torch, or torch's CUDA, not importable).
inline std::map<long, double> torch_train_steps(const std::string& python, const std::string& args) {
  std::map<long, double> out;
  const std::string cmd =
      python + " " + std::string(KILN_SOURCE_DIR) + "/bench/torch_train_step.py " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[1024];
  while (std::fgets(line, sizeof line, p)) {
    long batch = 0;
    double ms = 0;
    const char* b = std::strstr(line, "\"batch\":");
    const char* t = std::strstr(line, "\"torch_ms\":");
    if (b && t && std::sscanf(b, "\"batch\": %ld", &batch) == 1 && std::sscanf(t, "\"torch_ms\": %lf", &ms) == 1)
      out[batch] = ms;
  }
  pclose(p);
  return out;
}

}  // namespace kiln_bench
