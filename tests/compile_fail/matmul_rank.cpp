// expect: matmul takes two matrices \(rank 2\)
// A vector is not a matrix: matmul refuses rank-1 operands at compile time.
#include "kiln/ops/matmul.hpp"

int main() {
  kiln::Tensor<float, kiln::host, 4> v;
  kiln::Tensor<float, kiln::host, 4, 3> m;
  auto e = kiln::matmul(v, m);
  (void)e;
}
