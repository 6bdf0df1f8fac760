// expect: Sequential: a layer follows a layer with a different number of outputs
// A Linear<128, 10> after a 256-wide layer must not compile; the diagnostic names
// layer_accepts<Linear<128, 10>, sample<256>>, so both sizes are on screen.
// Control: Linear<256, 10>.
#include <kiln/nn/activation.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::nn::Sequential<kiln::nn::Linear<784, 256>, kiln::nn::ReLU, kiln::nn::Linear<256, 10>> model;
#else
  kiln::nn::Sequential<kiln::nn::Linear<784, 256>, kiln::nn::ReLU, kiln::nn::Linear<128, 10>> model;
#endif
  return int(model.parameter_count());
}
