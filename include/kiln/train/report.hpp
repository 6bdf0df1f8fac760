// kiln/train/report.hpp — what one training step ran, and why each kernel is a kernel of its own.
//
//   step.record_next_step();                  // before the step to look at
//   ... train ...
//   std::printf("%s", kiln::train::report(step).str().c_str());
//
// The report holds the step's configuration (precision and what it means on this executor,
// stance, batch × accumulation = effective batch, loss scaling), the model as it runs
// (Sequential::describe: layers, fused pairs, mode), the kernels per optimizer step by kind
// against the count predicted at compile time, the bytes they move, and every distinct kernel
// with what it contains (its launch name lists the fused operations) and the boundary that ends
// it: a GEMM is a library call, a loss or a norm needs a whole row, and so on.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/core/space.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/policy/info.hpp"
#include "kiln/policy/policy.hpp"

namespace kiln::train {

struct ReportKernel {
  std::string name;  // the launch's name: what it contains ("gemm+bias+relu", "fused[mul,add]")
  std::string kind;
  double per_step = 0;
  std::string why;  // the fusion boundary that makes it a kernel of its own
};

struct Report {
  std::string model;
  std::string precision;
  std::string stance;
  index_t batch = 0;
  index_t accumulate = 1;
  bool loss_scaling = false;
  double kernels_per_step = 0;
  index_t predicted = 0;  // the compile-time count (-1: not known)
  std::map<std::string, double> by_kind;
  double bytes_per_step = 0;
  std::vector<ReportKernel> kernels;

  index_t effective_batch() const { return batch * accumulate; }

  // The report as lines of text; the second line is "fusion report: N kernels per training
  // step: ..." (the examples' closing line).
  std::string str() const {
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
};

namespace detail {
// Why a launch of this kind and name ends a fused region.
inline std::string boundary_reason(std::string_view kind_name, std::string_view name, bool eager) {
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

// The report of `step`'s last recorded optimizer step (Step::record_next_step()).
// Step: a train::Step or its StepBase (one instantiation for every policy).
template <class Step>
Report report(const Step& step) {
  const PolicyInfo& policy = step.policy();
  Report r;
  r.model = step.model().describe();
  r.precision = policy.precision;
  r.stance = policy.stance;
  r.batch = step.recorded_batch();
  r.accumulate = step.accumulation();
  r.loss_scaling = policy.scales_loss;
  r.predicted = step.predicted_launches();
  const auto& recs = step.recorded();
  r.kernels_per_step = double(recs.size());
  std::map<std::string, std::size_t> index;
  for (const auto& rec : recs) {
    r.by_kind[rec.kind] += 1;
    r.bytes_per_step += double(rec.bytes);
    const std::string name = rec.region.empty() ? rec.name : rec.region + ": " + rec.name;
    auto [it, fresh] = index.emplace(name, r.kernels.size());
    if (fresh)
      r.kernels.push_back({name, rec.kind, 0,
                           rec.region.empty() ? detail::boundary_reason(rec.kind, rec.name, policy.eager)
                                              : "inside " + rec.region + ", a user function kiln does not fuse across"});
    r.kernels[it->second].per_step += 1;
  }
  return r;
}

}  // namespace kiln::train
