// kiln/expr/math.hpp — the scalar math functions functors call, for host and device alike.
//
// Device code calls CUDA's functions (expf, ::exp, ...; one overload set for both sides). Host
// code calls libm for double and kiln's vectorisable kernels for float (kiln/expr/vmath_*.hpp):
// a libm call inside a fused loop keeps the loop scalar, and the float kernels keep it vector.
#pragma once

#include <cmath>
#include <type_traits>

#include "kiln/config.hpp"
#if !KILN_DEVICE_PASS
#include "kiln/expr/vmath_special.hpp"
#endif

namespace kiln::math {

// name(float) is vmath::vname on the host and CUDA's ffun on the device; name(double) is dfun.
#if KILN_DEVICE_PASS
#define KILN_MATH_FLOAT(ffun, vname) return ::ffun(x);
#else
#define KILN_MATH_FLOAT(ffun, vname) return vmath::vname(x);
#endif
#define KILN_MATH_UNARY(name, ffun, dfun)                                                      \
  KILN_HOST_DEVICE float name(float x) { KILN_MATH_FLOAT(ffun, name) }                        \
  KILN_HOST_DEVICE double name(double x) { return ::dfun(x); }

KILN_MATH_UNARY(exp, expf, exp)
KILN_MATH_UNARY(log, logf, log)
KILN_MATH_UNARY(log1p, log1pf, log1p)
KILN_MATH_UNARY(tanh, tanhf, tanh)
KILN_MATH_UNARY(erf, erff, erf)
KILN_MATH_UNARY(erfc, erfcf, erfc)
#undef KILN_MATH_UNARY
#undef KILN_MATH_FLOAT

// Exact in IEEE arithmetic: libm's (vsqrtps / fabs when the loop vectorises).
KILN_HOST_DEVICE float sqrt(float x) { return ::sqrtf(x); }
KILN_HOST_DEVICE double sqrt(double x) { return ::sqrt(x); }
KILN_HOST_DEVICE float abs(float x) { return ::fabsf(x); }
KILN_HOST_DEVICE double abs(double x) { return ::fabs(x); }
// Not vectorised on the host (no functor in a hot loop needs them).
KILN_HOST_DEVICE float sin(float x) { return ::sinf(x); }
KILN_HOST_DEVICE double sin(double x) { return ::sin(x); }
KILN_HOST_DEVICE float cos(float x) { return ::cosf(x); }
KILN_HOST_DEVICE double cos(double x) { return ::cos(x); }

// Φ(x) = ½·erfc(−x/√2), the standard normal CDF, accurate in the lower tail where 1 + erf(x/√2)
// would cancel to 0.
KILN_HOST_DEVICE float norm_cdf(float x) {
#if KILN_DEVICE_PASS
  return ::normcdff(x);
#else
  return vmath::norm_cdf(x);
#endif
}
KILN_HOST_DEVICE double norm_cdf(double x) { return 0.5 * ::erfc(x * -0.70710678118654752440); }

// GELU's two forms, x·Φ(x) and ½·x·(1 + tanh u) = x·σ(2u) with u = √(2/π)·(x + 0.044715·x³);
// gelu(−inf) is −0 (the limit). The host float versions work in double inside (vmath_special).
KILN_HOST_DEVICE float gelu_erf(float x) {
#if KILN_DEVICE_PASS
  return x == -INFINITY ? -0.f : x * ::normcdff(x);
#else
  return vmath::gelu_erf(x);
#endif
}
KILN_HOST_DEVICE double gelu_erf(double x) { return x == -INFINITY ? -0.0 : x * norm_cdf(x); }
KILN_HOST_DEVICE float gelu_tanh(float x) {
#if KILN_DEVICE_PASS
  const float u2 = 1.5957691216057307118f * (x + 0.044715f * x * x * x);
  return x == -INFINITY ? -0.f : x / (1.f + ::expf(-u2));
#else
  return vmath::gelu_tanh(x);
#endif
}
KILN_HOST_DEVICE double gelu_tanh(double x) {
  const double u2 = 1.5957691216057307118 * (x + 0.044715 * x * x * x);
  return x == -INFINITY ? -0.0 : x / (1.0 + ::exp(-u2));
}

// x·σ(x) (SiLU, swish); −0 at −inf (the limit). Host float in double inside (vmath_special).
KILN_HOST_DEVICE float silu(float x) {
#if KILN_DEVICE_PASS
  return x == -INFINITY ? -0.f : x / (1.f + ::expf(-x));
#else
  return vmath::silu(x);
#endif
}
KILN_HOST_DEVICE double silu(double x) { return x == -INFINITY ? -0.0 : x / (1.0 + ::exp(-x)); }

KILN_HOST_DEVICE float pow(float a, float b) {
#if KILN_DEVICE_PASS
  return ::powf(a, b);
#else
  return vmath::pow(a, b);
#endif
}
KILN_HOST_DEVICE double pow(double a, double b) { return ::pow(a, b); }

// c ? a : b with both a and b computed: on the host a bit blend, which keeps the CPU loop
// vectorisable (GCC turns `c ? f(x) : g(x)` back into a branch it will not if-convert).
template <class T>
KILN_HOST_DEVICE T select(bool c, T a, T b) {
#if KILN_DEVICE_PASS
  return c ? a : b;
#else
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return vmath::select(c, a, b);
  else return c ? a : b;
#endif
}

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
