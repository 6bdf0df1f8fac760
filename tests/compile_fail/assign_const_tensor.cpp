// expect: the destination of an assignment is const
// Assigning into a const tensor.
// Control: the destination is not const.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4);
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::Tensor<float, kiln::host, kiln::dyn> y(4);
#else
  const kiln::Tensor<float, kiln::host, kiln::dyn> y(4);
#endif
  kiln::assign(y, x * 2, exec);
}
