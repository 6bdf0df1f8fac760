// kiln/expr/vmath_float.hpp — exp, log, log1p and tanh for float on the host, written so the
// compiler vectorises the loops that call them.
//
// Every choice is a bitwise select() between values both computed: with `c ? a : b` GCC sinks
// the work of each arm into a branch and then, under the default -ftrapping-math, will not
// if-convert it again, and the loop stays scalar.
//
// Why not libm: a call to expf inside a fused loop keeps the loop scalar (one call per element),
// so fusing a transcendental chain made it slower than running it op by op. These are inline,
// branch-free (every special case is a select) and use only +, *, fma, compares and bit moves,
// which GCC and Clang turn into AVX-512 / AVX2 code in the fused loop. The polynomials are
// Cephes' single-precision minimax fits (S. Moshier), as Eigen and SLEEF-style libraries use.
//
// Accuracy, against long double over the float range incl. ±0, denormals, ±inf and NaN
// (tests/cpu/test_vmath.cpp states and checks the bounds): exp 1.5 ULP, log 1 ULP, log1p 2 ULP,
// tanh 2 ULP. Device code never comes here: kiln/expr/math.hpp sends it to CUDA's functions.
#pragma once

#include <bit>
#include <cstdint>

// Forced inline: a fused chain of several of these outgrows GCC's inlining budget, and one
// call left in the loop keeps it scalar (measured: 25x slower than the eager ops).
#if defined(__GNUC__) || defined(__clang__)
#define KILN_VMATH inline __attribute__((always_inline))
#else
#define KILN_VMATH inline
#endif

namespace kiln::vmath {

KILN_VMATH float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
KILN_VMATH std::uint32_t to_bits(float x) { return std::bit_cast<std::uint32_t>(x); }
KILN_VMATH double from_bits64(std::uint64_t u) { return std::bit_cast<double>(u); }
KILN_VMATH std::uint64_t to_bits64(double x) { return std::bit_cast<std::uint64_t>(x); }
KILN_VMATH bool is_nan(float x) { return x != x; }
// x with its sign bit replaced by s's (branch-free copysign that keeps NaN payloads).
KILN_VMATH float with_sign_of(float x, float s) {
  return from_bits((to_bits(x) & 0x7fffffffu) | (to_bits(s) & 0x80000000u));
}
// c ? a : b as a bit blend (both a and b are computed; no branch for the compiler to keep).
KILN_VMATH float select(bool c, float a, float b) {
  const std::uint32_t m = 0u - std::uint32_t(c);
  return from_bits((to_bits(a) & m) | (to_bits(b) & ~m));
}
KILN_VMATH double select(bool c, double a, double b) {
  const std::uint64_t m = 0ull - std::uint64_t(c);
  return from_bits64((to_bits64(a) & m) | (to_bits64(b) & ~m));
}
KILN_VMATH float abs(float x) { return from_bits(to_bits(x) & 0x7fffffffu); }

// c_n·x^n + … + c_1·x + c_0 by Horner's rule, coefficients highest first; a fold, so it
// unrolls completely (a loop inside the vectorised loop would keep it scalar).
// a·b + c, fused where the target has FMA instructions (a libm call where it has none would keep
// the loop scalar, so then it is a multiply and an add).
KILN_VMATH float mul_add(float a, float b, float c) {
#if defined(__FP_FAST_FMAF)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
KILN_VMATH double mul_add(double a, double b, double c) {
#if defined(__FP_FAST_FMA)
  return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}

// c_n·x^n + … + c_1·x + c_0 by Horner's rule, coefficients highest first; a fold, so it
// unrolls completely (a loop inside the vectorised loop would keep it scalar).
template <class T, class... C>
KILN_VMATH T horner(T x, T c_n, C... rest) {
  T p = c_n;
  ((p = mul_add(p, x, T(rest))), ...);
  return p;
}

// 2^n for an integer n in [-126, 127], built from bits.
KILN_VMATH float pow2i(std::int32_t n) { return from_bits(std::uint32_t(n + 127) << 23); }

// e^x: n = round(x / ln 2), r = x − n·ln 2 in two parts (Cody–Waite: n·C1 is exact), e^r by a
// degree-7 polynomial on |r| <= ln2 / 2, then 2^n applied in two halves so that results in the
// denormal range round once and overflow gives inf.
KILN_VMATH float exp(float x) {
  // NaN passes through both compares; clamping keeps n within the two-halves scale's range.
  const float xc = select(x < -104.f, -104.f, select(x > 89.f, 89.f, x));
  constexpr float round_magic = 12582912.f;  // 1.5·2^23: adding it rounds to an integer
  const float t = xc * 1.44269504088896341f + round_magic;
  const float n = t - round_magic;
  float r = mul_add(n, -0.693359375f, xc);
  r = mul_add(n, 2.12194440e-4f, r);
  const float r2 = r * r;
  const float q = horner(r, 1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                         1.6666665459e-1f, 5.0000001201e-1f);
  const float p = mul_add(q, r2, r) + 1.f;
  // t's low mantissa bits hold n (|n| < 2^22); unsigned arithmetic keeps a NaN's garbage defined.
  const std::int32_t ni = std::int32_t(to_bits(t) - to_bits(round_magic));
  const std::int32_t n1 = ni >> 1;
  const float y = p * pow2i(n1) * pow2i(ni - n1);
  return select(is_nan(x), x, y);
}

// ln x: x = m·2^e with m in [√½, √2), ln m = f − f²/2 + f³·P(f) for f = m − 1 (exact), plus e·ln 2
// in two parts. Denormal inputs are scaled by 2^23 first.
KILN_VMATH float log(float x) {
  const bool tiny = x < 1.17549435e-38f;  // below FLT_MIN (also 0 and negatives, fixed below)
  const float scaled = x * 8388608.f;
  const float xs = select(tiny, scaled, x);
  const std::uint32_t bits = to_bits(xs);
  float e = float(std::int32_t((bits >> 23) & 0xffu) - 126) - select(tiny, 23.f, 0.f);
  float m = from_bits((bits & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  const float e_low = e - 1.f, m_low = m + m;
  e = select(low, e_low, e);
  const float f = select(low, m_low, m) - 1.f;
  const float z = f * f;
  const float p = horner(f, 7.0376836292e-2f, -1.1514610310e-1f, 1.1676998740e-1f, -1.2420140846e-1f,
                         1.4249322787e-1f, -1.6668057665e-1f, 2.0000714765e-1f, -2.4999993993e-1f, 3.3333331174e-1f);
  float y = p * f * z;
  y = mul_add(e, -2.12194440e-4f, y);
  y = mul_add(z, -0.5f, y);
  float r = mul_add(e, 0.693359375f, f + y);
  constexpr float inf = __builtin_huge_valf();
  r = select(x == inf, inf, r);
  r = select(x == 0.f, -inf, r);
  return select((x < 0.f) | is_nan(x), __builtin_nanf(""), r);
}

// ln(1 + x) with full relative accuracy near 0: u = 1 + x rounded, then ln u plus the first-order
// correction c/u for the rounding error c = x − (u − 1) (exact, by Sterbenz).
KILN_VMATH float log1p(float x) {
  const float u = 1.f + x;
  const float c = x - (u - 1.f);
  const float r = log(u) + c / u;
  constexpr float inf = __builtin_huge_valf();
  return select(x == inf, inf, select(u == 0.f, -inf, select(u == 1.f, x, r)));  // u == 1: log1p(−0) = −0
}

// tanh x, odd: for |x| < 0.625 a polynomial in x², above it 1 − 2 / (e^{2|x|} + 1) (e^{2|x|}
// overflowing to inf gives exactly 1). The sign is copied last, so tanh(−0) = −0.
KILN_VMATH float tanh(float x) {
  const float a = abs(x);
  const float s = a * a;
  const float p = horner(s, -5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f,
                         -3.33332819422e-1f);
  const float small = mul_add(p * s, a, a);
  const float large = 1.f - 2.f / (exp(a + a) + 1.f);
  return with_sign_of(select(a < 0.625f, small, large), x);
}

}  // namespace kiln::vmath
