// expect: Activation<F>: F must be a unary kiln functor
// A user's activation functor without its derivative d(): rejected where the layer is named,
// not deep inside a GEMM epilogue.
// Control: the functor gets its derivative d().
#include <kiln/nn/activation.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>

struct Cube {
  static constexpr const char* name = "cube";
  template <class T>
  KILN_HOST_DEVICE T operator()(T x) const {
    return x * x * x;
  }
#ifdef KILN_COMPILE_FAIL_CONTROL
  template <class T>
  KILN_HOST_DEVICE T d(T x) const {
    return T(3) * x * x;
  }
#endif
};

int main() {
  kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::Activation<Cube>, kiln::nn::Linear<8, 2>> model;
  return int(model.parameter_count());
}
