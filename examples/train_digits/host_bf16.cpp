// examples/train_digits/host_bf16.cpp — train_digits' CPU steps in bf16_mixed, every stance and mode.
#include "steps.hpp"

namespace train_digits {

HostStep make_host_step_bf16(const Options& o, ModelOn<kiln::host>& model, kiln::optim::AdamW<kiln::host>& opt,
                             kiln::CpuExecutor& exec, kiln::train::StepOptions options) {
  return kiln::train::make_precision_step<kiln::precision::bf16_mixed, kiln::train::every_combo,
                                          kiln::accumulate<kiln::dyn>>(o.stance, o.mode, model, opt, exec, {},
                                                                       std::move(options));
}

}  // namespace train_digits
