// expect: ag reductions drop the reduced axis
// Control: reduce over the last axis, dropping it.
#include "kiln.hpp"

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 2, 2> a;
#ifdef KILN_COMPILE_FAIL_CONTROL
  auto y = kiln::ag::sum<kiln::reduce_over::last_axis>(tape, a);
#else
  auto y = kiln::ag::sum<kiln::reduce_over::last_axis_keepdim>(tape, a);
#endif
  (void)y;
}
