// expect: Dropout: the probability is a template argument, not a constructor argument
// The old spelling Dropout(0.3, seed): the probability would otherwise silently become the seed
// of a Dropout<0.5> (class template argument deduction picks the default P).
// Control: the new spelling Dropout<0.3>(seed).
#include <kiln/nn/dropout.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::nn::Dropout<0.3> layer(1234);
#else
  kiln::nn::Dropout layer(0.3, 1234);
#endif
  return int(layer.p());
}
