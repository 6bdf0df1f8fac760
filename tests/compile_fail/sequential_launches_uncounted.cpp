// expect: Sequential::launches: a layer does not say what it launches
// Model::launches counts kernels at compile time; a hand-written layer without
// `static constexpr nn::Launches launches(const nn::LaunchContext&)` leaves the count unknown.
// Control: the layer says what it launches.
#include <kiln/nn/activation.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>

namespace nn = kiln::nn;

struct Double {
  template <class Exec, class X>
  auto forward(kiln::ag::Tape<Exec>& tape, const X& x) const {
    return kiln::ag::map(tape, x * 2.0f);
  }
#ifdef KILN_COMPILE_FAIL_CONTROL
  static constexpr nn::Launches launches(const nn::LaunchContext& c) { return {1, c.input_grad ? 1 : 0}; }
#endif
};

int main() {
  using Model = nn::Sequential<nn::Linear<4, 8>, Double, nn::Linear<8, 2>>;
  constexpr nn::Launches l = Model::launches(nn::LaunchContext{});
  return int(l.total());
}
