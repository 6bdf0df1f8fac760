// expect: Dropout<P>: the drop probability P must be in
// A drop probability outside [0, 1] in the type is rejected where the model is defined.
// Control: Dropout<0.5>.
#include <kiln/nn/dropout.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::nn::Dropout<0.5> layer;
#else
  kiln::nn::Dropout<1.5> layer;
#endif
  return int(layer.p());
}
