// expect: the policy says kiln::fullgraph, but the model has an opaque layer
// fullgraph promises a step kiln sees whole; an opaque function is a boundary it cannot see through.
// Control: the same model without the opaque layer, under the same fullgraph policy.
#include <kiln/train.hpp>

struct Halve {
  static constexpr const char* name = "halve";
  template <class Tape, class X>
  auto operator()(Tape& tape, const X& x) const {
    return kiln::ag::map(tape, x * 0.5);
  }
};

int main() {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::ReLU, kiln::nn::Linear<8, 2>>;
#else
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::ReLU, kiln::nn::Opaque<Halve>,
                                     kiln::nn::Linear<8, 2>>;
#endif
  kiln::CpuExecutor exec;
  Model model;
  kiln::optim::AdamW opt(model, {});
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::fullgraph>{});
  (void)step;
}
