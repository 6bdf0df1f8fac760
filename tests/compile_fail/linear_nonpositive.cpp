// expect: Linear<In, Out>: In must be positive, Out positive or dyn
// Control: Linear<4, 10>.
#include <kiln/nn/linear.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::nn::Linear<4, 10> layer;
#else
  kiln::nn::Linear<0, 10> layer;
#endif
  return int(layer.weight().value().size());
}
