// expect: the destination of an assignment must be a Tensor or a View
// An expression is not a place to store results.
#include <kiln.hpp>

int main() {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn> x(4), y(4);
  kiln::assign(y * 1.0f, x * 2, exec);
}
