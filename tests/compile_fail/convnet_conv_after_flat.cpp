// expect: Conv2d: the input must be an image
// A Conv2d after flat rows (a Linear's output) needs Unflatten first.
// Control: Unflatten<1, 20, 20> between them.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Linear<10, 400>, nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 2, 3>> model;
#else
  nn::Sequential<nn::Linear<10, 400>, nn::Conv2d<1, 2, 3>> model;
#endif
  return int(model.parameter_count());
}
