// expect: under bf16_mixed / fp16_mixed every layer must run on half-precision activations
// Dropout does not run on bf16 activations yet: the step says so at compile time.
// Control: a ReLU (which runs on bf16) in Dropout's place, under the same bf16_mixed policy.
#include <kiln/train.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::ReLU, kiln::nn::Linear<8, 2>>;
#else
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::Dropout<0.1>, kiln::nn::Linear<8, 2>>;
#endif
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::precision::bf16_mixed>{});
  (void)step;
}
