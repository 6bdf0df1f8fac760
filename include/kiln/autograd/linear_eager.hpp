// kiln/autograd/linear_eager.hpp — stance::force_eager's form of ag::linear (kiln/force_eager.hpp):
// the GEMM alone, then the bias and the activation as nodes of their own (one kernel each way per
// node), as an unfused framework runs them. Like the fused form it is written on the op's
// operands with their sizes at run time, so it is compiled once per executor, element type and
// activation (for the CPU executor in kiln::kernels). Included by kiln/autograd/linear.hpp unless
// KILN_FORCE_EAGER_FORMS is 0 (kiln/config.hpp).
#pragma once

#include <type_traits>

#include "kiln/autograd/linear.hpp"
#include "kiln/autograd/map.hpp"

namespace kiln::ag::detail {

template <class Act, class Exec, class T>
void linear_eager(Tape<Exec>& tape, const LinearOperands<T>& op, T* y_values, VarNode& y) {
  using S = typename Exec::space;
  using W = compute_t<T>;
  using Matrix = Var<T, S, dyn, dyn>;
  // A half-precision result is rounded where it is stored: part of its node, not one more.
  auto stored = [](auto&& e) {
    if constexpr (std::is_same_v<T, W>) return e;
    else return cast<T>(e);
  };
  const bool has_bias = op.bias != nullptr;
  if (!has_bias && is_identity_act_v<Act>) return linear_fused<fn::Identity>(tape, op, y_values, y);
  // z = x·wᵀ, the GEMM alone.
  LinearOperands<T> gemm_only = op;
  gemm_only.bias = nullptr;
  gemm_only.bias_values = nullptr;
  gemm_only.needs_grad = tape.recording() && (op.x->requires_grad || op.w->requires_grad);
  Matrix z(typename Matrix::tensor_type(Shape{op.m, op.n}));
  linear_fused<fn::Identity>(tape, gemm_only, z.value().data(), *z.data());
  const VarLeaf<W, S, extents<dyn>> bias{View<const W, S, extents<dyn>>(op.bias_values, Shape{op.n}), op.bias};
  if constexpr (is_identity_act_v<Act>) {
    map_into(tape, stored(make_binary(fn::Add{}, to_leaf(z), bias)), y, y_values);
  } else if (has_bias) {
    const Matrix with_bias = map_expr(tape, stored(make_binary(fn::Add{}, to_leaf(z), bias)));
    map_into(tape, stored(make_unary(Act{}, to_leaf(with_bias))), y, y_values);
  } else {
    map_into(tape, stored(make_unary(Act{}, to_leaf(z))), y, y_values);
  }
}

}  // namespace kiln::ag::detail
