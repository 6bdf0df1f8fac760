// expect: Sequential: this activation layer's functor is not a kiln::fn::unary_functor
// A hand-written activation layer (not derived from nn::Activation) whose functor has no d().
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
struct CubeLayer {
  static constexpr bool is_activation = true;
  using functor = Cube;
  template <class E>
  static auto apply(E&& e) {
    return kiln::make_unary(Cube{}, std::forward<E>(e));
  }
};

int main() {
  kiln::nn::Sequential<kiln::nn::Linear<4, 8>, CubeLayer, kiln::nn::Linear<8, 2>> model;
  return int(model.parameter_count());
}
