// expect: allocating cuda tensors needs #include <kiln/cuda.cuh>
// Constructing a cuda tensor from host-only code: memory_traits<cuda> lives in the CUDA headers.
#include <kiln.hpp>

int main() {
  kiln::Tensor<float, kiln::cuda, 4> t;
  (void)t;
}
