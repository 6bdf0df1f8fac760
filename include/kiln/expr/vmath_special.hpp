// kiln/expr/vmath_special.hpp — erf, erfc, the normal CDF and pow for float on the host,
// vectorisable like vmath_float.hpp, computed in double inside.
//
// Why double inside: these functions amplify an argument's rounding error. erfc(t) has relative
// sensitivity 2t² to t, so the rounding of t = −x/√2 in float alone costs 36 ULP at gelu(−6);
// pow(a, b) = 2^(b·log2 a) turns the float rounding of b·log2 a (up to 150) into 150·2^-24
// relative error. In double both vanish, and one final rounding to float gives the stated
// accuracy (tests/cpu/test_vmath.cpp): erf, erfc and the normal CDF 3 ULP, pow 1 ULP. Double
// vectors hold half the lanes of float ones: these run at about half the rate of exp.
#pragma once

#include <cstdint>
#include <utility>

#include "kiln/expr/vmath_float.hpp"

namespace kiln::vmath {
namespace detail {

KILN_VMATH double pow2i(std::int64_t n) { return from_bits64(std::uint64_t(n + 1023) << 52); }
constexpr double round_magic64 = 6755399441055744.0;  // 1.5·2^52: adding it rounds to an integer

// e^x for x in [-745, 709] to about 1e-15 (callers clamp): Cody–Waite reduction, degree-11
// Taylor polynomial on |r| <= ln2 / 2, 2^n built from bits.
KILN_VMATH double exp(double x) {
  const double t = x * 1.4426950408889634 + round_magic64;
  const double n = t - round_magic64;
  double r = mul_add(n, -6.93147180369123816490e-01, x);
  r = mul_add(n, -1.90821492927058770002e-10, r);
  const double p = horner(r, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720,
                          1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0);
  const std::int64_t ni = std::int64_t(to_bits64(t) - to_bits64(round_magic64));
  const std::int64_t n1 = ni >> 1;
  return p * pow2i(n1) * pow2i(ni - n1);
}

// 2^x for x in [-200, 200] (callers clamp), to about 1e-15.
KILN_VMATH double exp2(double x) {
  const double t = x + round_magic64;
  const double n = t - round_magic64;
  const double r = (x - n) * 0.69314718055994530942;  // |r| <= ln2 / 2
  const double p = horner(r, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720,
                          1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0);
  return p * pow2i(std::int64_t(to_bits64(t) - to_bits64(round_magic64)));
}

// log2 x for a positive normal double to about 1e-15 relative: x = m·2^e with m in [√½, √2),
// ln m = 2·atanh(s) for s = (m − 1)/(m + 1), |s| <= 0.172, summed to s^17.
KILN_VMATH double log2(double x) {
  const std::uint64_t bits = to_bits64(x);
  double e = double(std::int64_t(bits >> 52) - 1023);
  double m = from_bits64((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  const bool high = m > 1.4142135623730951;
  m = select(high, m * 0.5, m);
  e = select(high, e + 1.0, e);
  const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  const double p = horner(s2, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3, 1.0);
  return mul_add(2.0 * s * p, 1.4426950408889634, e);
}

// erf x for |x| <= 1 by its Taylor series 2/√π · Σ (−1)^k x^(2k+1) / (k!·(2k+1)), k <= 13
// (the first term left out is below 1e-12 at |x| = 1).
KILN_VMATH double erf_small(double x) {
  constexpr int terms = 14;
  constexpr auto coef = [] {
    struct { double c[terms]; } out{};
    double fact = 1;
    for (int k = 0; k < terms; ++k) {
      if (k > 0) fact *= k;
      out.c[k] = (k % 2 ? -1.0 : 1.0) / (fact * (2 * k + 1)) * 1.1283791670955126;  // 2/√π
    }
    return out;
  }();
  return x * [&]<int... K>(std::integer_sequence<int, K...>) {
    return horner(x * x, coef.c[terms - 1 - K]...);
  }(std::make_integer_sequence<int, terms>{});
}

// erfc t for t >= 0 (infinity included) with relative error below 1.2e-7: the Chebyshev fit of
// Numerical Recipes (erfcc, §6.2), t·exp(−z² + P(t)) with t = 1 / (1 + z/2), evaluated in double.
KILN_VMATH double erfc_nonneg(double z) {
  const double zc = select(z > 30.0, 30.0, z);  // erfc(30) is far below the smallest float
  const double t = 1.0 / (1.0 + 0.5 * zc);
  const double p = horner(t, 0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
                          0.37409196, 1.00002368, -1.26551223);
  return t * exp(-zc * zc + p);
}

// erf for any double x (NaN propagates through erf_small).
KILN_VMATH double erf(double x) {
  const double a = __builtin_fabs(x);
  const double small = erf_small(a), big = 1.0 - erfc_nonneg(a);
  const double r = select((a <= 1.0) | (a != a), small, big);
  return __builtin_copysign(r, x);  // odd, and erf(−0) = −0
}
// erfc for any double x: 2 − erfc(|x|) below zero, so no result cancels.
KILN_VMATH double erfc(double x) {
  const double a = __builtin_fabs(x);
  const double small = 1.0 - erf_small(x), tail = erfc_nonneg(a), reflected = 2.0 - tail;
  const double r = select(a <= 1.0, small, select(x < 0, reflected, tail));
  return select(x != x, x, r);
}

}  // namespace detail

KILN_VMATH float erf(float x) { return float(detail::erf(double(x))); }
KILN_VMATH float erfc(float x) { return float(detail::erfc(double(x))); }
// Φ(x) = ½·erfc(−x/√2), the standard normal CDF; accurate in its lower tail (gelu(−6)).
KILN_VMATH float norm_cdf(float x) { return float(0.5 * detail::erfc(double(x) * -0.70710678118654752440)); }

// GELU in both forms, computed in double: x·Φ(x), and x·σ(2u) for the tanh form's
// u = √(2/π)·(x + 0.044715·x³) — in float, the rounding of u alone costs up to 130 ULP where
// σ(2u) is tiny (x near −10), and x·Φ(x) loses bits where Φ(x) is denormal.
KILN_VMATH float gelu_erf(float x) {
  const double xd = x;
  const float r = float(xd * 0.5 * detail::erfc(xd * -0.70710678118654752440));
  return select(x == -__builtin_huge_valf(), -0.f, r);  // the limit, not −inf·0
}
KILN_VMATH float gelu_tanh(float x) {
  const double xd = x;
  const double u2 = 1.5957691216057307118 * (xd + 0.044715 * xd * xd * xd);  // 2u
  const double uc = select(u2 < -745.0, -745.0, select(u2 > 709.0, 709.0, u2));
  const double e = detail::exp(-__builtin_fabs(uc));
  const double lo = e / (1.0 + e), hi = 1.0 / (1.0 + e);
  const float r = float(xd * select(uc >= 0, hi, lo));
  return select(x != x, x, select(x == -__builtin_huge_valf(), -0.f, r));
}

// x·σ(x), in double: where σ(x) is a float denormal (x < −87) the product is still a normal
// float, and a float σ would have lost its bits. −0 where the result underflows and at −inf.
KILN_VMATH float silu(float x) {
  const double xd = x;
  const double a = __builtin_fabs(xd);
  const double e = detail::exp(-select(a > 745.0, 745.0, a));
  const double lo = e / (1.0 + e), hi = 1.0 / (1.0 + e);
  const float r = float(xd * select(xd >= 0, hi, lo));
  return select(x == -__builtin_huge_valf(), -0.f, r);
}

// a^b with IEEE 754 pow's special cases (pow(x, ±0) = 1 and pow(1, y) = 1 even for NaN; a
// negative base gives NaN for a non-integer exponent and the sign of an odd integer one; ±0 and
// ±inf bases give 0 or inf by the exponent's sign).
KILN_VMATH float pow(float a, float b) {
  const float ab = abs(a);
  const double l = detail::log2(double(ab));
  const double y = double(b) * l;
  const double yc = select(y < -200.0, -200.0, select(y > 200.0, 200.0, y));
  float r = float(detail::exp2(yc));
  constexpr float inf = __builtin_huge_valf();
  r = select(ab == 0.f, select(b < 0.f, inf, 0.f), r);
  r = select(ab == inf, select(b < 0.f, 0.f, inf), r);
  r = select((ab == 1.f) & (abs(b) == inf), 1.f, r);
  const bool integer = b == __builtin_truncf(b);
  const bool odd = integer & ((b * 0.5f) != __builtin_truncf(b * 0.5f));
  const bool negative = (to_bits(a) >> 31) != 0;
  r = select(negative & odd, -r, r);
  r = select(negative & !integer & (ab != inf) & (ab != 0.f), __builtin_nanf(""), r);
  r = select(is_nan(a) | is_nan(b), __builtin_nanf(""), r);
  return select((b == 0.f) | (a == 1.f), 1.f, r);
}

}  // namespace kiln::vmath
