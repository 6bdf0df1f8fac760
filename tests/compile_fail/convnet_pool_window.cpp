// expect: is smaller than the pooling window
// A 3x3 pooling window on a 2x2 image.
// Control: a 2x2 window.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<1, 2, 2>, nn::MaxPool2d<2>> model;
#else
  nn::Sequential<nn::Unflatten<1, 2, 2>, nn::MaxPool2d<3>> model;
#endif
  return int(model.parameter_count());
}
