// expect: the body's output and the shortcut's differ in shape
// A residual body that changes the channels needs a projection shortcut.
// Control: a body that keeps the 8 channels.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<8, 6, 6>, nn::Residual<nn::Sequential<nn::Conv2d<8, 8, 3, 1, 1>>>> model;
#else
  nn::Sequential<nn::Unflatten<8, 6, 6>, nn::Residual<nn::Sequential<nn::Conv2d<8, 16, 3, 1, 1>>>> model;
#endif
  return int(model.parameter_count());
}
