// expect: the repeated block changes its input's shape, so it cannot follow itself
// A block that halves the image cannot be repeated (its second copy would get another shape than
// the first): it must be Repeat's First. (A block that changes the channels is refused by its own
// first layer, which names both channel counts.)
// Control: the halving block as First, a block that keeps the shape repeated after it.
#include <kiln/nn/repeat.hpp>
#include <kiln/train.hpp>

namespace nn = kiln::nn;
using Halve = nn::Sequential<nn::Conv2d<8, 8, 3, 1, 1>, nn::ReLU, nn::MaxPool2d<2>>;
using Keep = nn::Sequential<nn::Conv2d<8, 8, 3, 1, 1>, nn::ReLU>;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<8, 8, 8>, nn::Repeat<3, Keep, Halve>> model;
#else
  nn::Sequential<nn::Unflatten<8, 8, 8>, nn::Repeat<3, Halve>> model;
#endif
  return int(model.parameter_count());
}
