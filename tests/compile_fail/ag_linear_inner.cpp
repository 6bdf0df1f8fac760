// expect: ag::linear\(x, w\): x's last size must equal w's second size
// x is [4 x 3] and w [5 x 2]: y = x·wᵀ needs w's second size to be 3.
#include "kiln/autograd/linear.hpp"
#include "kiln/backend/cpu/executor.hpp"

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 4, 3> x;
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::ag::Var<float, kiln::host, 5, 3> w;
#else
  kiln::ag::Var<float, kiln::host, 5, 2> w;
#endif
  auto y = kiln::ag::linear(tape, x, w);
  (void)y;
}
