// bench/mlp_step.hpp — what bench/train_step (CPU) and bench/train_step_cuda share: the model
// (MLP 400-256-128-10, ReLU), the median (timing.hpp), and running the peers (PyTorch, JAX:
// Python scripts under bench/ run through popen, whose JSON lines are read back; bench/fusion
// uses that part too). Plain host C++: nvcc compiles it too.
#pragma once

#include <stdio.h>   // popen, pclose (POSIX)
#include <unistd.h>  // access

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
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

// ---- peers: Python scripts run through popen, one JSON line per measurement on stdout ---------

// The interpreter for the peer scripts: the venv that scripts/bench.sh --with-peers makes
// (CPU torch, jax), when it exists; else Debian's python3 (its torch 1.13, no jax).
inline std::string default_python() {
  const std::string venv = std::string(KILN_SOURCE_DIR) + "/.venv-bench/bin/python";
  return access(venv.c_str(), X_OK) == 0 ? venv : "/usr/bin/python3";
}

// Runs `python <source>/bench/<script> <args>` and returns its stdout lines without the newline;
// its stderr goes to ours. Empty when it cannot start.
inline std::vector<std::string> peer_lines(const std::string& python, const std::string& script,
                                           const std::string& args) {
  std::vector<std::string> out;
  const std::string cmd = "'" + python + "' '" + std::string(KILN_SOURCE_DIR) + "/bench/" + script + "' " + args;
  std::fflush(stdout);  // what we printed so far comes before anything the child writes
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  std::string cur;
  char buf[1024];
  while (std::fgets(buf, sizeof buf, p)) {
    cur += buf;
    if (cur.back() != '\n') continue;  // a line longer than buf: keep reading it
    cur.pop_back();
    out.push_back(std::move(cur));
    cur.clear();
  }
  if (!cur.empty()) out.push_back(cur);
  pclose(p);
  return out;
}

// The value of "key" in a flat one-line JSON object (as json.dumps writes it): a string's
// characters without the quotes (escapes left as they are), or a number/true/false/null as
// written; "" when the key is absent.
inline std::string json_field(const std::string& line, const std::string& key) {
  std::size_t i = line.find("\"" + key + "\"");
  if (i == std::string::npos) return "";
  i = line.find_first_not_of(" :", i + key.size() + 2);
  if (i == std::string::npos) return "";
  if (line[i] == '"') {
    std::size_t j = i + 1;
    while (j < line.size() && line[j] != '"') j += line[j] == '\\' ? 2 : 1;
    return line.substr(i + 1, j - i - 1);
  }
  return line.substr(i, line.find_first_of(",}", i) - i);
}

}  // namespace kiln_bench
