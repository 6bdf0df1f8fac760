// expect: Conv2d: the input must be an image
// A Conv2d after flat rows (a Linear's output) needs Unflatten first.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
  nn::Sequential<nn::Linear<10, 400>, nn::Conv2d<1, 2, 3>> model;
  return int(model.parameter_count());
}
