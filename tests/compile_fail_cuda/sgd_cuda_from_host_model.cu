// expect: the model's parameters live in another memory space
// optim::SGD<kiln::cuda> built from a model whose parameters are on the host.
// Control: from the same model on kiln::cuda.
#include <kiln/train.cuh>

using Mlp = kiln::nn::Sequential<kiln::nn::Linear<4, 3>>;

#ifdef KILN_COMPILE_FAIL_CONTROL
using Model = Mlp::on<kiln::cuda>;
#else
using Model = Mlp::on<kiln::host>;
#endif

void make(const Model& model) {
  kiln::optim::SGD<kiln::cuda> opt(model, {.lr = 0.1});
  (void)opt;
}

int main() {}
