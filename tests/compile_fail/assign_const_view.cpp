// expect: the destination of an assignment is a view of const elements
// Assigning into a view of const elements (what a const tensor's view() returns).
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4);
  kiln::View<const float, kiln::host, kiln::extents<kiln::dyn>> y = x.view();
  kiln::assign(y, x * 2, exec);
}
