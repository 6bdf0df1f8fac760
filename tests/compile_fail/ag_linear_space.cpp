// expect: ag::linear's variables must live in the executor's memory space
// Host variables handed to an executor whose memory is elsewhere (a stand-in for a device one).
// Control: the same host variables with the CPU executor, whose memory is host.
#include "kiln/autograd/linear.hpp"
#ifdef KILN_COMPILE_FAIL_CONTROL
#include "kiln/backend/cpu/executor.hpp"
#endif

struct DeviceLikeExecutor {
  using space = kiln::cuda;
};

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Exec = kiln::CpuExecutor;
#else
  using Exec = DeviceLikeExecutor;
#endif
  Exec exec;
  kiln::ag::Tape<Exec> tape(exec);
  kiln::ag::Var<float, kiln::host, 4, 3> x;
  kiln::ag::Var<float, kiln::host, 5, 3> w;
  auto y = kiln::ag::linear(tape, x, w);
  (void)y;
}
