// expect: assign's template argument must be a stance
// assign's template argument is a stance tag; anything else is rejected with the choices.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4), y(4);
  kiln::assign<int>(y, x * 2, exec);
}
