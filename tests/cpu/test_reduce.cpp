// Reductions on the CPU executor against fp64 references computed here: sum, mean, max, min,
// argmax and argmin over every element, the last axis and the last axis kept as size 1; fused
// map inputs, strided inputs, pairwise accuracy, NaN propagation, first-index ties and results
// that do not depend on the thread count.
//
// Inputs are random with a fresh seed per run; the seed is printed with every failure. Set
// KILN_TEST_SEED=<n> to replay a failing run.
#include <kiln.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using kiln::dyn;
using kiln::host;
using kiln::index_t;
using kiln::reduce_over;

template <class T>
using Vec = kiln::Tensor<T, host, dyn>;
template <class T>
using Mat = kiln::Tensor<T, host, dyn, dyn>;

std::uint32_t test_seed() {
  if (const char* s = std::getenv("KILN_TEST_SEED")) return std::uint32_t(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

template <class T>
void fill(T* p, index_t n, double lo, double hi, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (index_t i = 0; i < n; ++i) p[i] = T(u(rng));
}

enum class Op { sum, mean, max, min, argmax, argmin };
constexpr Op all_ops[] = {Op::sum, Op::mean, Op::max, Op::min, Op::argmax, Op::argmin};
const char* op_name(Op op) {
  constexpr const char* names[] = {"sum", "mean", "max", "min", "argmax", "argmin"};
  return names[int(op)];
}
const char* over_name(reduce_over o) {
  return o == reduce_over::all ? "all" : (o == reduce_over::last_axis ? "last_axis" : "last_axis_keepdim");
}

// The logical row-major [rows, cols] fold of a host view, in fp64.
template <class V>
std::vector<double> to_doubles(const V& v, index_t rows, index_t cols) {
  std::vector<double> out;
  out.reserve(std::size_t(rows * cols));
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) {
      if constexpr (V::rank == 1) out.push_back(double(v(c)));
      else out.push_back(double(v(r, c)));
    }
  return out;
}

// Compensated (Neumaier) sum in long double: exact enough to judge double-precision sums.
long double exact_sum(const double* p, index_t n) {
  long double s = 0, comp = 0;
  for (index_t i = 0; i < n; ++i) {
    const long double t = s + p[i];
    comp += std::abs(s) >= std::abs((long double)p[i]) ? (s - t) + p[i] : (p[i] - t) + s;
    s = t;
  }
  return s + comp;
}

// Reference of one reduction over p[0..n), and the scale its rounding error is relative to.
struct Ref {
  double value;
  double scale;
};
Ref reference(Op op, const double* p, index_t n) {
  double abs_sum = 0;
  for (index_t i = 0; i < n; ++i) abs_sum += std::abs(p[i]);
  switch (op) {
    case Op::sum: return {double(exact_sum(p, n)), abs_sum};
    case Op::mean:
      return {n ? double(exact_sum(p, n) / n) : std::numeric_limits<double>::quiet_NaN(), n ? abs_sum / n : 0};
    case Op::max:
    case Op::min: {
      double m = op == Op::max ? -INFINITY : INFINITY;
      for (index_t i = 0; i < n; ++i) {
        if (std::isnan(p[i])) return {p[i], 0};
        m = op == Op::max ? std::max(m, p[i]) : std::min(m, p[i]);
      }
      return {m, 0};
    }
    case Op::argmax:
    case Op::argmin: {
      index_t best = 0;
      for (index_t i = 0; i < n; ++i) {
        if (std::isnan(p[i])) return {double(i), 0};
        if (op == Op::argmax ? p[i] > p[best] : p[i] < p[best]) best = i;
      }
      return {double(best), 0};
    }
  }
  return {0, 0};
}

// Relative tolerance of a sum, against the sum of magnitudes: pairwise summation keeps it near
// a few ulps times log2(n).
template <class T>
constexpr double sum_tol() {
  return std::is_same_v<T, float> ? 1e-6 : 1e-14;
}

bool matches(Op op, double got, const Ref& ref, double tol) {
  if (std::isnan(ref.value)) return std::isnan(got);
  if (op == Op::sum || op == Op::mean) return std::abs(got - ref.value) <= tol * ref.scale + 1e-300;
  return got == ref.value;
}

// Evaluates `red` into a fresh output tensor (pre-filled with a sentinel, so an output the
// executor never writes shows up) and returns its elements in fp64.
template <reduce_over Over, class R, class Red>
std::vector<double> evaluate(const Red& red, index_t rows, kiln::CpuExecutor& exec) {
  const R sentinel = R(-12345);
  std::vector<double> out;
  if constexpr (Over == reduce_over::all) {
    kiln::Tensor<R, host> t;
    t() = sentinel;
    kiln::assign(t, red, exec);
    out.push_back(double(t()));
  } else if constexpr (Over == reduce_over::last_axis) {
    Vec<R> t(rows);
    for (index_t r = 0; r < rows; ++r) t(r) = sentinel;
    kiln::assign(t, red, exec);
    for (index_t r = 0; r < rows; ++r) out.push_back(double(t(r)));
  } else {
    Mat<R> t(rows, 1);
    for (index_t r = 0; r < rows; ++r) t(r, 0) = sentinel;
    kiln::assign(t, red, exec);
    for (index_t r = 0; r < rows; ++r) out.push_back(double(t(r, 0)));
  }
  return out;
}

template <reduce_over Over, class X>
std::vector<double> reduce_with(Op op, const X& x, index_t rows, kiln::CpuExecutor& exec) {
  using T = kiln::compute_t<typename kiln::expr_t<const X&>::value_type>;
  switch (op) {
    case Op::sum: return evaluate<Over, T>(kiln::sum<Over>(x), rows, exec);
    case Op::mean: return evaluate<Over, T>(kiln::mean<Over>(x), rows, exec);
    case Op::max: return evaluate<Over, T>(kiln::max<Over>(x), rows, exec);
    case Op::min: return evaluate<Over, T>(kiln::min<Over>(x), rows, exec);
    case Op::argmax: return evaluate<Over, std::int64_t>(kiln::argmax<Over>(x), rows, exec);
    case Op::argmin: return evaluate<Over, std::int64_t>(kiln::argmin<Over>(x), rows, exec);
  }
  return {};
}

// Every op over `x` (logically [rows, cols]) and `Over`, against the reference. Ops that are
// undefined on empty input (max, min, arg*) are skipped when a reduced range is empty.
template <reduce_over Over, class T, class X>
void check_reductions(const X& x, index_t rows, index_t cols, kiln::CpuExecutor& exec) {
  INFO("over = " << std::string(over_name(Over)) << ", fold = [" << rows << ", " << cols << "]");
  const std::vector<double> data = to_doubles(kiln::as_expr(x), rows, cols);
  const bool per_row = Over != reduce_over::all;
  const index_t groups = per_row ? rows : 1, len = per_row ? cols : rows * cols;
  for (Op op : all_ops) {
    const bool needs_elements = op != Op::sum && op != Op::mean;
    if (needs_elements && len == 0) continue;
    INFO("op = " << std::string(op_name(op)));
    const std::vector<double> got = reduce_with<Over>(op, x, rows, exec);
    REQUIRE(index_t(got.size()) == groups);
    for (index_t g = 0; g < groups; ++g) {
      const Ref ref = reference(op, data.data() + g * len, len);
      if (!matches(op, got[std::size_t(g)], ref, sum_tol<T>())) {
        INFO("group " << g << ": got " << got[std::size_t(g)] << ", reference " << ref.value);
        CHECK(false);
        break;
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("reductions over every element match an fp64 reference", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed << " (KILN_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  for (index_t n : {index_t(0), index_t(1), index_t(7), index_t(31), index_t(1000003)}) {
    Vec<T> x(n);
    fill(x.data(), n, -1, 1, rng);
    check_reductions<reduce_over::all, T>(x, 1, n, exec);
  }
  // Strided inputs take the per-row path of a whole reduction.
  for (auto [R, C] : {std::pair<index_t, index_t>{7, 31}, {31, 7}, {1000, 1003}, {0, 5}}) {
    Mat<T> a(C, R), wide(R, C + 3);
    fill(a.data(), a.size(), -1, 1, rng);
    fill(wide.data(), wide.size(), -1, 1, rng);
    check_reductions<reduce_over::all, T>(kiln::transpose(a.view()), R, C, exec);
    check_reductions<reduce_over::all, T>(kiln::columns(wide.view(), 1, C + 1), R, C, exec);
  }
}

TEST_CASE_TEMPLATE("reductions over the last axis match an fp64 reference", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed << " (KILN_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  for (auto [R, C] : {std::pair<index_t, index_t>{1, 1}, {7, 1}, {1, 7}, {7, 31}, {31, 7}, {300, 257},
                      {1, 1000003}, {1000003, 1}, {0, 5}, {3, 0}}) {
    Mat<T> x(R, C), a(C, R);
    fill(x.data(), x.size(), -1, 1, rng);
    fill(a.data(), a.size(), -1, 1, rng);
    check_reductions<reduce_over::last_axis, T>(x, R, C, exec);
    check_reductions<reduce_over::last_axis_keepdim, T>(x, R, C, exec);
    if (R * C < 1000000) {
      check_reductions<reduce_over::last_axis, T>(kiln::transpose(a.view()), R, C, exec);
      check_reductions<reduce_over::last_axis_keepdim, T>(kiln::transpose(a.view()), R, C, exec);
    }
  }
  // A rank-1 input reduces to a rank-0 result.
  Vec<T> v(31);
  fill(v.data(), 31, -1, 1, rng);
  kiln::Tensor<T, host> s;
  kiln::assign(s, kiln::sum<reduce_over::last_axis>(v), exec);
  CHECK(double(s()) == doctest::Approx(reference(Op::sum, to_doubles(v.view(), 1, 31).data(), 31).value));
  // A rank-3 input keeps its leading dimensions.
  kiln::Tensor<T, host, dyn, dyn, dyn> x3(2, 3, 5);
  fill(x3.data(), x3.size(), -1, 1, rng);
  Mat<T> m(2, 3);
  kiln::assign(m, kiln::max<reduce_over::last_axis>(x3), exec);
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 3; ++j) {
      T want = x3(i, j, 0);
      for (index_t k = 1; k < 5; ++k) want = std::max(want, x3(i, j, k));
      CHECK(m(i, j) == want);
    }
}

TEST_CASE("an empty reduced range: sum is 0 and mean is NaN") {
  kiln::CpuExecutor exec;
  Vec<float> empty(0);
  kiln::Tensor<float, host> s;
  kiln::assign(s, kiln::sum(empty), exec);
  CHECK(s() == 0.0f);
  kiln::assign(s, kiln::mean(empty), exec);
  CHECK(std::isnan(s()));
  // Rows of length zero: every row's sum is written (as 0).
  Mat<float> x(3, 0);
  Vec<float> rows(3);
  for (index_t r = 0; r < 3; ++r) rows(r) = 99.0f;
  kiln::assign(rows, kiln::sum<reduce_over::last_axis>(x), exec);
  for (index_t r = 0; r < 3; ++r) CHECK(rows(r) == 0.0f);
}

TEST_CASE_TEMPLATE("fused map inputs read the operand once", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  for (index_t n : {index_t(0), index_t(7), index_t(1000003)}) {
    INFO("n = " << n);
    Vec<T> x(n);
    fill(x.data(), n, -2, 2, rng);
    std::vector<double> sq(static_cast<std::size_t>(n)), dev(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      sq[std::size_t(i)] = double(x(i)) * double(x(i));
      dev[std::size_t(i)] = std::abs(double(x(i)) - 1);
    }
    kiln::Tensor<T, host> s;
    exec.stats().reset();
    kiln::assign(s, kiln::sum(kiln::square(x)), exec);
    CHECK(exec.stats().launches() == 1);
    CHECK(exec.stats().launches(kiln::kind::reduce) == 1);
    const Ref ref = reference(Op::sum, sq.data(), n);
    CHECK(std::abs(double(s()) - ref.value) <= sum_tol<T>() * ref.scale);

    exec.stats().reset();
    kiln::assign<kiln::stance::force_eager>(s, kiln::sum(kiln::square(x)), exec);
    CHECK(exec.stats().launches(kiln::kind::elementwise) == 1);
    CHECK(exec.stats().launches(kiln::kind::reduce) == 1);
    CHECK(std::abs(double(s()) - ref.value) <= sum_tol<T>() * ref.scale);

    kiln::assign(s, kiln::mean(kiln::abs(x - 1)), exec);
    if (n == 0) {
      CHECK(std::isnan(double(s())));
    } else {
      const Ref m = reference(Op::mean, dev.data(), n);
      CHECK(std::abs(double(s()) - m.value) <= sum_tol<T>() * m.scale);
      kiln::Tensor<std::int64_t, host> i;
      kiln::assign(i, kiln::argmax(-kiln::square(x - T(0.5))), exec);  // the element closest to 0.5
      index_t best = 0;
      for (index_t k = 1; k < n; ++k)
        if (std::abs(double(x(k)) - 0.5) < std::abs(double(x(best)) - 0.5)) best = k;
      CHECK(i() == best);
    }
  }
}

TEST_CASE_TEMPLATE("reductions inside expressions: a row-wise softmax", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  const index_t R = 9, C = 37;
  Mat<T> x(R, C), y(R, C);
  fill(x.data(), x.size(), -20, 20, rng);
  exec.stats().reset();
  const auto shifted = [&] { return x - kiln::max<reduce_over::last_axis_keepdim>(x); };
  kiln::assign(y, kiln::exp(shifted()) / kiln::sum<reduce_over::last_axis_keepdim>(kiln::exp(shifted())), exec);
  // max, max again inside the sum's input, the sum with exp fused in, and the final division.
  CHECK(exec.stats().launches(kiln::kind::reduce) == 3);
  CHECK(exec.stats().launches(kiln::kind::elementwise) == 1);
  for (index_t r = 0; r < R; ++r) {
    double m = -INFINITY, z = 0;
    for (index_t c = 0; c < C; ++c) m = std::max(m, double(x(r, c)));
    for (index_t c = 0; c < C; ++c) z += std::exp(double(x(r, c)) - m);
    for (index_t c = 0; c < C; ++c)
      CHECK(double(y(r, c)) == doctest::Approx(std::exp(double(x(r, c)) - m) / z).epsilon(1e-5));
  }
}

TEST_CASE("the sum of a million floats is pairwise-accurate") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec;
  const index_t n = 1000003;
  Vec<float> x(n);
  fill(x.data(), n, 0, 1, rng);  // positive: the relative error of the sum is the honest one
  std::vector<double> d(x.data(), x.data() + n);
  const double want = double(exact_sum(d.data(), n));
  kiln::Tensor<float, host> s;
  kiln::assign(s, kiln::sum(x), exec);
  const double rel = std::abs(double(s()) - want) / want;
  INFO("sum = " << s() << ", fp64 sum = " << want << ", relative error = " << rel);
  CHECK(rel < 1e-6);
  // A strided view of a million floats (the per-row path of a whole reduction).
  Mat<float> wide(1000, 1001);
  fill(wide.data(), wide.size(), 0, 1, rng);
  const auto cols = kiln::columns(wide.view(), 0, 1000);
  const std::vector<double> dc = to_doubles(cols, 1000, 1000);
  const double want_cols = double(exact_sum(dc.data(), index_t(dc.size())));
  kiln::assign(s, kiln::sum(cols), exec);
  CHECK(std::abs(double(s()) - want_cols) / want_cols < 1e-6);
  kiln::Tensor<float, host> mu;
  kiln::assign(mu, kiln::mean(x), exec);
  CHECK(std::abs(double(mu()) - want / double(n)) / (want / double(n)) < 1e-6);
}

TEST_CASE_TEMPLATE("max and min propagate NaN; argmax and argmin return the first NaN", T, float, double) {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor exec(2);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (index_t n : {index_t(1), index_t(7), index_t(31), index_t(1000003)}) {
    Vec<T> x(n);
    std::uniform_int_distribution<index_t> pos(0, n - 1);
    // (first NaN, a later NaN or -1): first and last place, and pairs whose later NaN sits in a
    // lower lane of the 8-wide pairwise leaves (1 and 8; p and p + 7).
    std::vector<std::pair<index_t, index_t>> cases{{0, -1}, {n - 1, -1}};
    if (n > 8) cases.push_back({1, 8});
    const index_t p = pos(rng);
    cases.push_back({p, p + 7 < n ? p + 7 : -1});
    for (auto [first, later] : cases) {
      INFO("n = " << n << ", NaN at " << first << " and " << later);
      fill(x.data(), n, -1, 1, rng);
      x(first) = nan;
      if (later >= 0) x(later) = nan;
      kiln::Tensor<T, host> m;
      kiln::Tensor<std::int64_t, host> i;
      kiln::assign(m, kiln::max(x), exec);
      CHECK(std::isnan(m()));
      kiln::assign(m, kiln::min(x), exec);
      CHECK(std::isnan(m()));
      kiln::assign(i, kiln::argmax(x), exec);
      CHECK(i() == first);
      kiln::assign(i, kiln::argmin(x), exec);
      CHECK(i() == first);
      // The per-row path.
      auto row = kiln::View<const T, host, kiln::extents<dyn, dyn>>(x.data(), kiln::Shape{1, n});
      Vec<T> r(1);
      kiln::assign(r, kiln::max<reduce_over::last_axis>(row), exec);
      CHECK(std::isnan(r(0)));
      kiln::assign(r, kiln::min<reduce_over::last_axis>(row), exec);
      CHECK(std::isnan(r(0)));
      Vec<std::int64_t> ri(1);
      kiln::assign(ri, kiln::argmax<reduce_over::last_axis>(row), exec);
      CHECK(ri(0) == first);
    }
  }
  // The strided path of a whole reduction, and NaN in some rows only.
  Mat<T> a(9, 4);  // transposed: a [4, 9] view
  fill(a.data(), a.size(), -1, 1, rng);
  a(8, 1) = nan;  // view (1, 8): flat index 17
  a(2, 3) = nan;  // view (3, 2): flat index 29
  const auto at = kiln::transpose(a.view());
  kiln::Tensor<T, host> m;
  kiln::assign(m, kiln::max(at), exec);
  CHECK(std::isnan(m()));
  kiln::Tensor<std::int64_t, host> i;
  kiln::assign(i, kiln::argmax(at), exec);
  CHECK(i() == 17);
  Vec<T> r(4);
  kiln::assign(r, kiln::max<reduce_over::last_axis>(at), exec);
  CHECK_FALSE(std::isnan(r(0)));
  CHECK(std::isnan(r(1)));
  CHECK_FALSE(std::isnan(r(2)));
  CHECK(std::isnan(r(3)));
}

TEST_CASE_TEMPLATE("argmax and argmin return the first extreme on ties", T, float, double) {
  kiln::CpuExecutor exec(2);
  kiln::Tensor<std::int64_t, host> i;
  for (index_t n : {index_t(1), index_t(7), index_t(31), index_t(1000003)}) {
    INFO("n = " << n);
    Vec<T> x(n);
    for (index_t k = 0; k < n; ++k) x(k) = T(1);
    kiln::assign(i, kiln::argmax(x), exec);
    CHECK(i() == 0);
    kiln::assign(i, kiln::argmin(x), exec);
    CHECK(i() == 0);
    // Equal extremes in different lanes, leaves and blocks: the lowest index wins.
    for (index_t k = 0; k < n; ++k) x(k) = T(k % 5);
    std::vector<index_t> places;
    for (index_t p : {index_t(5), index_t(13), index_t(300), index_t(20000), index_t(40000), n - 1})
      if (p < n) places.push_back(p);
    for (index_t p : places) x(p) = T(9);
    if (!places.empty()) {
      kiln::assign(i, kiln::argmax(x), exec);
      CHECK(i() == places.front());
    }
    for (index_t p : places) x(p) = T(-9);
    if (!places.empty()) {
      kiln::assign(i, kiln::argmin(x), exec);
      CHECK(i() == places.front());
    }
  }
  // Per row, and on the strided whole-reduction path (the index is row-major in the view).
  Mat<T> a(6, 5);  // transposed: a [5, 6] view
  for (index_t k = 0; k < a.size(); ++k) a.data()[k] = T(0);
  a(3, 1) = T(2);  // view (1, 3): flat index 9
  a(0, 4) = T(2);  // view (4, 0): flat index 24
  a(5, 2) = T(2);  // view (2, 5): flat index 17
  kiln::assign(i, kiln::argmax(kiln::transpose(a.view())), exec);
  CHECK(i() == 9);
  Vec<std::int64_t> per_row(5);
  kiln::assign(per_row, kiln::argmax<reduce_over::last_axis>(kiln::transpose(a.view())), exec);
  CHECK(per_row(0) == 0);
  CHECK(per_row(1) == 3);
  CHECK(per_row(2) == 5);
  CHECK(per_row(4) == 0);
  // Ties within each row of a contiguous matrix.
  Mat<T> b(3, 40);
  for (index_t k = 0; k < b.size(); ++k) b.data()[k] = T(k % 40 == 17 || k % 40 == 25 || k % 40 == 38 ? 3 : 1);
  Vec<std::int64_t> per_row3(3);
  kiln::assign(per_row3, kiln::argmax<reduce_over::last_axis>(b), exec);
  for (index_t r = 0; r < 3; ++r) CHECK(per_row3(r) == 17);
}

TEST_CASE("reduction results do not depend on the thread count") {
  const std::uint32_t seed = test_seed();
  INFO("seed = " << seed);
  std::mt19937 rng(seed);
  kiln::CpuExecutor one(1), two(2);
  const index_t n = 1000003;
  Vec<float> x(n);
  fill(x.data(), n, -1, 1, rng);
  Mat<float> a(1003, 1000);
  fill(a.data(), a.size(), -1, 1, rng);
  auto same = [](float p, float q) { return std::memcmp(&p, &q, sizeof p) == 0; };
  kiln::Tensor<float, host> s1, s2;
  kiln::assign(s1, kiln::sum(x), one);
  kiln::assign(s2, kiln::sum(x), two);
  CHECK(same(s1(), s2()));
  kiln::assign(s1, kiln::mean(kiln::exp(x)), one);
  kiln::assign(s2, kiln::mean(kiln::exp(x)), two);
  CHECK(same(s1(), s2()));
  kiln::assign(s1, kiln::sum(kiln::transpose(a.view())), one);
  kiln::assign(s2, kiln::sum(kiln::transpose(a.view())), two);
  CHECK(same(s1(), s2()));
  Vec<float> r1(1003), r2(1003);
  kiln::assign(r1, kiln::sum<reduce_over::last_axis>(a), one);
  kiln::assign(r2, kiln::sum<reduce_over::last_axis>(a), two);
  CHECK(std::memcmp(r1.data(), r2.data(), r1.bytes()) == 0);
  kiln::Tensor<std::int64_t, host> i1, i2;
  kiln::assign(i1, kiln::argmax(x), one);
  kiln::assign(i2, kiln::argmax(x), two);
  CHECK(i1() == i2());
}

TEST_CASE("reduction destinations: shape errors name both shapes; strided and overlapping ones") {
  kiln::CpuExecutor exec;
  Mat<float> x(3, 5);
  for (index_t k = 0; k < 15; ++k) x.data()[k] = float(k);
  Vec<float> wrong(4);
  try {
    kiln::assign(wrong, kiln::sum<reduce_over::last_axis>(x), exec);
    FAIL("no ShapeError");
  } catch (const kiln::ShapeError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("[3]") != std::string::npos);
    CHECK(m.find("[4]") != std::string::npos);
  }
  // A strided destination is refused with a ShapeError (reductions write contiguous memory).
  Mat<float> wide(3, 4);
  CHECK_THROWS_AS(kiln::assign(kiln::columns(wide.view(), 1, 2), kiln::sum<reduce_over::last_axis_keepdim>(x), exec),
                  kiln::ShapeError);
  // A destination that overlaps the input at another offset would read overwritten rows.
  Mat<float> m(4, 4);
  for (index_t k = 0; k < 16; ++k) m.data()[k] = 1.0f;
  kiln::View<float, host, kiln::extents<dyn>> shifted(m.data() + 4, kiln::Shape{4});
  CHECK_THROWS_AS(kiln::assign(shifted, kiln::sum<reduce_over::last_axis>(m), exec), kiln::AliasError);
}
