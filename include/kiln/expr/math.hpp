// kiln/expr/math.hpp — the scalar math functions functors call, for host and device alike.
//
// The global C functions (expf, ::exp, ...) exist both in <cmath> and in CUDA's device math
// library, so one overload set serves both sides.
#pragma once

#include <cmath>

#include "kiln/config.hpp"

namespace kiln::math {

#define KILN_MATH_UNARY(name, ffun, dfun)                              \
  KILN_HOST_DEVICE float name(float x) { return ::ffun(x); }          \
  KILN_HOST_DEVICE double name(double x) { return ::dfun(x); }

KILN_MATH_UNARY(exp, expf, exp)
KILN_MATH_UNARY(log, logf, log)
KILN_MATH_UNARY(log1p, log1pf, log1p)
KILN_MATH_UNARY(sqrt, sqrtf, sqrt)
KILN_MATH_UNARY(sin, sinf, sin)
KILN_MATH_UNARY(cos, cosf, cos)
KILN_MATH_UNARY(tanh, tanhf, tanh)
KILN_MATH_UNARY(erf, erff, erf)
KILN_MATH_UNARY(abs, fabsf, fabs)
#undef KILN_MATH_UNARY

KILN_HOST_DEVICE float pow(float a, float b) { return ::powf(a, b); }
KILN_HOST_DEVICE double pow(double a, double b) { return ::pow(a, b); }

// Branch-free min / max that the CPU compiler vectorises; a NaN in either operand propagates,
// as in PyTorch's maximum / minimum.
template <class T>
KILN_HOST_DEVICE T min(T a, T b) {
  return (b < a || b != b) ? b : a;
}
template <class T>
KILN_HOST_DEVICE T max(T a, T b) {
  return (a < b || b != b) ? b : a;
}

}  // namespace kiln::math
