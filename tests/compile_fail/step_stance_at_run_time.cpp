// expect: a policy with stance::at_run_time or mode::at_run_time takes its stance and mode as values
// A step whose stance is left to run time must be told it (select_step / make_precision_step pass a
// PolicyInfo); the policy alone names no stance.
// Control: the same step made by make_precision_step, which gives the stance and mode as values.
#include <kiln/train.hpp>
#include <kiln/train/select_step.hpp>

int main() {
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::ReLU, kiln::nn::Linear<8, 2>>;
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
#ifdef KILN_COMPILE_FAIL_CONTROL
  using both = kiln::train::combos<kiln::train::combo<kiln::stance::fused, kiln::mode::default_>,
                                   kiln::train::combo<kiln::stance::force_eager, kiln::mode::default_>>;
  auto step = kiln::train::make_precision_step<kiln::precision::fp32, both>("force_eager", "default", model, opt, exec);
#else
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::stance::at_run_time>{});
#endif
  (void)step;
}
