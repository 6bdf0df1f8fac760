// Elementwise expressions on the CPU executor against scalar fp64 references computed here:
// every op, broadcasting, strided views as operands and destinations, in-place updates, aliasing
// and shape errors, fused against force_eager, and every functor's derivative against central
// differences.
//
// Inputs are random with a fresh seed per run; the seed is printed with every failure. Set
// KILN_TEST_SEED=<n> to replay a failing run.
#include <kiln.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using kiln::dyn;
using kiln::host;
using kiln::index_t;

template <class T>
using Vec = kiln::Tensor<T, host, dyn>;
template <class T>
using Mat = kiln::Tensor<T, host, dyn, dyn>;

std::uint32_t test_seed() {
  if (const char* s = std::getenv("KILN_TEST_SEED")) return std::uint32_t(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

// Uniform in [lo, hi]; with avoid_zero, values within 0.25 of zero are pushed out to +-0.25 so
// divisions and reciprocals stay well conditioned; with discrete, integers only (so comparisons
// see ties).
struct Domain {
  double lo = -3, hi = 3;
  bool avoid_zero = false;
  bool discrete = false;
};

template <class T>
void fill(T* p, index_t n, const Domain& d, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(d.lo, d.hi);
  for (index_t i = 0; i < n; ++i) {
    double v = u(rng);
    if (d.discrete) v = std::round(v);
    if (d.avoid_zero && std::abs(v) < 0.25) v = v < 0 ? -0.25 : 0.25;
    p[i] = T(v);
  }
}
template <class Tn>
void fill(Tn& t, const Domain& d, std::mt19937& rng) {
  fill(t.data(), t.size(), d, rng);
}

// A relative tolerance per element type: a few ulps of float (2e-6 is 17 ulps), or of double.
// Relative, so that small results are checked as closely as large ones: softplus(-20) = 2e-9
// computed as log(1 + exp(x)), or gelu(-6) = -6e-9 returned as 0, must fail. The absolute floor
// only forgives results below the smallest normal number (flushed or denormal).
template <class T>
constexpr double tol() {
  return std::is_same_v<T, float> ? 2e-6 : 1e-13;
}
// `terms`: the size of the terms an expression of several operations adds, whose rounding
// (one float product, say) survives their cancellation: the bound becomes tol * (|ref| + terms).
bool close(double got, double ref, double tol, double terms = 0) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  const double floor = tol < 1e-9 ? 2.3e-308 : 1.2e-38;
  return std::abs(got - ref) <= tol * (std::abs(ref) + terms) + floor;
}

// Checks got[i] against ref(i) for all i and reports the first mismatch (one CHECK, not one per
// element, so a million-element failure stays readable). `terms` is one size for every element,
// or a function of i where the terms' size varies with the input.
template <class Got, class Ref, class Terms = double>
void check_all(index_t n, Got got, Ref ref, double tolerance, Terms terms = 0) {
  auto terms_at = [&](index_t i) {
    if constexpr (std::is_arithmetic_v<Terms>) return double(terms);
    else return double(terms(i));
  };
  index_t bad = 0, first = -1;
  for (index_t i = 0; i < n; ++i) {
    if (!close(double(got(i)), ref(i), tolerance, terms_at(i))) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad) {
    INFO("first mismatch at " << first << ": got " << double(got(first)) << ", reference " << ref(first));
    CHECK(bad == 0);
  }
}

const std::vector<index_t> small_sizes{0, 1, 7, 31};
constexpr index_t big_size = 1000003;

// ---- references, written independently of kiln's functors --------------------------------------
double ref_sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
// Both GELUs in forms that keep their lower tail (1 + erf(x/√2) and 1 + tanh u cancel for x << 0,
// which a relative check at double precision sees).
double ref_gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double ref_gelu_tanh(double x) {
  const double k = std::sqrt(2 / 3.14159265358979323846);
  return x / (1 + std::exp(-2 * k * (x + 0.044715 * x * x * x)));  // ½x(1 + tanh u) = x σ(2u)
}

template <class T>
struct UnaryCase {
  const char* name;
  Domain domain;
  std::function<double(double)> ref;
  std::function<void(kiln::CpuExecutor&, Vec<T>&, const Vec<T>&)> run;
  bool big = false;  // also run at big_size
};

template <class T>
std::vector<UnaryCase<T>> unary_cases() {
  using E = kiln::CpuExecutor;
  const Domain any{-3, 3}, pos{0.1, 10}, wide{-15, 15};
  return {
      {"neg", any, [](double x) { return -x; }, [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, -x, e); }},
      {"abs", any, [](double x) { return std::abs(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::abs(x), e); }},
      {"square", any, [](double x) { return x * x; },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::square(x), e); }},
      {"exp", {-8, 8}, [](double x) { return std::exp(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::exp(x), e); }, true},
      {"log", pos, [](double x) { return std::log(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::log(x), e); }},
      {"log1p", {-0.9, 5}, [](double x) { return std::log1p(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::log1p(x), e); }},
      {"sqrt", pos, [](double x) { return std::sqrt(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::sqrt(x), e); }},
      {"rsqrt", pos, [](double x) { return 1 / std::sqrt(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::rsqrt(x), e); }},
      {"reciprocal", {-4, 4, true}, [](double x) { return 1 / x; },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::reciprocal(x), e); }},
      {"sin", {-6, 6}, [](double x) { return std::sin(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::sin(x), e); }},
      {"cos", {-6, 6}, [](double x) { return std::cos(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::cos(x), e); }},
      {"tanh", {-6, 6}, [](double x) { return std::tanh(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::tanh(x), e); }},
      {"sigmoid", wide, ref_sigmoid, [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::sigmoid(x), e); },
       true},
      {"relu", any, [](double x) { return x > 0 ? x : 0; },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::relu(x), e); }},
      {"gelu", {-6, 6}, ref_gelu, [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::gelu(x), e); }},
      {"gelu_tanh", {-6, 6}, ref_gelu_tanh,
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::gelu_tanh(x), e); }},
      {"silu", wide, [](double x) { return x * ref_sigmoid(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::silu(x), e); }},
      {"softplus", wide, [](double x) { return std::log1p(std::exp(x)); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::softplus(x), e); }},
      {"identity", any, [](double x) { return x; },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::identity(x), e); }},
      {"pow(x, 2.5)", {0, 4}, [](double x) { return std::pow(x, 2.5); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::pow(x, 2.5), e); }},
      {"pow(x, -0.5)", pos, [](double x) { return 1 / std::sqrt(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::pow(x, -0.5), e); }},
      {"pow(x, 3.0) of negatives", any, [](double x) { return x * x * x; },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::pow(x, 3.0), e); }},
      {"clamp(x, -0.5, 0.75)", any, [](double x) { return x < -0.5 ? -0.5 : (x > 0.75 ? 0.75 : x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::clamp(x, -0.5, 0.75), e); }},
      {"leaky_relu(x)", any, [](double x) { return x > 0 ? x : 0.01 * x; },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::leaky_relu(x), e); }},
      {"leaky_relu(x, 0.2)", any, [](double x) { return x > 0 ? x : 0.2 * x; },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::leaky_relu(x, 0.2), e); }},
  };
}

template <class T>
struct BinaryCase {
  const char* name;
  Domain da, db;
  std::function<double(double, double)> ref;
  std::function<void(kiln::CpuExecutor&, Vec<T>&, const Vec<T>&, const Vec<T>&)> run;
  bool big = false;
};

template <class T>
std::vector<BinaryCase<T>> binary_cases() {
  using E = kiln::CpuExecutor;
  using V = Vec<T>;
  const Domain any{-3, 3}, ints{-2, 2, false, true};
  return {
      {"add", any, any, [](double a, double b) { return a + b; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, a + b, e); }, true},
      {"sub", any, any, [](double a, double b) { return a - b; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, a - b, e); }},
      {"mul", any, any, [](double a, double b) { return a * b; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, a * b, e); }},
      {"div", any, {-4, 4, true}, [](double a, double b) { return a / b; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, a / b, e); }},
      {"maximum", any, any, [](double a, double b) { return a > b ? a : b; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::maximum(a, b), e); }, true},
      {"minimum", any, any, [](double a, double b) { return a < b ? a : b; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::minimum(a, b), e); }},
      {"pow", {0.1, 4}, {-2, 2}, [](double a, double b) { return std::pow(a, b); },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::pow(a, b), e); }},
      {"lt", ints, ints, [](double a, double b) { return a < b ? 1.0 : 0.0; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::lt(a, b), e); }},
      {"le", ints, ints, [](double a, double b) { return a <= b ? 1.0 : 0.0; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::le(a, b), e); }},
      {"gt", ints, ints, [](double a, double b) { return a > b ? 1.0 : 0.0; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::gt(a, b), e); }},
      {"ge", ints, ints, [](double a, double b) { return a >= b ? 1.0 : 0.0; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::ge(a, b), e); }},
      {"eq", ints, ints, [](double a, double b) { return a == b ? 1.0 : 0.0; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::eq(a, b), e); }},
      {"ne", ints, ints, [](double a, double b) { return a != b ? 1.0 : 0.0; },
       [](E& e, V& y, const V& a, const V& b) { kiln::assign(y, kiln::ne(a, b), e); }},
      // where is ternary; the condition takes the place of a (ints: about 1 in 5 is zero).
      {"where(c, a, b)", ints, any, [](double c, double b) { return c != 0 ? 2 * b : -b; },
       [](E& e, V& y, const V& c, const V& b) { kiln::assign(y, kiln::where(c, b * 2, -b), e); }, true},
      {"where(c, 1.5, b)", ints, any, [](double c, double b) { return c != 0 ? 1.5 : b; },
       [](E& e, V& y, const V& c, const V& b) { kiln::assign(y, kiln::where(c, 1.5, b), e); }},
  };
}

// Correct rounding of x (a normal value of the format) to `bits` significant bits, ties to even.
double round_to_bits(double x, int bits) {
  if (x == 0) return x;
  int e;
  std::frexp(x, &e);
  const double scale = std::ldexp(1.0, bits - e);
  return std::nearbyint(x * scale) / scale;
}

}  // namespace

TEST_CASE_TEMPLATE("unary ops match an fp64 reference", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed << " (KILN_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  for (const auto& op : unary_cases<T>()) {
    INFO("op = " << std::string(op.name));
    std::vector<index_t> sizes = small_sizes;
    if (op.big) sizes.push_back(big_size);
    for (index_t n : sizes) {
      INFO("n = " << n);
      Vec<T> x(n), y(n);
      fill(x, op.domain, rng);
      op.run(exec, y, x);
      check_all(n, [&](index_t i) { return y(i); }, [&](index_t i) { return op.ref(double(x(i))); }, tol<T>());
    }
  }
}

// Where a careless formula loses its digits: softplus as log(1 + e^x) far below 0, log1p as
// log(1 + x) near 0, gelu through 1 + erf, sigmoid / tanh / silu far out. Checked relatively, so
// a result that is 20% off at 3e-7, or 0 instead of -6e-9, fails.
TEST_CASE_TEMPLATE("unary ops keep their tails: tiny results checked relatively", T, float, double) {
  kiln::CpuExecutor exec(1);
  struct Tail {
    const char* name;
    std::vector<double> points;
    std::function<double(double)> ref;
    std::function<void(kiln::CpuExecutor&, Vec<T>&, const Vec<T>&)> run;
  };
  using E = kiln::CpuExecutor;
  const std::vector<Tail> tails{
      // Above 20 softplus is x itself (PyTorch's threshold; 25 + 1.4e-11 is 25 in float anyway).
      {"softplus", {-15, -17.5, -20, -25, -30, -60, 15, 25, 30, 60},
       [](double x) { return x > 20 ? x : std::log1p(std::exp(x)); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::softplus(x), e); }},
      {"log1p", {1e-6, -1e-6, 1e-10, -3e-8, 1e-20, 0.5}, [](double x) { return std::log1p(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::log1p(x), e); }},
      {"exp", {-20, -40, -80, -0.001, 1e-7, 80}, [](double x) { return std::exp(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::exp(x), e); }},
      {"gelu", {-6, -7, -8, -9, -1e-6, 6, 9}, ref_gelu,
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::gelu(x), e); }},
      {"gelu_tanh", {-5, -6, -7, -1e-6, 6}, ref_gelu_tanh,
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::gelu_tanh(x), e); }},
      {"sigmoid", {-30, -50, -80, 30, 50, 1e-7}, ref_sigmoid,
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::sigmoid(x), e); }},
      {"tanh", {1e-4, -1e-5, 1e-9, 10, -20, 40}, [](double x) { return std::tanh(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::tanh(x), e); }},
      {"silu", {-30, -50, -80, 30, 1e-7}, [](double x) { return x * ref_sigmoid(x); },
       [](E& e, Vec<T>& y, const Vec<T>& x) { kiln::assign(y, kiln::silu(x), e); }},
  };
  for (const Tail& t : tails) {
    INFO("op = " << std::string(t.name));
    const index_t n = index_t(t.points.size());
    Vec<T> x(n), y(n);
    for (index_t i = 0; i < n; ++i) x(i) = T(t.points[std::size_t(i)]);
    t.run(exec, y, x);
    for (index_t i = 0; i < n; ++i) {
      const double want = t.ref(double(x(i)));
      INFO("x = " << double(x(i)) << ": got " << double(y(i)) << ", reference " << want);
      CHECK(close(double(y(i)), want, tol<T>()));
    }
  }
}

TEST_CASE_TEMPLATE("binary and ternary ops match an fp64 reference", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed << " (KILN_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  for (const auto& op : binary_cases<T>()) {
    INFO("op = " << std::string(op.name));
    std::vector<index_t> sizes = small_sizes;
    if (op.big) sizes.push_back(big_size);
    for (index_t n : sizes) {
      INFO("n = " << n);
      Vec<T> a(n), b(n), y(n);
      fill(a, op.da, rng);
      fill(b, op.db, rng);
      op.run(exec, y, a, b);
      check_all(n, [&](index_t i) { return y(i); }, [&](index_t i) { return op.ref(double(a(i)), double(b(i))); },
                tol<T>());
    }
  }
}

TEST_CASE_TEMPLATE("scalar operands on either side", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  const index_t n = 31;
  Vec<T> x(n), y(n);
  fill(x, {-3, 3, true}, rng);
  auto check = [&](const char* what, auto ref) {
    INFO(std::string(what));
    check_all(n, [&](index_t i) { return y(i); }, [&](index_t i) { return ref(double(x(i))); }, tol<T>());
  };
  kiln::assign(y, 2.0 - x, exec);
  check("2 - x", [](double v) { return 2 - v; });
  kiln::assign(y, 3 / x, exec);
  check("3 / x", [](double v) { return 3 / v; });
  kiln::assign(y, x / 4, exec);
  check("x / 4", [](double v) { return v / 4; });
  kiln::assign(y, kiln::maximum(x, 0.5f), exec);
  check("maximum(x, 0.5)", [](double v) { return v > 0.5 ? v : 0.5; });
  kiln::assign(y, kiln::minimum(-1, x), exec);
  check("minimum(-1, x)", [](double v) { return v < -1 ? v : -1; });
  kiln::assign(y, kiln::pow(2.0, x), exec);
  check("pow(2, x)", [](double v) { return std::exp2(v); });
  kiln::assign(y, kiln::gt(x, 0), exec);
  check("gt(x, 0)", [](double v) { return v > 0 ? 1 : 0; });
  kiln::assign(y, 1.25, exec);
  check("y = 1.25", [](double) { return 1.25; });
  // The classic 5-op chain with scalars, against its reference.
  kiln::assign(y, kiln::maximum(x * 2.0f + 1, 0.0f) * 3 - 1, exec);
  // The product 3·max(2x + 1, 0) is rounded before the 1 cancels most of it (2x + 1 near 1/3 leaves
  // a result near 0): the bound takes the terms' size, element by element.
  {
    INFO("max(2x + 1, 0) * 3 - 1");
    auto product = [&](index_t i) { return std::max(2 * double(x(i)) + 1, 0.0) * 3; };
    check_all(n, [&](index_t i) { return y(i); }, [&](index_t i) { return product(i) - 1; }, tol<T>(),
              [&](index_t i) { return product(i) + 1; });
  }
  // A rank-0 tensor as destination and as operand.
  kiln::Tensor<T, host> s, t;
  kiln::assign(s, 4.5, exec);
  kiln::assign(t, kiln::sqrt(s) * 2, exec);
  CHECK(double(t()) == doctest::Approx(2 * std::sqrt(4.5)));
  kiln::assign(y, x * s, exec);
  check("x * rank-0 tensor", [](double v) { return v * 4.5; });
}

TEST_CASE("casts round through f16, bf16 and double") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  for (index_t n : {index_t(0), index_t(1), index_t(7), index_t(31), big_size}) {
    INFO("n = " << n);
    Vec<float> x(n), y(n);
    // Inside f16's normal range (and far from its overflow), where the reference is plain rounding.
    fill(x, {-1000, 1000, true}, rng);
    kiln::assign(y, kiln::cast<kiln::f16>(x), exec);
    check_all(n, [&](index_t i) { return y(i); }, [&](index_t i) { return round_to_bits(x(i), 11); }, 0);
    kiln::assign(y, kiln::cast<kiln::bf16>(x), exec);
    check_all(n, [&](index_t i) { return y(i); }, [&](index_t i) { return round_to_bits(x(i), 8); }, 0);
    // Into half-precision tensors: the stored value is the rounded one.
    Vec<kiln::f16> h(n);
    kiln::assign(h, kiln::cast<kiln::f16>(x), exec);
    check_all(n, [&](index_t i) { return float(h(i)); }, [&](index_t i) { return round_to_bits(x(i), 11); }, 0);
    Vec<kiln::bf16> hb(n);
    kiln::assign(hb, x, exec);  // an implicit conversion rounds the same way
    check_all(n, [&](index_t i) { return float(hb(i)); }, [&](index_t i) { return round_to_bits(x(i), 8); }, 0);
    // Half operands compute in float.
    kiln::assign(y, h * 2.0f + 1, exec);
    check_all(n, [&](index_t i) { return y(i); }, [&](index_t i) { return double(float(h(i)) * 2.0f + 1.0f); }, 0);
  }
  // cast<double> makes the rest of the expression compute in double: 1 + 1e-9 survives in double.
  Vec<float> x(7);
  Vec<double> yd(7);
  fill(x, {-3, 3}, rng);
  kiln::assign(yd, kiln::cast<double>(x) + 1e-9, exec);
  check_all(7, [&](index_t i) { return yd(i); }, [&](index_t i) { return double(x(i)) + 1e-9; }, 0);
  // Rounding to f16 loses precision in a float expression, then the expression goes on in float.
  kiln::Tensor<float, host, dyn> one(1), out(1);
  one(0) = 1.0f + 1.0f / 4096;  // not representable in f16 (11 bits): rounds to 1
  kiln::assign(out, kiln::cast<kiln::f16>(one) - 1, exec);
  CHECK(out(0) == 0.0f);
  // f16's overflow: above 65504 (plus half an ulp) the value becomes inf.
  one(0) = 70000.0f;
  kiln::assign(out, kiln::cast<kiln::f16>(one), exec);
  CHECK(std::isinf(out(0)));
}

TEST_CASE("mixed element types compute in the wider type") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  Vec<float> a(31), y(31);
  Vec<double> b(31), yd(31);
  fill(a, {-3, 3}, rng);
  fill(b, {-3e-8, 3e-8}, rng);
  kiln::assign(yd, a + b, exec);
  check_all(31, [&](index_t i) { return yd(i); }, [&](index_t i) { return double(a(i)) + b(i); }, 0);
  kiln::assign(y, a + b, exec);  // computed in double, rounded once to float
  check_all(31, [&](index_t i) { return y(i); }, [&](index_t i) { return double(float(double(a(i)) + b(i))); }, 0);
}

TEST_CASE_TEMPLATE("broadcasting: scalar, row vector over rows, column over columns", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec(2);
  // Small, parallel over rows (300 * 257 > the grain), and one long row (parallel over columns).
  for (auto [R, C] : {std::pair<index_t, index_t>{5, 7}, {1, 1}, {300, 257}, {1, 100003}, {0, 4}, {3, 0}}) {
    INFO("shape = [" << R << ", " << C << "]");
    Mat<T> x(R, C), y(R, C), col(R, 1), row1(1, C);
    Vec<T> row(C);
    fill(x, {}, rng);
    fill(row, {}, rng);
    fill(col, {}, rng);
    fill(row1, {}, rng);
    auto at = [&](auto&& ref) {
      return [&, ref](index_t i) { return ref(i / std::max<index_t>(C, 1), i % std::max<index_t>(C, 1)); };
    };
    auto got = [&](index_t i) { return y.data()[i]; };
    kiln::assign(y, x * 2 + row, exec);
    check_all(R * C, got, at([&](index_t r, index_t c) { return 2 * double(x(r, c)) + row(c); }), tol<T>());
    kiln::assign(y, x - col, exec);
    check_all(R * C, got, at([&](index_t r, index_t c) { return double(x(r, c)) - col(r, 0); }), tol<T>());
    kiln::assign(y, row1 * x + col, exec);
    // A rounded product, then a sum that may cancel it: checked against the terms' size.
    check_all(R * C, got, at([&](index_t r, index_t c) { return double(row1(0, c)) * x(r, c) + col(r, 0); }), tol<T>(),
              1.0);
    // Only broadcast leaves: a row plus a column is an outer sum.
    kiln::assign(y, row + col, exec);
    check_all(R * C, got, at([&](index_t r, index_t c) { return double(row(c)) + col(r, 0); }), tol<T>());
    // A scalar to every element, and a broadcast destination-shaped copy of a row.
    kiln::assign(y, 3, exec);
    check_all(R * C, got, at([&](index_t, index_t) { return 3.0; }), 0);
    kiln::assign(y, row, exec);
    check_all(R * C, got, at([&](index_t, index_t c) { return double(row(c)); }), 0);
  }
}

TEST_CASE("broadcasting a rank-3 operand and static extents") {
  kiln::CpuExecutor exec;
  kiln::Tensor<float, host, dyn, 3, 4> x(2, 3, 4), y(2, 3, 4);
  kiln::Tensor<float, host, 4> row;
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = float(i);
  for (index_t i = 0; i < 4; ++i) row(i) = float(10 * i);
  kiln::assign(y, x + row, exec);
  for (index_t a = 0; a < 2; ++a)
    for (index_t b = 0; b < 3; ++b)
      for (index_t c = 0; c < 4; ++c) CHECK(y(a, b, c) == x(a, b, c) + row(c));
  // A static [dyn, 1]-shaped column over a [dyn, 4] matrix.
  kiln::Tensor<float, host, dyn, 1> col(3, 1);
  kiln::Tensor<float, host, dyn, 4> m(3, 4), out(3, 4);
  for (index_t i = 0; i < 12; ++i) m.data()[i] = float(i);
  for (index_t i = 0; i < 3; ++i) col(i, 0) = float(100 * i);
  kiln::assign(out, m * col, exec);
  for (index_t r = 0; r < 3; ++r)
    for (index_t c = 0; c < 4; ++c) CHECK(out(r, c) == m(r, c) * col(r, 0));
}

TEST_CASE_TEMPLATE("strided views as operands", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec(2);
  for (auto [R, C] : {std::pair<index_t, index_t>{5, 7}, {1, 9}, {600, 300}}) {
    INFO("shape = [" << R << ", " << C << "]");
    Mat<T> a(C, R), b(R, C), wide(R, C + 5), y(R, C);
    fill(a, {}, rng);
    fill(b, {}, rng);
    fill(wide, {}, rng);
    auto got = [&](index_t i) { return y.data()[i]; };
    auto at = [&](auto ref) { return [&, ref](index_t i) { return ref(i / C, i % C); }; };

    const auto at_ = kiln::transpose(a.view());
    CHECK(at_.is_contiguous() == (R == 1 || C == 1));
    kiln::assign(y, at_ * 2 + b, exec);
    check_all(R * C, got, at([&](index_t r, index_t c) { return 2 * double(a(c, r)) + b(r, c); }), tol<T>());
    kiln::assign(y, kiln::exp(at_), exec);
    check_all(R * C, got, at([&](index_t r, index_t c) { return std::exp(double(a(c, r))); }), tol<T>());

    const auto cols = kiln::columns(wide.view(), 2, 2 + C);
    kiln::assign(y, cols - kiln::transpose(a.view()), exec);
    check_all(R * C, got, at([&](index_t r, index_t c) { return double(wide(r, c + 2)) - a(c, r); }), tol<T>());

    // rows() of a transposed view: strided both ways.
    if (R >= 3) {
      Mat<T> y2(R - 2, C);
      kiln::assign(y2, kiln::rows(kiln::transpose(a.view()), 1, R - 1) + kiln::rows(b.view(), 2, R), exec);
      check_all((R - 2) * C, [&](index_t i) { return y2.data()[i]; },
                [&](index_t i) { return double(a(i % C, i / C + 1)) + b(i / C + 2, i % C); }, tol<T>());
    }
  }
}

TEST_CASE_TEMPLATE("strided views as destinations leave other elements alone", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec(2);
  for (auto [R, C] : {std::pair<index_t, index_t>{5, 7}, {400, 300}}) {
    INFO("shape = [" << R << ", " << C << "]");
    Mat<T> x(R, C), yt(C, R), before(C, R);
    fill(x, {}, rng);
    fill(yt, {}, rng);
    // transpose as destination: yt^T = 2x + 1.
    kiln::assign(kiln::transpose(yt.view()), x * 2 + 1, exec);
    check_all(R * C, [&](index_t i) { return yt(i % C, i / C); },
              [&](index_t i) { return 2 * double(x(i / C, i % C)) + 1; }, tol<T>());

    // columns as destination: only columns [1, 4) change.
    Mat<T> w(R, C + 6);
    fill(w, {}, rng);
    Mat<T> w0 = kiln::clone(w);
    Mat<T> src(R, 3);
    fill(src, {}, rng);
    kiln::assign(kiln::columns(w.view(), 1, 4), kiln::tanh(src), exec);
    for (index_t r = 0; r < R; ++r)
      for (index_t c = 0; c < C + 6; ++c) {
        const double want = (c >= 1 && c < 4) ? std::tanh(double(src(r, c - 1))) : double(w0(r, c));
        if (!close(double(w(r, c)), want, tol<T>())) {
          INFO("w(" << r << ", " << c << ") = " << double(w(r, c)) << ", want " << want);
          CHECK(false);
          r = R;
          break;
        }
      }

    // rows of a transpose as destination.
    fill(yt, {}, rng);
    Mat<T> yt0 = kiln::clone(yt);
    kiln::assign(kiln::rows(kiln::transpose(yt.view()), 1, 3), 7, exec);
    check_all(C * R, [&](index_t i) { return yt.data()[i]; },
              [&](index_t i) { return (i % R >= 1 && i % R < 3) ? 7.0 : double(yt0.data()[i]); }, 0);
  }
}

TEST_CASE("rank-3 transposed views can be evaluated (copied to a contiguous tensor)") {
  // transpose() accepts any rank >= 2, and the AliasError / ShapeError texts advise copying a
  // strided view "to a contiguous tensor first"; that copy must itself work.
  kiln::CpuExecutor exec;
  kiln::Tensor<float, host, dyn, dyn, dyn> a(2, 3, 4), b(2, 4, 3);
  for (index_t i = 0; i < a.size(); ++i) a.data()[i] = float(i);
  REQUIRE_NOTHROW(kiln::assign(b, kiln::transpose(a.view()), exec));
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 4; ++j)
      for (index_t k = 0; k < 3; ++k) CHECK(b(i, j, k) == a(i, k, j));
  // And as a destination.
  kiln::Tensor<float, host, dyn, dyn, dyn> c(2, 3, 4);
  REQUIRE_NOTHROW(kiln::assign(kiln::transpose(c.view()), b * 2, exec));
  for (index_t i = 0; i < c.size(); ++i) CHECK(c.data()[i] == 2 * a.data()[i]);
}

TEST_CASE("a matrix assigned to a [1, R, C] destination (a missing leading dimension of size 1)") {
  kiln::CpuExecutor exec;
  Mat<float> x(3, 4);
  for (index_t i = 0; i < 12; ++i) x.data()[i] = float(i);
  kiln::Tensor<float, host, dyn, dyn, dyn> y(1, 3, 4);
  // Strided, so the evaluator folds the leading dimensions (the contiguous case is flat).
  Mat<float> xt(4, 3);
  kiln::assign(xt, kiln::transpose(x.view()), exec);
  REQUIRE_NOTHROW(kiln::assign(y, kiln::transpose(xt.view()) * 2, exec));
  for (index_t r = 0; r < 3; ++r)
    for (index_t c = 0; c < 4; ++c) CHECK(y(0, r, c) == 2 * x(r, c));
  REQUIRE_NOTHROW(kiln::assign(y, x + kiln::transpose(xt.view()), exec));
  for (index_t r = 0; r < 3; ++r)
    for (index_t c = 0; c < 4; ++c) CHECK(y(0, r, c) == 2 * x(r, c));
}

TEST_CASE_TEMPLATE("in-place updates read each element before writing it", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec(2);
  for (index_t n : {index_t(7), big_size}) {
    Vec<T> x(n), y(n);
    fill(x, {}, rng);
    fill(y, {}, rng);
    Vec<T> x0 = kiln::clone(x);
    kiln::assign(x, x * 2 + y, exec);
    check_all(n, [&](index_t i) { return x(i); }, [&](index_t i) { return 2 * double(x0(i)) + y(i); }, tol<T>());
    kiln::assign(x, kiln::maximum(x, y) - x, exec);  // the same buffer read twice
    check_all(n, [&](index_t i) { return x(i); },
              [&](index_t i) {
                const double v = 2 * double(x0(i)) + y(i);
                return std::max(v, double(y(i))) - v;
              },
              tol<T>(), 3.0);  // x holds 2 x0 + y rounded; the difference may cancel that rounding
  }
  // The same strided walk on both sides is in place too.
  Mat<T> m(6, 6);
  fill(m, {}, rng);
  Mat<T> m0 = kiln::clone(m);
  kiln::assign(kiln::transpose(m.view()), kiln::transpose(m.view()) * 3, exec);
  check_all(36, [&](index_t i) { return m.data()[i]; }, [&](index_t i) { return 3 * double(m0.data()[i]); }, tol<T>());
  kiln::assign(kiln::columns(m.view(), 2, 5), kiln::columns(m.view(), 2, 5) + 1, exec);
  for (index_t r = 0; r < 6; ++r)
    for (index_t c = 0; c < 6; ++c)
      CHECK(double(m(r, c)) == doctest::Approx(3 * double(m0(r, c)) + ((c >= 2 && c < 5) ? 1 : 0)));
}

TEST_CASE("aliasing that would read overwritten data is an AliasError") {
  kiln::CpuExecutor exec;
  Mat<float> x(4, 4);
  for (index_t i = 0; i < 16; ++i) x.data()[i] = float(i);
  Mat<float> x0 = kiln::clone(x);
  CHECK_THROWS_AS(kiln::assign(x, kiln::transpose(x.view()), exec), kiln::AliasError);
  CHECK_THROWS_AS(kiln::assign(x, kiln::transpose(x.view()) + 1, exec), kiln::AliasError);
  CHECK_THROWS_AS(kiln::assign(kiln::transpose(x.view()), x * 2, exec), kiln::AliasError);
  // Nothing was written before the check.
  for (index_t i = 0; i < 16; ++i) CHECK(x.data()[i] == x0.data()[i]);

  // A shifted window of the same buffer, in either direction.
  Vec<float> v(10);
  for (index_t i = 0; i < 10; ++i) v(i) = float(i);
  kiln::View<float, host, kiln::extents<dyn>> head(v.data(), kiln::Shape{9}), tail(v.data() + 1, kiln::Shape{9});
  CHECK_THROWS_AS(kiln::assign(tail, head, exec), kiln::AliasError);
  CHECK_THROWS_AS(kiln::assign(head, tail * 2, exec), kiln::AliasError);
  // Rows of the same matrix that overlap but start elsewhere.
  CHECK_THROWS_AS(kiln::assign(kiln::rows(x.view(), 0, 2), kiln::rows(x.view(), 1, 3), exec), kiln::AliasError);
  // A broadcast row of the destination itself.
  CHECK_THROWS_AS(kiln::assign(x, x + kiln::rows(x.view(), 0, 1), exec), kiln::AliasError);
  // Disjoint windows of one buffer are fine.
  CHECK_NOTHROW(kiln::assign(kiln::rows(x.view(), 0, 2), kiln::rows(x.view(), 2, 4), exec));
  CHECK(x(0, 0) == 8.0f);
  CHECK(x(1, 3) == 15.0f);
  // A message that says why.
  try {
    kiln::assign(x, kiln::transpose(x.view()), exec);
    FAIL("no AliasError");
  } catch (const kiln::AliasError& e) {
    CHECK(std::string(e.what()).find("overlaps") != std::string::npos);
  }
}

TEST_CASE("mismatched dynamic shapes are a ShapeError naming both shapes") {
  kiln::CpuExecutor exec;
  Mat<float> a(3, 4), b(3, 5), y(3, 4), yt(4, 3);
  auto message = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const kiln::ShapeError& e) {
      return e.what();
    }
    return "no ShapeError";
  };
  {
    const std::string m = message([&] { kiln::assign(y, a + b, exec); });
    INFO(m);
    CHECK(m.find("[3, 4]") != std::string::npos);
    CHECK(m.find("[3, 5]") != std::string::npos);
  }
  {
    const std::string m = message([&] { kiln::assign(yt, a * 2, exec); });
    INFO(m);
    CHECK(m.find("[3, 4]") != std::string::npos);
    CHECK(m.find("[4, 3]") != std::string::npos);
  }
  {
    // A row vector of the wrong length.
    Vec<float> r(5);
    const std::string m = message([&] { kiln::assign(y, a - r, exec); });
    INFO(m);
    CHECK(m.find("[3, 4]") != std::string::npos);
    CHECK(m.find("[5]") != std::string::npos);
  }
  {
    // An expression of higher rank than its destination.
    Vec<float> v(4);
    const std::string m = message([&] { kiln::assign(v, a, exec); });
    INFO(m);
    CHECK(m.find("[3, 4]") != std::string::npos);
    CHECK(m.find("[4]") != std::string::npos);
  }
  CHECK_THROWS_AS(kiln::clamp(a, 1.0, -1.0), kiln::ValueError);
}

TEST_CASE_TEMPLATE("fused and force_eager agree; launches are counted and named", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  for (index_t n : {index_t(0), index_t(31), index_t(100003)}) {
    INFO("n = " << n);
    Vec<T> x(n), fused(n), eager(n);
    fill(x, {}, rng);
    const T a = T(1.5), b = T(-0.25), c = T(3), d = T(0.5);
    auto expr = [&] { return kiln::maximum(x * a + b, 0) * c - d; };

    exec.stats().reset();
    exec.stats().set_recording(true);
    kiln::assign(fused, expr(), exec);
    CHECK(exec.stats().launches() == 1);
    CHECK(exec.stats().launches(kiln::kind::elementwise) == 1);
    REQUIRE(exec.stats().records().size() == 1);
    CHECK(exec.stats().records()[0].name == "fused[mul,add,max,mul,sub]");
    CHECK(exec.stats().records()[0].elements == n);

    exec.stats().reset();
    kiln::assign<kiln::stance::force_eager>(eager, expr(), exec);
    CHECK(exec.stats().launches() == 5);
    const std::vector<std::string> names{"fused[mul]", "fused[add]", "fused[max]", "fused[mul]", "fused[sub]"};
    REQUIRE(exec.stats().records().size() == names.size());
    for (std::size_t i = 0; i < names.size(); ++i) CHECK(exec.stats().records()[i].name == names[i]);
    exec.stats().set_recording(false);

    check_all(n, [&](index_t i) { return eager(i); }, [&](index_t i) { return double(fused(i)); }, tol<T>());
    check_all(n, [&](index_t i) { return fused(i); },
              [&](index_t i) { return std::max(double(x(i)) * a + b, 0.0) * c - d; }, tol<T>(),
              std::abs(c) * (std::abs(a) + std::abs(b)) + std::abs(d));  // the terms' size

    // Without recording the launch is still counted, under a generic name.
    exec.stats().reset();
    kiln::assign(fused, expr(), exec);
    CHECK(exec.stats().launches() == 1);
    CHECK(exec.stats().records().empty());
  }
  // Eager with broadcast operands and a unary, a ternary and a cast in the chain.
  Mat<T> m(5, 7), y1(5, 7), y2(5, 7);
  Vec<T> row(7);
  fill(m, {}, rng);
  fill(row, {}, rng);
  auto expr = [&] { return kiln::where(kiln::gt(m, 0), kiln::exp(m + row), kiln::cast<kiln::bf16>(row) * 2); };
  exec.stats().reset();
  kiln::assign(y1, expr(), exec);
  CHECK(exec.stats().launches() == 1);
  exec.stats().reset();
  kiln::assign<kiln::stance::force_eager>(y2, expr(), exec);
  CHECK(exec.stats().launches() == 6);  // gt, add, exp, cast, mul, where
  check_all(35, [&](index_t i) { return y2.data()[i]; }, [&](index_t i) { return double(y1.data()[i]); }, tol<T>());
}

// ---- derivatives -------------------------------------------------------------------------------

namespace {

// Central difference in fp64; h scaled to x so the truncation and rounding errors both stay
// near 1e-10.
template <class F>
double central(F f, double x) {
  const double h = 1e-5 * std::max(1.0, std::abs(x));
  return (f(x + h) - f(x - h)) / (2 * h);
}
bool deriv_close(double got, double want) { return std::abs(got - want) <= 1e-6 * (1 + std::abs(want)); }

template <class F>
void check_unary_derivative(F f, std::initializer_list<double> points) {
  INFO("functor = " << std::string(F::name));
  for (double x : points) {
    INFO("x = " << x);
    const double fd = central([&](double v) { return f(v); }, x);
    const double d = f.d(x);
    INFO("d = " << d << ", central difference = " << fd);
    CHECK(deriv_close(d, fd));
    // The float instantiation agrees with the double one.
    CHECK(std::abs(double(f.d(float(x))) - d) <= 1e-5 * (1 + std::abs(d)));
  }
}

template <class F>
void check_binary_derivative(F f, std::initializer_list<std::pair<double, double>> points) {
  INFO("functor = " << std::string(F::name));
  for (auto [a, b] : points) {
    INFO("a = " << a << ", b = " << b);
    const double fa = central([&](double v) { return f(v, b); }, a);
    const double fb = central([&](double v) { return f(a, v); }, b);
    INFO("d0 = " << f.d0(a, b) << " vs " << fa << ", d1 = " << f.d1(a, b) << " vs " << fb);
    CHECK(deriv_close(f.d0(a, b), fa));
    CHECK(deriv_close(f.d1(a, b), fb));
  }
}

template <class F>
void check_ternary_derivative(F f, std::initializer_list<std::array<double, 3>> points) {
  INFO("functor = " << std::string(F::name));
  for (auto p : points) {
    const double a = p[0], b = p[1], c = p[2];
    INFO("a = " << a << ", b = " << b << ", c = " << c);
    CHECK(deriv_close(f.d0(a, b, c), central([&](double v) { return f(v, b, c); }, a)));
    CHECK(deriv_close(f.d1(a, b, c), central([&](double v) { return f(a, v, c); }, b)));
    CHECK(deriv_close(f.d2(a, b, c), central([&](double v) { return f(a, b, v); }, c)));
  }
}

}  // namespace

TEST_CASE("unary functor derivatives match central differences") {
  namespace fn = kiln::fn;
  const auto any = {-2.3, -0.7, 0.4, 1.9};
  const auto pos = {0.3, 1.1, 2.7};
  check_unary_derivative(fn::Neg{}, any);
  check_unary_derivative(fn::Abs{}, any);
  check_unary_derivative(fn::Square{}, any);
  check_unary_derivative(fn::Exp{}, any);
  check_unary_derivative(fn::Log{}, pos);
  check_unary_derivative(fn::Log1p{}, {-0.6, 0.3, 2.7});
  check_unary_derivative(fn::Sqrt{}, pos);
  check_unary_derivative(fn::Rsqrt{}, pos);
  check_unary_derivative(fn::Reciprocal{}, any);
  check_unary_derivative(fn::Sin{}, any);
  check_unary_derivative(fn::Cos{}, any);
  check_unary_derivative(fn::Tanh{}, any);
  check_unary_derivative(fn::Sigmoid{}, {-8.0, -2.3, -0.7, 0.4, 1.9, 8.0});
  check_unary_derivative(fn::Relu{}, any);
  check_unary_derivative(fn::GeluErf{}, any);
  check_unary_derivative(fn::GeluTanh{}, any);
  check_unary_derivative(fn::Silu{}, any);
  check_unary_derivative(fn::Softplus{}, {-8.0, -0.7, 0.4, 1.9, 25.0});
  check_unary_derivative(fn::Identity{}, any);
  check_unary_derivative(fn::PowScalar{2.5}, pos);
  check_unary_derivative(fn::PowScalar{3.0}, any);
  check_unary_derivative(fn::PowScalar{-1.5}, pos);
  check_unary_derivative(fn::Clamp{-1.0, 1.0}, {-2.3, -0.7, 0.4, 1.9});
  check_unary_derivative(fn::LeakyRelu{0.1}, any);
}

TEST_CASE("binary and ternary functor derivatives match central differences") {
  namespace fn = kiln::fn;
  const auto pts = {std::pair{-2.3, 0.7}, std::pair{0.4, -1.9}, std::pair{1.3, 2.1}};
  check_binary_derivative(fn::Add{}, pts);
  check_binary_derivative(fn::Sub{}, pts);
  check_binary_derivative(fn::Mul{}, pts);
  check_binary_derivative(fn::Div{}, pts);
  check_binary_derivative(fn::Max{}, pts);
  check_binary_derivative(fn::Min{}, pts);
  check_binary_derivative(fn::Pow{}, {std::pair{0.3, 2.5}, std::pair{1.7, -1.2}, std::pair{2.2, 0.5}});
  for (auto pair : pts) {
    // Comparisons are steps: zero gradient away from the jump.
    check_binary_derivative(fn::Less{}, {pair});
    check_binary_derivative(fn::LessEqual{}, {pair});
    check_binary_derivative(fn::Greater{}, {pair});
    check_binary_derivative(fn::GreaterEqual{}, {pair});
    check_binary_derivative(fn::Equal{}, {pair});
    check_binary_derivative(fn::NotEqual{}, {pair});
  }
  check_ternary_derivative(fn::Where{}, {std::array{1.0, 0.4, -1.9}, std::array{0.0, 0.4, -1.9}});
  check_ternary_derivative(fn::MulAdd{}, {std::array{-2.3, 0.7, 1.1}, std::array{0.4, -1.9, 3.0}});
}

TEST_CASE("subgradients at kinks follow PyTorch") {
  namespace fn = kiln::fn;
  CHECK(fn::Relu{}.d(0.0) == 0.0);
  CHECK(fn::Abs{}.d(0.0) == 0.0);
  CHECK(fn::LeakyRelu{0.1}.d(0.0) == doctest::Approx(0.1));
  CHECK(fn::Clamp{-1.0, 1.0}.d(-1.0) == 1.0);
  CHECK(fn::Clamp{-1.0, 1.0}.d(1.0) == 1.0);
  CHECK(fn::Max{}.d0(2.0, 2.0) == 0.5);
  CHECK(fn::Max{}.d1(2.0, 2.0) == 0.5);
  CHECK(fn::Min{}.d0(2.0, 2.0) == 0.5);
  CHECK(fn::Min{}.d1(2.0, 2.0) == 0.5);
  CHECK(fn::Pow{}.d1(0.0, 2.0) == 0.0);
  CHECK(fn::Pow{}.d1(0.0, 0.0) == 0.0);
  // softplus is linear above its threshold of 20.
  CHECK(fn::Softplus{}(30.0) == 30.0);
  CHECK(fn::Softplus{}.d(30.0) == 1.0);
  // The stable sigmoid neither overflows nor loses its tail.
  CHECK(fn::Sigmoid{}(-200.0) == doctest::Approx(std::exp(-200.0)).epsilon(1e-12));
  CHECK(fn::Sigmoid{}(-90.0f) > 0.0f);
  CHECK(fn::Sigmoid{}(200.0f) == 1.0f);
}

TEST_CASE("maximum, minimum and relu propagate NaN as PyTorch does") {
  kiln::CpuExecutor exec;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  kiln::Tensor<float, kiln::host, 4> a, b, y;
  a(0) = nan; a(1) = 1.f; a(2) = nan; a(3) = -2.f;
  b(0) = 1.f; b(1) = nan; b(2) = nan; b(3) = 3.f;
  kiln::assign(y, kiln::maximum(a, b), exec);
  CHECK(std::isnan(y(0)));
  CHECK(std::isnan(y(1)));
  CHECK(std::isnan(y(2)));
  CHECK(y(3) == 3.f);
  kiln::assign(y, kiln::minimum(a, b), exec);
  CHECK(std::isnan(y(0)));
  CHECK(std::isnan(y(1)));
  CHECK(y(3) == -2.f);
  kiln::assign(y, kiln::relu(a), exec);
  CHECK(std::isnan(y(0)));
  CHECK(y(1) == 1.f);
  CHECK(y(3) == 0.f);
}
