// expect: kiln::cpu::gemm multiplies float, double, kiln::f16 or kiln::bf16 matrices
// An integer GEMM: the message lists the element types kiln multiplies.
// Control: the same GEMM on float matrices.
#include <kiln/backend/cpu/gemm.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  float a[4] = {}, b[4] = {};
  float c[4] = {};
  kiln::cpu::gemm<float>(kiln::cpu::trans::no, kiln::cpu::trans::no, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
#else
  int a[4] = {}, b[4] = {};
  float c[4] = {};
  kiln::cpu::gemm<int>(kiln::cpu::trans::no, kiln::cpu::trans::no, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
#endif
}
