// expect: kiln tensors have rank 0 to 4
// A rank-5 tensor type.
// Control: a rank-4 tensor type.
#include <kiln.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, 2, 2, 2, 2> t;
#else
  kiln::Tensor<float, kiln::host, 2, 2, 2, 2, 2> t;
#endif
  (void)t;
}
