// expect: under bf16_mixed / fp16_mixed every layer must run on half-precision activations
// LayerNorm does not run on bf16 activations yet: the step says so at compile time.
#include <kiln/train.hpp>

int main() {
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::LayerNorm<8>, kiln::nn::Linear<8, 2>>;
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::precision::bf16_mixed>{});
  (void)step;
}
