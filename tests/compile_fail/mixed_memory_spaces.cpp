// expect: a host tensor and a cuda tensor meet in one expression
// One host and one cuda operand in one expression. Views name the cuda space without allocating.
// Control: both operands in host memory.
#include <kiln.hpp>

int main() {
  kiln::View<const float, kiln::host, kiln::extents<4>> h;
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::View<const float, kiln::host, kiln::extents<4>> d;
#else
  kiln::View<const float, kiln::cuda, kiln::extents<4>> d;
#endif
  auto e = h * 2.0f + d;
  (void)e;
}
