// expect: kiln::train::Step: the fourth argument is a policy bag
// A lone tag where the policy bag goes.
// Control: the tag inside a policy bag.
#include <kiln/train.hpp>

int main() {
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 2>>;
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::precision::bf16_mixed>{});
#else
  kiln::train::Step step(model, opt, exec, kiln::precision::bf16_mixed{});
#endif
  (void)step;
}
