// expect: a layer follows a layer with a different number of outputs
// 32 channels of 5x5 flattened are 800 values, not a Linear<512, ...>'s 512; layer_accepts<Linear<512, 10>, sample<800>> names both.
// Control: Linear<800, 10>.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 32, 3, 1, 1>, nn::MaxPool2d<4>, nn::Flatten, nn::Linear<800, 10>> model;
#else
  nn::Sequential<nn::Unflatten<1, 20, 20>, nn::Conv2d<1, 32, 3, 1, 1>, nn::MaxPool2d<4>, nn::Flatten, nn::Linear<512, 10>> model;
#endif
  return int(model.parameter_count());
}
