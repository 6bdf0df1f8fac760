// kiln/nn/activation.hpp — activations as autograd ops (ag::map: ONE fused kernel forward, ONE
// derived kernel backward) and as layers.
//
// A layer names its function once, in apply(expr): Sequential hands that expression to the
// preceding Linear, which computes act(x·Wᵀ + b) with ONE elementwise kernel after the GEMM.
#pragma once

#include <utility>

#include "kiln/autograd/map.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

#define KILN_NN_ACTIVATION(fname, Layer)                                       \
  template <class Exec, class T, class S, index_t... D>                        \
  auto fname(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {             \
    return ag::map(tape, ::kiln::fname(x));                                    \
  }                                                                            \
  struct Layer {                                                               \
    static constexpr bool is_activation = true;                                \
    template <class E>                                                         \
    static auto apply(E&& e) {                                                 \
      return ::kiln::fname(std::forward<E>(e));                                \
    }                                                                          \
    template <class Exec, class T, class S, index_t... D>                      \
    auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) const {   \
      return ag::map(tape, apply(x));                                          \
    }                                                                          \
  };

KILN_NN_ACTIVATION(relu, ReLU)
KILN_NN_ACTIVATION(gelu, GELU)  // the exact (erf) form, PyTorch's default
KILN_NN_ACTIVATION(gelu_tanh, GELUTanh)
KILN_NN_ACTIVATION(silu, SiLU)
KILN_NN_ACTIVATION(tanh, Tanh)
KILN_NN_ACTIVATION(sigmoid, Sigmoid)
KILN_NN_ACTIVATION(softplus, Softplus)
#undef KILN_NN_ACTIVATION

}  // namespace kiln::nn
