// kiln/nn/opaque.hpp — a user function kiln treats as a black box: the counterpart of
// torch.compiler.disable.
//
//   struct Scale {                                      // any function of (tape, x) -> variable
//     static constexpr const char* name = "scale";
//     template <class Tape, class X> auto operator()(Tape& tape, const X& x) const {
//       return kiln::ag::map(tape, x * 0.5);
//     }
//   };
//   using Model = nn::Sequential<nn::Linear<8, 8>, nn::ReLU, nn::Opaque<Scale>, nn::Linear<8, 2>>;
//
// Nothing fuses across it: the layer before it ends its kernel there and the layer after starts a
// new one; the launches it makes are its own business, recorded under "opaque(scale)" so the
// training step's report names the boundary and why. A policy with kiln::fullgraph refuses a
// model with an opaque layer at compile time. Its launches are known at compile time only when F
// says them (`static constexpr nn::Launches launches(const nn::LaunchContext&)`).
#pragma once

#include <string>
#include <utility>

#include "kiln/nn/module.hpp"

namespace kiln::nn {

template <class F>
class Opaque {
  static_assert(requires { F::name; }, "kiln::nn::Opaque<F>: F must say its name (`static constexpr const char* name`), "
                                       "which the report shows at the boundary");

 public:
  static constexpr bool is_opaque = true;

  Opaque() = default;
  explicit Opaque(F f) : f_(std::move(f)) {}

  template <class Exec, class X>
  auto forward(ag::Tape<Exec>& tape, const X& x) const {
    auto& stats = tape.exec().stats();
    struct Region {  // restores the outer region, also when f throws
      LaunchStats& stats;
      std::string previous;
      ~Region() { stats.set_region(std::move(previous)); }
    } region{stats, stats.set_region(std::string("opaque(") + F::name + ")")};
    return f_(tape, x);
  }

  static constexpr Launches launches(const LaunchContext& c)
    requires requires { F::launches(c); }
  {
    return F::launches(c);
  }

  static std::string describe() { return std::string("opaque(") + F::name + ")"; }

 private:
  [[no_unique_address]] F f_{};
};

// opaque(f): the layer, from a function object (for a Sequential built from layer values).
template <class F>
Opaque<F> opaque(F f) {
  return Opaque<F>(std::move(f));
}

}  // namespace kiln::nn
