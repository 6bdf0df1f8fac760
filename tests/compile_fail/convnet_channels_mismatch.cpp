// expect: Conv2d: the input's channels differ from the layer's Cin
// A Conv2d<8, ...> after a 16-channel layer; conv_accepts<Conv2d<8, ...>, sample<16, 20, 20>> names both.
// Control: Conv2d<16, ...>.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 16, 3, 1, 1>, nn::ReLU, nn::Conv2d<16, 16, 3>> model;
#else
  nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 16, 3, 1, 1>, nn::ReLU, nn::Conv2d<8, 16, 3>> model;
#endif
  return int(model.parameter_count());
}
