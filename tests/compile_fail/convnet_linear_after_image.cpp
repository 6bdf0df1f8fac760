// expect: put nn::Flatten between them
// A Linear straight after an image-shaped output needs Flatten first.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
  nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 2, 3>, nn::Linear<648, 10>> model;
  return int(model.parameter_count());
}
