// expect: is smaller than the kernel
// A 7x7 kernel on a 4x4 image without padding has no output.
// Control: the same kernel with padding 3 (a 4x4 output).
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<1, 4, 4>, nn::Conv2d<1, 2, 7, 1, 3>> model;
#else
  nn::Sequential<nn::Unflatten<1, 4, 4>, nn::Conv2d<1, 2, 7>> model;
#endif
  return int(model.parameter_count());
}
