// expect: kiln tensors have rank 0 to 4
// A rank-5 tensor type.
#include <kiln.hpp>

int main() {
  kiln::Tensor<float, kiln::host, 2, 2, 2, 2, 2> t;
  (void)t;
}
