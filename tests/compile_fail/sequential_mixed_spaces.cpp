// expect: Sequential: the layers keep their parameters in different memory spaces
// A host Linear and a cuda Linear in one model: use Sequential<...>::on<Space> to put them all in
// one. Naming the model's sizes instantiates it (constructing the cuda layer would need the CUDA
// headers).
// Control: both Linears on the host.
#include <kiln/nn/activation.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>

namespace nn = kiln::nn;

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Model = nn::Sequential<nn::Linear<4, 8>, nn::ReLU, nn::Linear<8, 2, true, float, kiln::host>>;
#else
  using Model = nn::Sequential<nn::Linear<4, 8>, nn::ReLU, nn::Linear<8, 2, true, float, kiln::cuda>>;
#endif
  return int(Model::out_features);
}
