// expect: the destination of an assignment is a view of const elements
// Assigning into a view of const elements (what a const tensor's view() returns).
// Control: a view of mutable elements.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4);
#ifdef KILN_COMPILE_FAIL_CONTROL
  kiln::View<float, kiln::host, kiln::extents<kiln::dyn>> y = x.view();
#else
  kiln::View<const float, kiln::host, kiln::extents<kiln::dyn>> y = x.view();
#endif
  kiln::assign(y, x * 2, exec);
}
