// expect: an extent must be a non-negative size or kiln::dyn
// A negative static size (kiln::dyn is -1; -2 is nothing).
#include <kiln.hpp>

int main() {
  kiln::Tensor<float, kiln::host, -2, 4> t;
  (void)t;
}
