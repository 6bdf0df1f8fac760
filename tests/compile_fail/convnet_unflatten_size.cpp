// expect: the previous layer's outputs are not C\*H\*W values
// Unflatten<1, 20, 20> needs 400 values per row, the Linear before it makes 300.
#include <kiln/train.hpp>

namespace nn = kiln::nn;

int main() {
  nn::Sequential<nn::Linear<10, 300>, nn::Unflatten<1, 20, 20>> model;
  return int(model.parameter_count());
}
