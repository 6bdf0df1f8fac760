// expect: Sequential: an activation layer \(is_activation = true\) must name its function
// A layer that calls itself an activation but says neither its functor nor how to apply itself.
// Control: the layer names its functor.
#include <kiln/nn/activation.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>

struct Vague {
  static constexpr bool is_activation = true;
#ifdef KILN_COMPILE_FAIL_CONTROL
  using functor = kiln::fn::Relu;
#endif
};

int main() {
  kiln::nn::Sequential<kiln::nn::Linear<4, 8>, Vague, kiln::nn::Linear<8, 2>> model;
  return int(model.parameter_count());
}
