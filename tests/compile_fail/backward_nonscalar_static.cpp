// expect: backward\(\) needs a scalar loss
// A loss with static extents [2, 3] cannot seed backward: reduce it first (ag::mean / ag::sum).
// Control: a scalar (rank-0) loss.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::ag::Var<float, kiln::host> loss(kiln::Tensor<float, kiln::host>{}, true);
#else
  kiln::ag::Var<float, kiln::host, 2, 3> loss(kiln::Tensor<float, kiln::host, 2, 3>{}, true);
#endif
  tape.backward(loss);
}
