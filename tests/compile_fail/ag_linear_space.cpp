// expect: ag::linear's variables must live in the executor's memory space
// Host variables handed to an executor whose memory is elsewhere (a stand-in for a device one).
#include "kiln/autograd/linear.hpp"

struct DeviceLikeExecutor {
  using space = kiln::cuda;
};

int main() {
  DeviceLikeExecutor exec;
  kiln::ag::Tape<DeviceLikeExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 4, 3> x;
  kiln::ag::Var<float, kiln::host, 5, 3> w;
  auto y = kiln::ag::linear(tape, x, w);
  (void)y;
}
