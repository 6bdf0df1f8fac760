// examples/train_digits/host_float.cpp — train_digits' CPU steps in fp32 and tf32 (one model code
// serves both: their activations are float), every stance and mode, and the model's accuracy.
#include "kiln/train/evaluate.hpp"

#include "steps.hpp"

namespace train_digits {

HostStep make_host_step_float(const Options& o, ModelOn<kiln::host>& model, kiln::optim::AdamW<kiln::host>& opt,
                              kiln::CpuExecutor& exec, kiln::train::StepOptions options) {
  using kiln::train::every_combo;
  if (o.precision == kiln::precision::tf32::name)
    return kiln::train::make_precision_step<kiln::precision::tf32, every_combo, kiln::accumulate<kiln::dyn>>(
        o.stance, o.mode, model, opt, exec, {}, std::move(options));
  return kiln::train::make_precision_step<kiln::precision::fp32, every_combo, kiln::accumulate<kiln::dyn>>(
      o.stance, o.mode, model, opt, exec, {}, std::move(options));
}

double host_accuracy(ModelOn<kiln::host>& model, kiln::CpuExecutor& exec, const kiln::data::Dataset& dataset) {
  return kiln::train::accuracy(model, exec, dataset);
}

}  // namespace train_digits
