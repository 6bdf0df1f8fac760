// expect: Dropout<P>: the drop probability P must be in
// A drop probability outside [0, 1] in the type is rejected where the model is defined.
#include <kiln/nn/dropout.hpp>

int main() {
  kiln::nn::Dropout<1.5> layer;
  return int(layer.p());
}
