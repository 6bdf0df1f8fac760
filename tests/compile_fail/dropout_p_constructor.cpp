// expect: Dropout: the probability is a template argument, not a constructor argument
// The old spelling Dropout(0.3, seed): the probability would otherwise silently become the seed
// of a Dropout<0.5> (class template argument deduction picks the default P).
#include <kiln/nn/dropout.hpp>

int main() {
  kiln::nn::Dropout layer(0.3, 1234);
  return int(layer.p());
}
