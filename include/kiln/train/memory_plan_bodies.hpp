// kiln/train/memory_plan_bodies.hpp — the bodies of memory_plan.hpp's functions: included by it
// when kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED,
// kiln/config.hpp).
#pragma once

#include "kiln/train/memory_plan.hpp"

namespace kiln::train {

KILN_COMPILED index_t MemoryPlan::largest_batch(std::size_t budget) const {
  if (per_sample == 0 || bytes_for(1) > budget) return 0;
  index_t lo = 1, hi = 2;  // bytes_for grows with the batch: double, then bisect
  while (bytes_for(hi) <= budget) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const index_t mid = lo + (hi - lo) / 2;
    (bytes_for(mid) <= budget ? lo : hi) = mid;
  }
  return lo;
}

KILN_COMPILED std::string MemoryPlan::str(index_t batch, std::size_t budget) const {
  auto mib = [](std::size_t b) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f MiB", double(b) / 1048576.0);
    return std::string(t);
  };
  std::string out = model.empty() || model.back() == '\n' ? model : model + "\n";
  out += "  parameters        " + mib(parameters) + "\n";
  out += "  gradients         " + mib(gradients) + "\n";
  out += "  optimizer state   " + mib(optimizer) + "\n";
  if (low_copies) out += "  low-precision     " + mib(low_copies) + " (weight copies)\n";
  out += "  activations       " + std::to_string(per_sample) + " bytes per sample, " +
         mib(std::size_t(batch) * per_sample) + " at batch " + std::to_string(batch) + "\n";
  out += "  GEMM workspace    " + mib(workspace(batch)) + " at batch " + std::to_string(batch) + "\n";
  out += "  total             " + mib(bytes_for(batch)) + " at batch " + std::to_string(batch) + "\n";
  if (budget > 0)
    out += "  largest batch     " + std::to_string(largest_batch(budget)) + " in a budget of " + mib(budget) + "\n";
  if (!modelled) out += "  (force_eager keeps a buffer per expression node: expect more than this)\n";
  return out;
}

KILN_COMPILED std::size_t host_memory_budget() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024 / 10 * 9;
  return 0;
}

}  // namespace kiln::train
