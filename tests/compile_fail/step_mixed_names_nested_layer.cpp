// expect: layer_runs_in_half_precision<kiln::nn::Dropout<
// Under bf16_mixed the step names the layer that has no half-precision path, even deep inside a
// named Residual block; convolutions, batch norm and pooling around it do run in bf16.
// Control: a ReLU in Dropout's place.
#include <kiln/nn/named.hpp>
#include <kiln/train.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Odd = kiln::nn::ReLU;
#else
  using Odd = kiln::nn::Dropout<0.1>;
#endif
  using Block = kiln::nn::Residual<kiln::nn::Sequential<kiln::nn::Linear<8, 8>, Odd, kiln::nn::Linear<8, 8>>, void,
                                   kiln::nn::ReLU>;
  using Model = kiln::nn::Sequential<kiln::nn::Unflatten<2, 4, 4>, kiln::nn::Conv2d<2, 4, 3, 1, 1>,
                                     kiln::nn::BatchNorm2d<4>, kiln::nn::ReLU, kiln::nn::MaxPool2d<2>,
                                     kiln::nn::Flatten, kiln::nn::Linear<16, 8>, kiln::nn::Named<"block", Block>,
                                     kiln::nn::Linear<8, 2>>;
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::precision::bf16_mixed>{});
  (void)step;
}
