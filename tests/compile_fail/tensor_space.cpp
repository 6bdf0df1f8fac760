// expect: the second argument of kiln::Tensor is a memory space
// The memory space is the second template argument; an extent there is a mistake.
#include <kiln.hpp>

int main() {
  kiln::Tensor<float, int, 4> t;
  (void)t;
}
