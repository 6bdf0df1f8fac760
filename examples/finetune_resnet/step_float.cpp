// examples/finetune_resnet/step_float.cpp — finetune_resnet's fp32 / tf32 step and its evaluation.
#include "kiln/train/evaluate.hpp"

#include "steps.hpp"

namespace finetune_resnet {

HostStep make_step_float(const std::string& precision, Model& model, Optimizer& opt, kiln::CpuExecutor& exec,
                         kiln::train::StepOptions options) {
  using Combos = kiln::train::combos<kiln::train::combo<kiln::stance::fused, kiln::mode::default_>>;
  if (precision == kiln::precision::tf32::name)
    return kiln::train::make_precision_step<kiln::precision::tf32, Combos, kiln::accumulate<kiln::dyn>>(
        "fused", "default", model, opt, exec, {}, std::move(options));
  return kiln::train::make_precision_step<kiln::precision::fp32, Combos, kiln::accumulate<kiln::dyn>>(
      "fused", "default", model, opt, exec, {}, std::move(options));
}

double accuracy(Model& model, kiln::CpuExecutor& exec, const kiln::data::Dataset& dataset) {
  return kiln::train::accuracy(model, exec, dataset, /*batch_size=*/32);
}

}  // namespace finetune_resnet
