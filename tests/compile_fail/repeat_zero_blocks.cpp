// expect: Repeat<N, Block>: N must be at least 1
// Control: one block.
#include <kiln/nn/repeat.hpp>
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Repeat<1, nn::Sequential<nn::Linear<4, 4>, nn::ReLU>>> model;
#else
  nn::Sequential<nn::Repeat<0, nn::Sequential<nn::Linear<4, 4>, nn::ReLU>>> model;
#endif
  return int(model.parameter_count());
}
