// kiln/expr/functors.hpp — elementwise functors: each gives its value and its partial
// derivatives, so the backward of a fused chain can be derived from the forward's type.
//
// Contract: `operator()` computes the value; unary functors give `d(x)` = dy/dx, binary ones
// `d0(a, b)` and `d1(a, b)`, ternary ones `d0..d2`. Where PyTorch picks a subgradient (relu at
// 0, abs at 0, max on ties) kiln picks the same one.
#pragma once

#include <concepts>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/expr/math.hpp"

namespace kiln::fn {

// ---- unary ---------------------------------------------------------------------------------
struct Neg {
  static constexpr const char* name = "neg";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return -x; }
  template <class T> KILN_HOST_DEVICE T d(T) const { return T(-1); }
};
struct Abs {
  static constexpr const char* name = "abs";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::abs(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0)); }
};
struct Square {
  static constexpr const char* name = "square";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return x * x; }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return T(2) * x; }
};
struct Exp {
  static constexpr const char* name = "exp";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::exp(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return math::exp(x); }
};
struct Log {
  static constexpr const char* name = "log";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::log(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return T(1) / x; }
};
struct Log1p {
  static constexpr const char* name = "log1p";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::log1p(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return T(1) / (T(1) + x); }
};
struct Sqrt {
  static constexpr const char* name = "sqrt";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::sqrt(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return T(0.5) / math::sqrt(x); }
};
struct Rsqrt {
  static constexpr const char* name = "rsqrt";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return T(1) / math::sqrt(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return T(-0.5) / (x * math::sqrt(x)); }
};
struct Reciprocal {
  static constexpr const char* name = "reciprocal";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return T(1) / x; }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return T(-1) / (x * x); }
};
struct Sin {
  static constexpr const char* name = "sin";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::sin(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return math::cos(x); }
};
struct Cos {
  static constexpr const char* name = "cos";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::cos(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return -math::sin(x); }
};
struct Tanh {
  static constexpr const char* name = "tanh";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::tanh(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const {
    const T t = math::tanh(x);
    return T(1) - t * t;
  }
};
struct Sigmoid {
  static constexpr const char* name = "sigmoid";
  static constexpr bool costly = true;
  // Written so exp never overflows: for x < 0 use e^x / (1 + e^x).
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    const T e = math::exp(-math::abs(x));
    const T hi = T(1) / (T(1) + e);
    return math::select(x >= T(0), hi, e * hi);
  }
  template <class T> KILN_HOST_DEVICE T d(T x) const {
    const T s = (*this)(x);
    return s * (T(1) - s);
  }
};
struct Relu {
  static constexpr const char* name = "relu";
  // !(x <= 0) keeps NaN (PyTorch's relu propagates it).
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return !(x <= T(0)) ? x : T(0); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return x > T(0) ? T(1) : T(0); }
};
// GELU, exact form: x·Φ(x), with Φ through erfc so the lower tail keeps its precision
// (gelu(−6) = −5.9e-9, where 1 + erf(−6/√2) would cancel to 0).
struct GeluErf {
  static constexpr const char* name = "gelu";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::gelu_erf(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const {
    const T pdf = math::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
    return math::norm_cdf(x) + x * pdf;
  }
};
// GELU, tanh approximation (PyTorch's approximate='tanh'): ½·x·(1 + tanh u) computed as
// x·σ(2u), the same function without the cancellation of 1 + tanh u for x << 0.
struct GeluTanh {
  static constexpr const char* name = "gelu_tanh";
  static constexpr bool costly = true;
  template <class T> static KILN_HOST_DEVICE T inner(T x) {
    return T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  }
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::gelu_tanh(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const {
    const T s = Sigmoid{}(T(2) * inner(x));
    const T du = T(0.79788456080286535588) * (T(1) + T(3) * T(0.044715) * x * x);
    return s + T(2) * x * s * (T(1) - s) * du;
  }
};
struct Silu {
  static constexpr const char* name = "silu";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::silu(x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const {
    const T s = Sigmoid{}(x);
    return s * (T(1) + x * (T(1) - s));
  }
};
// softplus with PyTorch's defaults (beta 1, threshold 20: linear above it).
struct Softplus {
  static constexpr const char* name = "softplus";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    return math::select(x > T(20), x, math::log1p(math::exp(x)));
  }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return math::select(x > T(20), T(1), Sigmoid{}(x)); }
};
// Functors with a parameter carry it as a member (kernels receive it by value).
struct PowScalar {
  static constexpr const char* name = "pow";
  static constexpr bool costly = true;
  double p;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::pow(x, T(p)); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return T(p) * math::pow(x, T(p) - T(1)); }
};
struct Clamp {
  static constexpr const char* name = "clamp";
  double lo, hi;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::min(math::max(x, T(lo)), T(hi)); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return (x >= T(lo) && x <= T(hi)) ? T(1) : T(0); }
};
struct LeakyRelu {
  static constexpr const char* name = "leaky_relu";
  double slope;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::select(x > T(0), x, T(slope) * x); }
  template <class T> KILN_HOST_DEVICE T d(T x) const { return x > T(0) ? T(1) : T(slope); }
};
// Identity: a plain copy (and the node a cast wraps).
struct Identity {
  static constexpr const char* name = "copy";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return x; }
  template <class T> KILN_HOST_DEVICE T d(T) const { return T(1); }
};

// ---- binary --------------------------------------------------------------------------------
struct Add {
  static constexpr const char* name = "add";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
  template <class T> KILN_HOST_DEVICE T d0(T, T) const { return T(1); }
  template <class T> KILN_HOST_DEVICE T d1(T, T) const { return T(1); }
};
struct Sub {
  static constexpr const char* name = "sub";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return a - b; }
  template <class T> KILN_HOST_DEVICE T d0(T, T) const { return T(1); }
  template <class T> KILN_HOST_DEVICE T d1(T, T) const { return T(-1); }
};
struct Mul {
  static constexpr const char* name = "mul";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
  template <class T> KILN_HOST_DEVICE T d0(T, T b) const { return b; }
  template <class T> KILN_HOST_DEVICE T d1(T a, T) const { return a; }
};
struct Div {
  static constexpr const char* name = "div";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return a / b; }
  template <class T> KILN_HOST_DEVICE T d0(T, T b) const { return T(1) / b; }
  template <class T> KILN_HOST_DEVICE T d1(T a, T b) const { return -a / (b * b); }
};
struct Pow {
  static constexpr const char* name = "pow";
  static constexpr bool costly = true;
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::pow(a, b); }
  template <class T> KILN_HOST_DEVICE T d0(T a, T b) const { return b * math::pow(a, b - T(1)); }
  // d/db a^b = a^b ln a; PyTorch defines it as 0 where a == 0 and b >= 0.
  template <class T> KILN_HOST_DEVICE T d1(T a, T b) const {
    return math::select((a == T(0)) & (b >= T(0)), T(0), math::pow(a, b) * math::log(a));
  }
};
// On ties PyTorch splits the gradient evenly between both inputs.
struct Max {
  static constexpr const char* name = "max";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::max(a, b); }
  template <class T> KILN_HOST_DEVICE T d0(T a, T b) const { return a > b ? T(1) : (a == b ? T(0.5) : T(0)); }
  template <class T> KILN_HOST_DEVICE T d1(T a, T b) const { return b > a ? T(1) : (a == b ? T(0.5) : T(0)); }
};
struct Min {
  static constexpr const char* name = "min";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::min(a, b); }
  template <class T> KILN_HOST_DEVICE T d0(T a, T b) const { return a < b ? T(1) : (a == b ? T(0.5) : T(0)); }
  template <class T> KILN_HOST_DEVICE T d1(T a, T b) const { return b < a ? T(1) : (a == b ? T(0.5) : T(0)); }
};

// Comparisons give 1 or 0 in the operands' type (a mask that multiplies) and have zero gradient.
#define KILN_COMPARISON(Name, str, op)                                                      \
  struct Name {                                                                             \
    static constexpr const char* name = str;                                                \
    template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return a op b ? T(1) : T(0); } \
    template <class T> KILN_HOST_DEVICE T d0(T, T) const { return T(0); }                  \
    template <class T> KILN_HOST_DEVICE T d1(T, T) const { return T(0); }                  \
  };
KILN_COMPARISON(Less, "lt", <)
KILN_COMPARISON(LessEqual, "le", <=)
KILN_COMPARISON(Greater, "gt", >)
KILN_COMPARISON(GreaterEqual, "ge", >=)
KILN_COMPARISON(Equal, "eq", ==)
KILN_COMPARISON(NotEqual, "ne", !=)
#undef KILN_COMPARISON

// ---- ternary -------------------------------------------------------------------------------
// where(cond, a, b): a where cond != 0, else b.
struct Where {
  static constexpr const char* name = "where";
  template <class T> KILN_HOST_DEVICE T operator()(T c, T a, T b) const { return c != T(0) ? a : b; }
  template <class T> KILN_HOST_DEVICE T d0(T, T, T) const { return T(0); }
  template <class T> KILN_HOST_DEVICE T d1(T c, T, T) const { return c != T(0) ? T(1) : T(0); }
  template <class T> KILN_HOST_DEVICE T d2(T c, T, T) const { return c != T(0) ? T(0) : T(1); }
};
// a·b + c in one rounding-free expression (the compiler may contract it to an FMA).
struct MulAdd {
  static constexpr const char* name = "muladd";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b, T c) const { return a * b + c; }
  template <class T> KILN_HOST_DEVICE T d0(T, T b, T) const { return b; }
  template <class T> KILN_HOST_DEVICE T d1(T a, T, T) const { return a; }
  template <class T> KILN_HOST_DEVICE T d2(T, T, T) const { return T(1); }
};

// Functors marked `costly` (transcendentals: dozens of instructions each) change how the CPU
// evaluates a fused chain of two or more of them: tile by tile instead of element by element
// (see CpuExecutor::elementwise).
template <class F>
inline constexpr bool costly_v = requires { requires F::costly; };

// What an activation (a layer of kiln::nn::Activation<F>, or a Linear's fused epilogue) needs of
// its functor: a name for launch reports, the value and its derivative for float and double,
// callable on host and device (KILN_HOST_DEVICE), and no state a kernel could not copy.
template <class F>
concept unary_functor = std::is_default_constructible_v<F> && std::is_trivially_copyable_v<F> &&
                        requires(const F f, float x, double y) {
                          { F::name } -> std::convertible_to<const char*>;
                          { f(x) } -> std::convertible_to<float>;
                          { f.d(x) } -> std::convertible_to<float>;
                          { f(y) } -> std::convertible_to<double>;
                          { f.d(y) } -> std::convertible_to<double>;
                        };

}  // namespace kiln::fn
