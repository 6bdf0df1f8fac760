// kiln/expr/elementwise.hpp — the elementwise vocabulary: operators and named functions that
// build nodes. `((x * a + b) max 0) * c - d` is a single node type, evaluated as one kernel.
#pragma once

#include "kiln/expr/functors.hpp"
#include "kiln/expr/node.hpp"

namespace kiln {

#define KILN_BINARY_OPERATOR(op, F)                                  \
  template <class A, class B>                                        \
    requires binary_operands<A, B>                                   \
  auto operator op(A&& a, B&& b) {                                   \
    return make_binary(F{}, std::forward<A>(a), std::forward<B>(b)); \
  }
KILN_BINARY_OPERATOR(+, fn::Add)
KILN_BINARY_OPERATOR(-, fn::Sub)
KILN_BINARY_OPERATOR(*, fn::Mul)
KILN_BINARY_OPERATOR(/, fn::Div)
#undef KILN_BINARY_OPERATOR

// Comparisons are named functions: operator== on expressions would read as a bool test.
#define KILN_BINARY_FUNCTION(name, F)                                \
  template <class A, class B>                                        \
    requires binary_operands<A, B>                                   \
  auto name(A&& a, B&& b) {                                          \
    return make_binary(F{}, std::forward<A>(a), std::forward<B>(b)); \
  }
KILN_BINARY_FUNCTION(maximum, fn::Max)
KILN_BINARY_FUNCTION(minimum, fn::Min)
KILN_BINARY_FUNCTION(pow, fn::Pow)
KILN_BINARY_FUNCTION(lt, fn::Less)
KILN_BINARY_FUNCTION(le, fn::LessEqual)
KILN_BINARY_FUNCTION(gt, fn::Greater)
KILN_BINARY_FUNCTION(ge, fn::GreaterEqual)
KILN_BINARY_FUNCTION(eq, fn::Equal)
KILN_BINARY_FUNCTION(ne, fn::NotEqual)
#undef KILN_BINARY_FUNCTION

template <class A>
  requires is_operand_v<A>
auto operator-(A&& a) {
  return make_unary(fn::Neg{}, std::forward<A>(a));
}

#define KILN_UNARY_FUNCTION(name, F)                \
  template <class A>                                \
    requires is_operand_v<A>                        \
  auto name(A&& a) {                                \
    return make_unary(F{}, std::forward<A>(a));     \
  }
KILN_UNARY_FUNCTION(abs, fn::Abs)
KILN_UNARY_FUNCTION(square, fn::Square)
KILN_UNARY_FUNCTION(exp, fn::Exp)
KILN_UNARY_FUNCTION(log, fn::Log)
KILN_UNARY_FUNCTION(log1p, fn::Log1p)
KILN_UNARY_FUNCTION(sqrt, fn::Sqrt)
KILN_UNARY_FUNCTION(rsqrt, fn::Rsqrt)
KILN_UNARY_FUNCTION(reciprocal, fn::Reciprocal)
KILN_UNARY_FUNCTION(sin, fn::Sin)
KILN_UNARY_FUNCTION(cos, fn::Cos)
KILN_UNARY_FUNCTION(tanh, fn::Tanh)
KILN_UNARY_FUNCTION(sigmoid, fn::Sigmoid)
KILN_UNARY_FUNCTION(relu, fn::Relu)
KILN_UNARY_FUNCTION(gelu, fn::GeluErf)
KILN_UNARY_FUNCTION(gelu_tanh, fn::GeluTanh)
KILN_UNARY_FUNCTION(silu, fn::Silu)
KILN_UNARY_FUNCTION(softplus, fn::Softplus)
KILN_UNARY_FUNCTION(identity, fn::Identity)
#undef KILN_UNARY_FUNCTION

template <class A>
  requires is_operand_v<A>
auto pow(A&& a, double p) {
  return make_unary(fn::PowScalar{p}, std::forward<A>(a));
}
template <class A>
  requires is_operand_v<A>
auto clamp(A&& a, double lo, double hi) {
  KILN_CHECK(lo <= hi, ValueError, "clamp needs lo <= hi, got lo = ", lo, ", hi = ", hi);
  return make_unary(fn::Clamp{lo, hi}, std::forward<A>(a));
}
template <class A>
  requires is_operand_v<A>
auto leaky_relu(A&& a, double slope = 0.01) {
  return make_unary(fn::LeakyRelu{slope}, std::forward<A>(a));
}

// where(cond, a, b): a where cond is non-zero, otherwise b (scalars allowed for a and b).
template <class C, class A, class B>
  requires is_operand_v<C>
auto where(C&& cond, A&& a, B&& b) {
  auto rc = as_expr(std::forward<C>(cond));
  auto ra = as_operand<C>(std::forward<A>(a));
  auto rb = as_operand<C>(std::forward<B>(b));
  return Ternary<fn::Where, decltype(rc), decltype(ra), decltype(rb)>(fn::Where{}, rc, ra, rb);
}

// cast<To>(x): the value rounded to To (computed in compute_t<To>).
template <class To, class A>
  requires is_operand_v<A>
auto cast(A&& a) {
  auto ra = as_expr(std::forward<A>(a));
  return Cast<To, decltype(ra)>(ra);
}

}  // namespace kiln
