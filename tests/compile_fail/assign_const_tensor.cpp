// expect: the destination of an assignment is const
// Assigning into a const tensor.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4);
  const kiln::Tensor<float, kiln::host, kiln::dyn> y(4);
  kiln::assign(y, x * 2, exec);
}
