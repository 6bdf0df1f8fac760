// expect: BatchNorm2d<C>: the input's channels differ from C
// BatchNorm2d<32> after a 16-channel convolution.
// Control: BatchNorm2d<16>.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<1, 8, 8>, nn::Conv2d<1, 16, 3>, nn::BatchNorm2d<16>> model;
#else
  nn::Sequential<nn::Unflatten<1, 8, 8>, nn::Conv2d<1, 16, 3>, nn::BatchNorm2d<32>> model;
#endif
  return int(model.parameter_count());
}
