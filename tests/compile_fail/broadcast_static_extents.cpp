// expect: static extents differ and neither is 1, so they cannot be broadcast together
// Adding a [dyn, 3] matrix to a length-4 row: the last static sizes (3 and 4) cannot broadcast.
// Control: a length-3 row, which broadcasts.
#include <kiln.hpp>

int main() {
  kiln::Tensor<float, kiln::host, kiln::dyn, 3> x(2, 3);
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, 3> row;
#else
  kiln::Tensor<float, kiln::host, 4> row;
#endif
  auto e = x + row;
  (void)e;
}
