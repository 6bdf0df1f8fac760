// expect: layer_norm: the input must live in the executor's memory space
// A host variable handed to an executor whose memory is elsewhere (a stand-in for a device one).
// Control: the same host variable with the CPU executor, whose memory is host.
#include <kiln/nn/layernorm.hpp>
#ifdef KILN_COMPILE_FAIL_CONTROL
#include <kiln/backend/cpu/executor.hpp>
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
  kiln::ag::Var<float, kiln::host, 4, 8> x;
  auto y = kiln::nn::layer_norm(tape, x);
  (void)y;
}
