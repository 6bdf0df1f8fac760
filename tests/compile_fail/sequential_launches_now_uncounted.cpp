// expect: Sequential::launches_now: a layer does not say what it launches
// launches_now counts kernels for the parameters' requires_grad flags now; a hand-written layer
// without `static constexpr nn::Launches launches(const nn::LaunchContext&)` leaves it unknown.
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
  nn::Sequential<nn::Linear<4, 8>, Double, nn::Linear<8, 2>> model;
  return int(model.launches_now(nn::LaunchContext{}).total());
}
