// kiln/nn/activation.hpp — activations as autograd ops (ag::map: ONE fused kernel forward, ONE
// derived kernel backward) and as layers.
//
// A layer names its function once, as a kiln::fn functor: apply(expr) uses it in expressions, and
// Sequential hands it to the preceding Linear, which computes act(x·Wᵀ + b) as ONE GEMM with an
// epilogue (autograd/linear.hpp).
#pragma once

#include <utility>

#include "kiln/autograd/map.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

#define KILN_NN_ACTIVATION(fname, Layer, Functor)                              \
  template <class Exec, class T, class S, index_t... D>                        \
  auto fname(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {             \
    return ag::map(tape, ::kiln::fname(x));                                    \
  }                                                                            \
  struct Layer {                                                               \
    static constexpr bool is_activation = true;                                \
    using functor = Functor;                                                   \
    template <class E>                                                         \
    static auto apply(E&& e) {                                                 \
      return ::kiln::fname(std::forward<E>(e));                                \
    }                                                                          \
    template <class Exec, class T, class S, index_t... D>                      \
    auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) const {   \
      return ag::map(tape, apply(x));                                          \
    }                                                                          \
  };

KILN_NN_ACTIVATION(relu, ReLU, fn::Relu)
KILN_NN_ACTIVATION(gelu, GELU, fn::GeluErf)  // the exact (erf) form, PyTorch's default
KILN_NN_ACTIVATION(gelu_tanh, GELUTanh, fn::GeluTanh)
KILN_NN_ACTIVATION(silu, SiLU, fn::Silu)
KILN_NN_ACTIVATION(tanh, Tanh, fn::Tanh)
KILN_NN_ACTIVATION(sigmoid, Sigmoid, fn::Sigmoid)
KILN_NN_ACTIVATION(softplus, Softplus, fn::Softplus)
#undef KILN_NN_ACTIVATION

}  // namespace kiln::nn
