// expect: ag::linear\(x, w, b\): b's size must equal w's first size
// w has 5 outputs but the bias 4 entries.
#include "kiln/autograd/linear.hpp"
#include "kiln/backend/cpu/executor.hpp"

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 4, 3> x;
  kiln::ag::Var<float, kiln::host, 5, 3> w;
  kiln::ag::Var<float, kiln::host, 4> b;
  auto y = kiln::ag::linear(tape, x, w, b);
  (void)y;
}
