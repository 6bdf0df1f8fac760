// expect: applied at every position of a sequence takes a different width
// A layer applied at every position of a sequence must take the width the previous layer gives:
// the embedding gives 32 features per position, a LayerNorm<48> after it is named with both sizes.
// Control: LayerNorm<32>.
#include <kiln/nn/embedding.hpp>
#include <kiln/nn/layernorm.hpp>
#include <kiln/nn/sequential.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Norm = kiln::nn::LayerNorm<32>;
#else
  using Norm = kiln::nn::LayerNorm<48>;
#endif
  kiln::nn::Sequential<kiln::nn::Embedding<65, 32>, kiln::nn::PositionEmbedding<16, 32>, Norm> model;
  (void)model;
}
