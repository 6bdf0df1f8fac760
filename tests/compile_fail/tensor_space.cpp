// expect: the second argument of kiln::Tensor is a memory space
// The memory space is the second template argument; an extent there is a mistake.
// Control: kiln::host as the second argument.
#include <kiln.hpp>

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, 4> t;
#else
  kiln::Tensor<float, int, 4> t;
#endif
  (void)t;
}
