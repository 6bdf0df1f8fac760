// expect: an extent must be a non-negative size or kiln::dyn
// A negative static size (kiln::dyn is -1; -2 is nothing).
// Control: the size 2.
#include <kiln.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, 2, 4> t;
#else
  kiln::Tensor<float, kiln::host, -2, 4> t;
#endif
  (void)t;
}
