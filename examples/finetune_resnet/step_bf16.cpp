// examples/finetune_resnet/step_bf16.cpp — finetune_resnet's bf16_mixed step: bf16 activations,
// float master weights and statistics (kiln/nn/half_io.hpp on the CPU).
#include "steps.hpp"

namespace finetune_resnet {

HostStep make_step_bf16(Model& model, Optimizer& opt, kiln::CpuExecutor& exec, kiln::train::StepOptions options) {
  using Combos = kiln::train::combos<kiln::train::combo<kiln::stance::fused, kiln::mode::default_>>;
  return kiln::train::make_precision_step<kiln::precision::bf16_mixed, Combos, kiln::accumulate<kiln::dyn>>(
      "fused", "default", model, opt, exec, {}, std::move(options));
}

}  // namespace finetune_resnet
