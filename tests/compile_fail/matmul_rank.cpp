// expect: matmul takes two matrices \(rank 2\)
// A vector is not a matrix: matmul refuses rank-1 operands at compile time.
// Control: the vector as a [1 x 4] matrix.
#include "kiln/ops/matmul.hpp"

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, 1, 4> v;
#else
  kiln::Tensor<float, kiln::host, 4> v;
#endif
  kiln::Tensor<float, kiln::host, 4, 3> m;
  auto e = kiln::matmul(v, m);
  (void)e;
}
