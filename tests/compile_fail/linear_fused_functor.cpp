// expect: Linear::forward_fused<Act>: Act::functor must be a kiln::fn::unary_functor
// Calling forward_fused directly with an activation whose functor holds a std::vector (a kernel
// could not copy it).
// Control: the functor without the std::vector member.
#include <vector>

#include <kiln/backend/cpu/executor.hpp>
#include <kiln/nn/linear.hpp>
// Linear adds its bias with the expression operators, which nn/linear.hpp does not include.

struct Table {
  static constexpr const char* name = "table";
#ifndef KILN_COMPILE_FAIL_CONTROL
  std::vector<float> values;
#endif
  template <class T>
  T operator()(T x) const {
    return x;
  }
  template <class T>
  T d(T) const {
    return T(1);
  }
};
struct TableLayer {
  static constexpr bool is_activation = true;
  using functor = Table;
};

int main() {
  kiln::CpuExecutor exec;
  kiln::ag::Tape<kiln::CpuExecutor> tape(exec);
  kiln::nn::Linear<4, 2> layer;
  kiln::ag::Var<float, kiln::host, kiln::dyn, 4> x;
  auto y = layer.forward_fused<TableLayer>(tape, x);
  (void)y;
}
