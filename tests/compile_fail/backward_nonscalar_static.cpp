// expect: backward\(\) needs a scalar loss
// A loss with static extents [2, 3] cannot seed backward: reduce it first (ag::mean / ag::sum).
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 2, 3> loss(kiln::Tensor<float, kiln::host, 2, 3>{}, true);
  tape.backward(loss);
}
