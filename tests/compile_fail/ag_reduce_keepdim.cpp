// expect: ag reductions drop the reduced axis
#include "kiln.hpp"

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 2, 2> a;
  auto y = kiln::ag::sum<kiln::reduce_over::last_axis_keepdim>(tape, a);
  (void)y;
}
