// expect: put nn::Flatten between them
// A Linear straight after an image-shaped output needs Flatten first.
// Control: nn::Flatten between them (2 channels of 18x18 are 648 values).
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 2, 3>, nn::Flatten, nn::Linear<648, 10>> model;
#else
  nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 2, 3>, nn::Linear<648, 10>> model;
#endif
  return int(model.parameter_count());
}
