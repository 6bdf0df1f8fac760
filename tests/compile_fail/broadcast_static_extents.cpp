// expect: static extents differ and neither is 1, so they cannot be broadcast together
// Adding a [dyn, 3] matrix to a length-4 row: the last static sizes (3 and 4) cannot broadcast.
#include <kiln.hpp>

int main() {
  kiln::Tensor<float, kiln::host, kiln::dyn, 3> x(2, 3);
  kiln::Tensor<float, kiln::host, 4> row;
  auto e = x + row;
  (void)e;
}
