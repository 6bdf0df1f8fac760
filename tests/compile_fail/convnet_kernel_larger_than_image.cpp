// expect: is smaller than the kernel
// A 7x7 kernel on a 4x4 image without padding has no output.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
  nn::Sequential<nn::Unflatten<1, 4, 4>, nn::Conv2d<1, 2, 7>> model;
  return int(model.parameter_count());
}
