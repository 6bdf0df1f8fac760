// expect: ag::map takes an elementwise expression
// A product inside ag::map has no elementwise derivative: use ag::matmul first.
// Control: an elementwise product (a * a) instead of the matrix product.
#include "kiln.hpp"

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 2, 2> a;
#ifdef KILN_COMPILE_FAIL_CONTROL
  auto y = kiln::ag::map(tape, kiln::relu(a * a));
#else
  auto y = kiln::ag::map(tape, kiln::relu(kiln::matmul(a.value(), a.value())));
#endif
  (void)y;
}
