// kiln/autograd/linear_eager.hpp — stance::force_eager's form of ag::linear (kiln/force_eager.hpp):
// the GEMM alone, then the bias and the activation as nodes of their own (one kernel each way per
// node), as an unfused framework runs them. Included by kiln/autograd/linear.hpp unless
// KILN_FORCE_EAGER_FORMS is 0 (kiln/config.hpp).
#pragma once

#include <cstddef>
#include <type_traits>

#include "kiln/autograd/linear.hpp"
#include "kiln/autograd/map.hpp"

namespace kiln::ag::detail {

template <class Act, class Exec, class T, class W, class S, index_t B, index_t I, index_t O, index_t I2,
          class BiasVar>
bool linear_eager(Tape<Exec>& tape, const Var<T, S, B, I>& x, const Var<W, S, O, I2>& w, const BiasVar* bias,
                  const T* w_low, Var<T, S, B, O>& y) {
  constexpr bool has_bias = !std::is_same_v<BiasVar, std::nullptr_t>;
  constexpr bool identity = is_identity_act_v<Act>;
  using Y = Var<T, S, B, O>;
  Y z = linear_impl<fn::Identity>(tape, x, w, static_cast<const std::nullptr_t*>(nullptr), w_low);
  // A half-precision result is rounded where it is stored: part of its node, not one more.
  auto stored = [](auto&& e) {
    if constexpr (std::is_same_v<T, W>) return e;
    else return cast<T>(e);
  };
  auto with_bias = [&] {
    if constexpr (has_bias) return ag::map(tape, stored(z + *bias));
    else return z;
  }();
  auto out = [&] {
    if constexpr (identity) return with_bias;
    else return ag::map(tape, stored(make_unary(Act{}, with_bias)));
  }();
  if constexpr (std::is_same_v<decltype(out), Y>) {
    y = out;
    return true;
  } else {
    return false;
  }
}

}  // namespace kiln::ag::detail
