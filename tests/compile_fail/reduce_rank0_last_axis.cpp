// expect: reducing over the last axis needs an operand of rank >= 1
// A rank-0 tensor has no last axis to reduce.
// Control: a rank-1 tensor.
#include <kiln.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, 4> s;
#else
  kiln::Tensor<float, kiln::host> s;
#endif
  auto r = kiln::sum<kiln::reduce_over::last_axis>(s);
  (void)r;
}
