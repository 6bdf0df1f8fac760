// expect: is smaller than the pooling window
// A 3x3 pooling window on a 2x2 image.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
  nn::Sequential<nn::Unflatten<1, 2, 2>, nn::MaxPool2d<3>> model;
  return int(model.parameter_count());
}
