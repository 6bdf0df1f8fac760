// expect: so its width must be a multiple of 3
// Causal attention reads q, k and v packed side by side ([B, T, 3D]): a QKV projection of width 96
// cannot be split into 5 heads. Control: 4 heads.
#include <kiln/nn/attention.hpp>
#include <kiln/nn/embedding.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  constexpr kiln::index_t heads = 4;
#else
  constexpr kiln::index_t heads = 5;
#endif
  kiln::nn::Sequential<kiln::nn::Embedding<65, 32>, kiln::nn::Linear<32, 96>, kiln::nn::CausalAttention<heads>> model;
  (void)model;
}
