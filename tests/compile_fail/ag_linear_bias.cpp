// expect: ag::linear\(x, w, b\): b's size must equal w's first size
// w has 5 outputs but the bias 4 entries.
#include "kiln/autograd/linear.hpp"
#include "kiln/backend/cpu/executor.hpp"
// ag::linear with a bias adds it with the expression operators, which linear.hpp does not include.

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::ag::Var<float, kiln::host, 4, 3> x;
  kiln::ag::Var<float, kiln::host, 5, 3> w;
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::ag::Var<float, kiln::host, 5> b;
#else
  kiln::ag::Var<float, kiln::host, 4> b;
#endif
  auto y = kiln::ag::linear(tape, x, w, b);
  (void)y;
}
