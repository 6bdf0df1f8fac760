// expect: ag::map takes an elementwise expression
// A product inside ag::map has no elementwise derivative: use ag::matmul first.
#include "kiln.hpp"

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 2, 2> a;
  auto y = kiln::ag::map(tape, kiln::relu(kiln::matmul(a.value(), a.value())));
  (void)y;
}
