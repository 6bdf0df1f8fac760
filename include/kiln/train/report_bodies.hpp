// kiln/train/report_bodies.hpp — the bodies of report.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/train/report.hpp"

namespace kiln::train {

KILN_COMPILED std::string Report::str() const {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "report: %s, stance %s, batch %lld x accumulate %lld = effective batch %lld, loss scaling %s\n",
                precision.c_str(), stance.c_str(), (long long)batch, (long long)accumulate,
                (long long)effective_batch(), loss_scaling ? "dynamic" : "off");
  out += line;
  std::snprintf(line, sizeof line, "fusion report: %.1f kernels per training step:", kernels_per_step);
  out += line;
  for (const auto& [k, n] : by_kind) {
    std::snprintf(line, sizeof line, " %.1f %s", n, k.c_str());
    out += line;
  }
  if (predicted >= 0)
    std::snprintf(line, sizeof line, " (%lld predicted at compile time); %.2f MB moved\n", (long long)predicted,
                  bytes_per_step / 1e6);
  else
    std::snprintf(line, sizeof line, " (not known at compile time: a layer does not say); %.2f MB moved\n",
                  bytes_per_step / 1e6);
  out += line;
  out += "  model: " + model + "\n";
  std::size_t width = 6;
  for (const auto& k : kernels) width = std::max(width, k.name.size());
  std::snprintf(line, sizeof line, "  %-*s  per step  why it is a kernel of its own\n", int(width), "kernel");
  out += line;
  for (const auto& k : kernels) {
    std::snprintf(line, sizeof line, "  %-*s  %8.1f  %s\n", int(width), k.name.c_str(), k.per_step, k.why.c_str());
    out += line;
  }
  return out;
}

namespace detail {

KILN_COMPILED std::string boundary_reason(std::string_view kind_name, std::string_view name, bool eager) {
  const std::string_view k = kind_name;
  // Launches kiln adds for a policy, named for what they are for.
  if (name == "round_input")
    return "the batch rounded once to the low type: the first GEMM reads low-precision operands";
  if (name == "round_weight")
    return "a low-precision copy of an fp32 master weight, refreshed after each optimizer step";
  if (name == "unscale_check")
    return "gradients unscaled and checked for inf/NaN in one pass, before the optimizer may use them";
  if (name == "scaler_update")
    return "the loss scale grows or backs off on the device, after the optimizer (no host synchronisation)";
  if (k == kind::gemm) {
    if (name.find('+') != std::string_view::npos)
      return "a GEMM is a library call; the elementwise work named after it rides its epilogue";
    return eager ? "a GEMM is a library call (force_eager: no epilogue)"
                 : "a GEMM is a library call; nothing elementwise was left to ride it";
  }
  if (k == kind::loss) return "the loss reduces each row (log-sum-exp over the classes) and then the batch";
  if (k == kind::norm) return "a row's statistics (max, sum, mean, variance) need the whole row first";
  if (k == kind::reduce) return "a reduction (here a bias gradient's column sums) ends an elementwise chain";
  if (k == kind::optimizer)
    return eager ? "force_eager: one tensor at a time, node by node"
                 : "ONE multi-tensor kernel updates every parameter; nothing else runs between backward and it";
  if (k == kind::copy) return "a copy between buffers (the labels kept for backward, a flatten)";
  if (k == kind::elementwise) {
    if (name == "seed") return "backward's seed, d(loss)/d(loss) (times the loss scale): it starts the backward";
    return eager ? "force_eager: every expression node is its own kernel"
                 : "a fused elementwise chain, bounded by the ops around it";
  }
  return "a kernel of its own";
}

}  // namespace detail

}  // namespace kiln::train
