// expect: the previous layer's outputs are not C\*H\*W values
// Unflatten<1, 20, 20> needs 400 values per row, the Linear before it makes 300.
// Control: the Linear makes 400.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  nn::Sequential<nn::Linear<10, 400>, nn::Unflatten<1, 20, 20>> model;
#else
  nn::Sequential<nn::Linear<10, 300>, nn::Unflatten<1, 20, 20>> model;
#endif
  return int(model.parameter_count());
}
