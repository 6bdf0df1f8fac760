// expect: Linear<In, Out>: both sizes must be positive
#include <kiln/nn/linear.hpp>

int main() {
  kiln::nn::Linear<0, 10> layer;
  return int(layer.weight().value().size());
}
