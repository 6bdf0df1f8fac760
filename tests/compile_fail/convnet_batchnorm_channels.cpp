// expect: BatchNorm2d<C>: the input's channels differ from C
// BatchNorm2d<32> after a 16-channel convolution.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
  nn::Sequential<nn::Unflatten<1, 8, 8>, nn::Conv2d<1, 16, 3>, nn::BatchNorm2d<32>> model;
  return int(model.parameter_count());
}
