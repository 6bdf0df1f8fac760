// expect: kiln::train::Step: the fourth argument is a policy bag
// A lone tag where the policy bag goes.
#include <kiln/train.hpp>

int main() {
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 2>>;
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
  kiln::train::Step step(model, opt, exec, kiln::precision::bf16_mixed{});
  (void)step;
}
