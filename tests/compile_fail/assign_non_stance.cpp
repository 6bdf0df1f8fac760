// expect: assign's template argument must be a stance
// assign's template argument is a stance tag; anything else is rejected with the choices.
// Control: a stance tag as the template argument.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4), y(4);
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::assign<kiln::stance::force_eager>(y, x * 2, exec);
#else
  kiln::assign<int>(y, x * 2, exec);
#endif
}
