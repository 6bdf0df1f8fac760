// expect: matmul\(a, b\) needs a's columns to equal b's rows
// [2 x 3] times [4 x 5]: the static inner sizes differ.
// Control: [2 x 3] times [3 x 5].
#include "kiln/ops/matmul.hpp"

int main() {
  kiln::Tensor<float, kiln::host, 2, 3> a;
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, 3, 5> b;
#else
  kiln::Tensor<float, kiln::host, 4, 5> b;
#endif
  auto e = kiln::matmul(a, b);
  (void)e;
}
