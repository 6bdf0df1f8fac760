// The host math kernels (kiln/expr/vmath_*.hpp) and the functors built on them, against long
// double references, in ULP (units in the last place of the float nearest the exact value; an
// infinite result counts as 2^128, IEEE's convention for overflow).
//
// The sweep walks the whole float range — every `stride`-th bit pattern, both signs, zeros,
// denormals, infinities and NaNs included — plus dense samples where each kernel switches
// method. KILN_VMATH_STRIDE=N takes every N-th float instead (the README's accuracy table is from
// N = 61, two minutes for all; N = 1 walks all 2^32 floats, hours).
#include <kiln.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace vm = kiln::vmath;
using ld = long double;
constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
constexpr float denorm_min = std::numeric_limits<float>::denorm_min();
constexpr float flt_min = std::numeric_limits<float>::min();
constexpr float flt_max = std::numeric_limits<float>::max();

double ulp_error(float got, ld ref) {
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) == std::isnan(got) ? 0 : INFINITY;
  if (std::isinf(ref) && std::isinf(got) && std::signbit(ref) == std::signbit(got)) return 0;
  const ld cap = std::ldexp(ld(1), 128);
  const ld g = std::isinf(got) ? std::copysign(cap, ld(got)) : ld(got);
  // An exact value beyond the float range has inf as its correctly rounded float.
  const ld r = std::fabs(ref) >= cap ? std::copysign(cap, ref) : ref;
  int e = 0;
  std::frexp(std::fabs(r), &e);  // |r| = m·2^e, m in [0.5, 1)
  const ld ulp = std::ldexp(ld(1), std::max(e - 24, -149));
  return double(std::fabs(g - r) / ulp);
}

std::uint32_t stride() {
  if (const char* s = std::getenv("KILN_VMATH_STRIDE")) return std::uint32_t(std::max(1l, std::atol(s)));
  return 4099;  // about a million floats per function: a second each in the CI build
}

// Calls visit(chunk) over the floats a sweep takes, in chunks (an exhaustive sweep would not fit
// in memory at once): strided bit patterns, dense runs around `knots`, and the specials.
template <class Visit>
void sweep(std::initializer_list<float> knots, Visit&& visit, std::uint64_t coarsen = 1) {
  std::vector<float> xs;
  const std::uint64_t step = stride() * coarsen;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += step) {
    xs.push_back(std::bit_cast<float>(std::uint32_t(u)));
    if (xs.size() == (1u << 20)) visit(xs), xs.clear();
  }
  for (float k : knots)
    for (float s : {1.f, -1.f}) {
      float x = s * k;
      for (int i = 0; i < 2000; ++i) x = std::nextafter(x, -inf);
      for (int i = 0; i < 4000; ++i) xs.push_back(x = std::nextafter(x, inf));
    }
  for (float x : {0.f, -0.f, denorm_min, -denorm_min, flt_min, -flt_min, flt_max, -flt_max, inf, -inf, qnan, -qnan})
    xs.push_back(x);
  visit(xs);
}

struct Worst {
  double ulp = 0;
  float x = 0, got = 0;
  ld ref = 0;
};

// The largest ULP error of f against ref over a sweep, f evaluated through a plain loop like
// the fused one (so this checks the code the vectoriser produced).
template <class F, class R>
Worst worst_over(std::initializer_list<float> knots, F f, R ref, std::uint64_t coarsen = 1) {
  Worst w;
  std::vector<float> got;
  sweep(knots, [&](const std::vector<float>& xs) {
    got.resize(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) got[i] = f(xs[i]);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double e = ulp_error(got[i], ref(ld(xs[i])));
      if (e > w.ulp) w = {e, xs[i], got[i], ref(ld(xs[i]))};
    }
  }, coarsen);
  return w;
}

// Checks f's largest ULP error over a sweep with dense runs around `knots`, and reports it.
template <class F, class R>
void check_ulp(const char* name, double bound, F f, R ref, std::initializer_list<float> knots) {
  const Worst w = worst_over(knots, f, ref);
  MESSAGE(std::string(name) << ": max " << w.ulp << " ULP at x = " << w.x << " (got " << w.got << ", exact " << double(w.ref)
               << "), stride " << stride());
  CHECK_MESSAGE(w.ulp <= bound, std::string(name) << " exceeds " << bound << " ULP at x = " << w.x);
}

ld sigmoid_ref(ld x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

TEST_CASE("vmath: exp, log, log1p, tanh over the float range, in ULP") {
  check_ulp("exp", 1.5, vm::exp, [](ld x) { return std::exp(x); }, {88.72f, 103.9f, 87.33f, 0.34657f, 1e-7f});
  check_ulp("log", 1.0, vm::log, [](ld x) { return std::log(x); }, {1.f, 0.70710677f, 1.4142135f, flt_min});
  check_ulp("log1p", 2.0, vm::log1p, [](ld x) { return std::log1p(x); }, {1e-6f, 1.f, 0.5f, 1e-30f});
  check_ulp("tanh", 2.0, vm::tanh, [](ld x) { return std::tanh(x); }, {0.625f, 1e-4f, 9.f, 44.36f});
}

TEST_CASE("vmath: erf, erfc and the normal CDF over the float range, in ULP") {
  check_ulp("erf", 3.0, vm::erf, [](ld x) { return std::erf(x); }, {1.f, 1e-3f, 3.9f});
  check_ulp("erfc", 3.0, vm::erfc, [](ld x) { return std::erfc(x); }, {1.f, 4.f, 10.05f});
  check_ulp("norm_cdf", 3.0, vm::norm_cdf, [](ld x) { return 0.5L * std::erfc(-x / std::sqrt(ld(2))); }, {1.4142135f, 6.f, 14.2f});
}

// powl is slow (about 0.5 µs): pow's sweeps take every 16th point of the others'.
TEST_CASE("vmath: pow over bases and exponents, with IEEE pow's special cases") {
  const std::vector<float> exps{0.5f, 2.f, 3.f, -1.f, -2.5f, 1.f / 3, 10.7f, -0.1f, 100.f, 1e-3f, 7.f, -8.f};
  Worst w;
  for (float b : exps) {
    const Worst wb = worst_over({1.f, 2.f}, [b](float a) { return vm::pow(a, b); },
                                [b](ld a) { return std::pow(a, ld(b)); }, 16);
    if (wb.ulp > w.ulp) w = wb;
  }
  MESSAGE("pow: max " << w.ulp << " ULP at a = " << w.x << " (got " << w.got << ", exact " << double(w.ref) << ")");
  CHECK(w.ulp <= 1.0);
  // Exponent sweep at fixed bases.
  for (float a : {0.5f, 1.5f, 2.f, 10.f, -2.f, 1e-20f}) {
    const Worst wa = worst_over({1.f}, [a](float b) { return vm::pow(a, b); },
                                [a](ld b) { return std::pow(ld(a), b); }, 16);
    CHECK_MESSAGE(wa.ulp <= 1.0, "pow(" << a << ", b): " << wa.ulp << " ULP at b = " << wa.x);
  }
  // Every special case of C's pow, against libm's powf (which implements them).
  const float specials[] = {0.f, -0.f, 1.f, -1.f, 0.5f, -0.5f, 2.f, -2.f, 3.f, -3.f, 2.5f, -2.5f, inf, -inf, qnan,
                            denorm_min, -denorm_min, flt_max};
  for (float a : specials)
    for (float b : specials) {
      const float got = vm::pow(a, b), want = std::pow(a, b);
      const bool same = (std::isnan(got) && std::isnan(want)) ||
                        (got == want && std::signbit(got) == std::signbit(want)) ||
                        ulp_error(got, std::pow(ld(a), ld(b))) <= 1.0;
      CHECK_MESSAGE(same, "pow(" << a << ", " << b << ") = " << got << ", C gives " << want);
    }
}

TEST_CASE("vmath: signed zeros, infinities and NaN") {
  CHECK(std::signbit(vm::tanh(-0.f)));
  CHECK(!std::signbit(vm::tanh(0.f)));
  CHECK(vm::tanh(inf) == 1.f);
  CHECK(vm::tanh(-inf) == -1.f);
  CHECK(std::signbit(vm::erf(-0.f)));
  CHECK(vm::erf(-inf) == -1.f);
  CHECK(vm::erfc(-inf) == 2.f);
  CHECK(vm::erfc(inf) == 0.f);
  CHECK(std::signbit(vm::log1p(-0.f)));
  CHECK(vm::log1p(-1.f) == -inf);
  CHECK(std::isnan(vm::log1p(-2.f)));
  CHECK(vm::log(0.f) == -inf);
  CHECK(vm::log(-0.f) == -inf);
  CHECK(std::isnan(vm::log(-denorm_min)));
  CHECK(vm::log(inf) == inf);
  CHECK(vm::exp(-inf) == 0.f);
  CHECK(vm::exp(inf) == inf);
  CHECK(vm::exp(-0.f) == 1.f);
  for (auto f : {vm::exp, vm::log, vm::log1p, vm::tanh, vm::erf, vm::erfc, vm::norm_cdf}) {
    CHECK(std::isnan(f(qnan)));
    CHECK(std::isnan(f(-qnan)));
  }
}

// The functors the fused loops call: value and, for the activations, the tails where a naive
// formula fails (softplus as log(1 + exp(x)), gelu through 1 + erf, sigmoid through 1 − …).
TEST_CASE("functors on float: value accuracy over the range, tails included, in ULP") {
  using namespace kiln::fn;
  check_ulp("sigmoid", 3.5, Sigmoid{}, sigmoid_ref, {88.7f, 103.f, 16.6f, 1e-3f});
  check_ulp("softplus", 3.0, Softplus{},
            [](ld x) { return x > 20 ? x : std::log1p(std::exp(x)); }, {20.f, 15.f, 30.f, 88.f, 103.f});
  check_ulp("silu", 1.0, Silu{}, [](ld x) { return std::isinf(x) ? (x > 0 ? x : -0.L) : x * sigmoid_ref(x); },
            {88.f, 20.f, 1.f});
  check_ulp("gelu (erf)", 3.0, GeluErf{}, [](ld x) { return x == -INFINITY ? -0.L : x * 0.5L * std::erfc(-x / std::sqrt(ld(2))); }, {6.f, 13.f, 1.4142135f});
  check_ulp("gelu (tanh)", 2.0, GeluTanh{},
            [](ld x) {
              const ld u = 0.79788456080286535588L * (x + 0.044715L * x * x * x);
              return x == -INFINITY ? -0.L : x / (1 + std::exp(-2 * u));  // ½·x·(1 + tanh u), no cancellation
            }, {6.f, 3.f, 1.f});
  check_ulp("sqrt", 0.5, Sqrt{}, [](ld x) { return std::sqrt(x); }, {1.f, flt_min});
  check_ulp("rsqrt", 1.5, Rsqrt{}, [](ld x) { return 1 / std::sqrt(x); }, {1.f, flt_min});
  check_ulp("exp functor", 1.5, Exp{}, [](ld x) { return std::exp(x); }, {1.f});
  check_ulp("log functor", 1.0, Log{}, [](ld x) { return std::log(x); }, {1.f});
  check_ulp("tanh functor", 2.0, Tanh{}, [](ld x) { return std::tanh(x); }, {1.f});
  // The points issue 15 names, explicitly.
  CHECK(ulp_error(Softplus{}(-15.f), std::log1p(std::exp(ld(-15)))) <= 3);
  CHECK(ulp_error(Softplus{}(-30.f), std::log1p(std::exp(ld(-30)))) <= 3);
  CHECK(ulp_error(Log1p{}(1e-6f), std::log1p(ld(1e-6f))) <= 2);
  CHECK(ulp_error(Exp{}(-20.f), std::exp(ld(-20))) <= 1);
  CHECK(GeluErf{}(-6.f) < 0.f);
  CHECK(ulp_error(GeluErf{}(-6.f), -3 * std::erfc(6 / std::sqrt(ld(2)))) <= 4);
  CHECK(ulp_error(Sigmoid{}(-90.f), sigmoid_ref(-90)) <= 3);
  CHECK(Tanh{}(30.f) == 1.f);
}
