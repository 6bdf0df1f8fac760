// kiln/nn/activation.hpp — activations as autograd ops (ag::map: ONE fused kernel forward, ONE
// derived kernel backward) and as layers, built-in or your own.
//
// An activation layer is Activation<F> for a unary functor F (kiln::fn::unary_functor):
//
//   struct Mish {                                       // mish(x) = x·tanh(softplus(x))
//     static constexpr const char* name = "mish";       // launch reports: "gemm+bias+mish"
//     template <class T> KILN_HOST_DEVICE T operator()(T x) const { ... }
//     template <class T> KILN_HOST_DEVICE T d(T x) const { ... }   // d mish / dx
//   };
//   using MishLayer = kiln::nn::Activation<Mish>;
//   kiln::nn::Sequential<kiln::nn::Linear<16, 32>, MishLayer, kiln::nn::Linear<32, 4>> model;
//
// A Linear followed by an activation runs as ONE GEMM whose epilogue applies F and keeps what
// F::d needs (autograd/linear.hpp); the backward folds F::d into the next GEMM. Elsewhere the
// layer is one fused kernel each way, its backward derived from F::d. A functor that breaks the
// contract (no d(), state a kernel cannot copy, ...) is a static_assert naming what is missing,
// where the layer is named — not an error deep inside an epilogue.
//
// The layer contract Sequential relies on, for layers of your own:
// - `forward(tape, x)` returning a variable (const or not; shapes are checked there, at run time);
// - optional `static constexpr index_t in_features / out_features` (checked between layers at
//   compile time), `for_each_parameter(f)` (f(var) per parameter variable), `train(bool)` /
//   `training()` (modes), `template <class S> using on = ...` (the layer in another memory space),
//   a constructor from `kiln::Generator&` (seeded initialisation in layer order);
// - activations: `static constexpr bool is_activation = true` and `using functor = F` with F a
//   kiln::fn::unary_functor — deriving from Activation<F> gives all of it.
#pragma once

#include <type_traits>
#include <utility>

#include "kiln/autograd/map.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/expr/functors.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

// The activation layer of functor F.
template <class F>
struct Activation {
  static_assert(fn::unary_functor<F>,
                "kiln::nn::Activation<F>: F must be a unary kiln functor: `static constexpr const char* name`, "
                "`template <class T> KILN_HOST_DEVICE T operator()(T) const` and its derivative "
                "`template <class T> KILN_HOST_DEVICE T d(T) const`, default-constructible and trivially copyable "
                "(see kiln/nn/activation.hpp)");
  static constexpr bool is_activation = true;
  using functor = F;

  // F applied to an expression (one node of a fused chain).
  template <class E>
  static auto apply(E&& e) {
    return make_unary(F{}, std::forward<E>(e));
  }
  // The result keeps x's type: a bf16 / f16 input (mixed precision) is computed in float and
  // rounded as it is stored, in the same kernel.
  template <class Exec, class T, class S, index_t... D>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) const {
    if constexpr (std::is_same_v<T, compute_t<T>>) return ag::map(tape, apply(x));
    else return ag::map(tape, cast<T>(apply(x)));
  }
  // Runs on bf16 / f16 activations (train::Step's mixed precisions).
  static constexpr bool mixed_precision = true;
  // Alone (not in a Linear's epilogue): one kernel each way.
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.input_grad ? 1 : 0}; }
};

using ReLU = Activation<fn::Relu>;
using GELU = Activation<fn::GeluErf>;  // the exact (erf) form, PyTorch's default
using GELUTanh = Activation<fn::GeluTanh>;
using SiLU = Activation<fn::Silu>;
using Tanh = Activation<fn::Tanh>;
using Sigmoid = Activation<fn::Sigmoid>;
using Softplus = Activation<fn::Softplus>;

// The activations as functions on variables: nn::activation<F>(tape, x), or by name.
template <class F, class Exec, class T, class S, index_t... D>
auto activation(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return Activation<F>{}.forward(tape, x);
}
template <class Exec, class T, class S, index_t... D>
auto relu(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return activation<fn::Relu>(tape, x);
}
template <class Exec, class T, class S, index_t... D>
auto gelu(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return activation<fn::GeluErf>(tape, x);
}
template <class Exec, class T, class S, index_t... D>
auto gelu_tanh(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return activation<fn::GeluTanh>(tape, x);
}
template <class Exec, class T, class S, index_t... D>
auto silu(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return activation<fn::Silu>(tape, x);
}
template <class Exec, class T, class S, index_t... D>
auto tanh(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return activation<fn::Tanh>(tape, x);
}
template <class Exec, class T, class S, index_t... D>
auto sigmoid(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return activation<fn::Sigmoid>(tape, x);
}
template <class Exec, class T, class S, index_t... D>
auto softplus(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
  return activation<fn::Softplus>(tape, x);
}

}  // namespace kiln::nn
