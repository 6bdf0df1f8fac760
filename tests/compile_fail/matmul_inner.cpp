// expect: matmul\(a, b\) needs a's columns to equal b's rows
// [2 x 3] times [4 x 5]: the static inner sizes differ.
#include "kiln/ops/matmul.hpp"

int main() {
  kiln::Tensor<float, kiln::host, 2, 3> a;
  kiln::Tensor<float, kiln::host, 4, 5> b;
  auto e = kiln::matmul(a, b);
  (void)e;
}
