// expect: the destination of an assignment must be a Tensor or a View
// An expression is not a place to store results.
// Control: the tensor itself is the destination.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4), y(4);
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::assign(y, x * 2, exec);
#else
  kiln::assign(y * 1.0f, x * 2, exec);
#endif
}
