// expect: reducing over the last axis needs an operand of rank >= 1
// A rank-0 tensor has no last axis to reduce.
#include <kiln.hpp>

int main() {
  kiln::Tensor<float, kiln::host> s;
  auto r = kiln::sum<kiln::reduce_over::last_axis>(s);
  (void)r;
}
