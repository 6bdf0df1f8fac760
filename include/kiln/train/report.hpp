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

#include "kiln/config.hpp"
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
  KILN_COMPILED std::string str() const;
};

namespace detail {
// Why a launch of this kind and name ends a fused region.
KILN_COMPILED std::string boundary_reason(std::string_view kind_name, std::string_view name, bool eager);
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

#if KILN_HEADER_BODIES
#include "kiln/train/report_bodies.hpp"
#endif
