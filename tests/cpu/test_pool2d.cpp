// Tests for kiln::cpu max / avg / global-avg pooling against a naive reference in double:
// ties (first maximum, and backward routing to it), NaN propagation, both avg divisors, finite
// differences of the backward passes, and shape errors.
#include <kiln/backend/cpu/pool2d.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using kiln::index_t;
using kiln::cpu::Pool2dShape;

std::string describe(const Pool2dShape& s) {
  return kiln::detail::concat("n=", s.n, " c=", s.c, " h=", s.h, " w=", s.w, " k=", s.kh, "x",
                              s.kw, " stride=", s.stride_h, ",", s.stride_w, " pad=", s.pad_h,
                              ",", s.pad_w);
}

std::size_t x_size(const Pool2dShape& s) { return std::size_t(s.n * s.c * s.h * s.w); }
std::size_t y_size(const Pool2dShape& s) {
  return std::size_t(s.n * s.c * s.out_h() * s.out_w());
}

// Every valid configuration over the sizes the brief asks for (odd, 1x1, non-square).
std::vector<Pool2dShape> shapes() {
  const index_t hw[][2] = {{7, 5}, {9, 12}, {1, 1}};
  const index_t ks[][2] = {{1, 1}, {2, 2}, {3, 3}, {2, 3}, {3, 1}};
  const index_t strides[][2] = {{1, 1}, {2, 2}, {3, 3}, {1, 2}};
  std::vector<Pool2dShape> out;
  for (auto& d : hw)
    for (index_t c : {1, 3})
      for (auto& k : ks)
        for (auto& st : strides)
          for (index_t p : {0, 1}) {
            if (2 * p > k[0] || 2 * p > k[1]) continue;  // torch: pad <= kernel / 2
            if (d[0] + 2 * p < k[0] || d[1] + 2 * p < k[1]) continue;  // empty output
            const Pool2dShape s{.n = 2, .c = c, .h = d[0], .w = d[1], .kh = k[0], .kw = k[1],
                                .stride_h = st[0], .stride_w = st[1], .pad_h = p, .pad_w = p};
            out.push_back(s);
          }
  return out;
}

// Naive reference: padding = -inf, first maximum wins, the first NaN wins.
struct MaxRef {
  std::vector<double> y;
  std::vector<std::int64_t> arg;
};

MaxRef max_ref(const Pool2dShape& s, const std::vector<double>& x) {
  const index_t OH = s.out_h(), OW = s.out_w();
  MaxRef r{std::vector<double>(y_size(s)), std::vector<std::int64_t>(y_size(s), -1)};
  for (index_t p = 0; p < s.n * s.c; ++p)
    for (index_t oh = 0; oh < OH; ++oh)
      for (index_t ow = 0; ow < OW; ++ow) {
        double best = -INFINITY;
        std::int64_t at = -1;
        for (index_t i = 0; i < s.kh; ++i)
          for (index_t j = 0; j < s.kw; ++j) {
            const index_t ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
            if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
            const double v = x[std::size_t(p * s.h * s.w + ih * s.w + iw)];
            if (std::isnan(best)) continue;
            if (at < 0 || std::isnan(v) || v > best) best = v, at = ih * s.w + iw;
          }
        r.y[std::size_t(p * OH * OW + oh * OW + ow)] = best;
        r.arg[std::size_t(p * OH * OW + oh * OW + ow)] = at;
      }
  return r;
}

// Divisor counted tap by tap: include_pad counts taps inside [-pad, size + pad).
std::vector<double> avg_ref(const Pool2dShape& s, const std::vector<double>& x, bool incl) {
  const index_t OH = s.out_h(), OW = s.out_w();
  std::vector<double> y(y_size(s));
  for (index_t p = 0; p < s.n * s.c; ++p)
    for (index_t oh = 0; oh < OH; ++oh)
      for (index_t ow = 0; ow < OW; ++ow) {
        double sum = 0;
        int real = 0, padded = 0;
        for (index_t i = 0; i < s.kh; ++i)
          for (index_t j = 0; j < s.kw; ++j) {
            const index_t ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
            if (ih < s.h + s.pad_h && iw < s.w + s.pad_w) ++padded;
            if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
            ++real;
            sum += x[std::size_t(p * s.h * s.w + ih * s.w + iw)];
          }
        y[std::size_t(p * OH * OW + oh * OW + ow)] = sum / (incl ? padded : real);
      }
  return y;
}

std::vector<double> random_vec(std::size_t size, std::mt19937_64& rng, bool integers) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::uniform_int_distribution<int> idist(0, 3);
  std::vector<double> v(size);
  for (auto& e : v) e = integers ? double(idist(rng)) : dist(rng);
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kiln::ShapeError& e) {
    return e.what();
  }
  return "<no ShapeError>";
}

}  // namespace

TEST_CASE_TEMPLATE("max_pool2d matches the reference, ties pick the first max", T, float,
                   double) {
  std::mt19937_64 rng(7);
  for (const Pool2dShape& s : shapes())
    for (bool integers : {false, true}) {
      CAPTURE(describe(s));
      CAPTURE(integers);
      const std::vector<double> xd = random_vec(x_size(s), rng, integers);
      const MaxRef ref = max_ref(s, xd);
      const std::vector<T> x = cast<T>(xd);
      std::vector<T> y(y_size(s));
      std::vector<std::int64_t> arg(y_size(s), -7);
      kiln::cpu::max_pool2d_forward(s, x.data(), y.data(), arg.data());
      for (std::size_t i = 0; i < y.size(); ++i) {
        REQUIRE(y[i] == T(ref.y[i]));
        REQUIRE(arg[i] == ref.arg[i]);
      }
      std::vector<T> y2(y_size(s));  // argmax is optional
      kiln::cpu::max_pool2d_forward<T>(s, x.data(), y2.data(), nullptr);
      CHECK(y2 == y);

      // Backward routes each dy to the reference's (first) maximum and accumulates overlaps.
      const std::vector<double> dyd = random_vec(y_size(s), rng, false);
      std::vector<double> dx_ref(x_size(s), 0.0);
      const index_t ohw = s.out_h() * s.out_w();
      for (std::size_t i = 0; i < dyd.size(); ++i)
        dx_ref[std::size_t(index_t(i) / ohw * s.h * s.w + ref.arg[i])] += double(T(dyd[i]));
      const std::vector<T> dy = cast<T>(dyd);
      std::vector<T> dx(x_size(s), T(123));
      kiln::cpu::max_pool2d_backward(s, dy.data(), arg.data(), dx.data());
      for (std::size_t i = 0; i < dx.size(); ++i)
        REQUIRE(double(dx[i]) == doctest::Approx(dx_ref[i]).epsilon(1e-6));
      // Finding the maximum again in x routes every dy to the same element, in the same order.
      std::vector<T> dx2(x_size(s), T(-5));
      kiln::cpu::max_pool2d_backward_from_input(s, x.data(), dy.data(), dx2.data());
      CHECK(dx2 == dx);
    }
}

TEST_CASE("max_pool2d: all-equal windows pick the top-left element") {
  Pool2dShape s{.n = 1, .c = 1, .h = 4, .w = 4, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
  std::vector<float> x(16, 5.0f), y(4), dx(16);
  std::vector<std::int64_t> arg(4);
  kiln::cpu::max_pool2d_forward(s, x.data(), y.data(), arg.data());
  CHECK(arg == std::vector<std::int64_t>{0, 2, 8, 10});
  std::vector<float> dy{1, 2, 3, 4};
  kiln::cpu::max_pool2d_backward(s, dy.data(), arg.data(), dx.data());
  CHECK(dx[0] == 1);
  CHECK(dx[1] == 0);
  CHECK(dx[10] == 4);
  // -inf everywhere: padding never wins, the first real element does.
  Pool2dShape p = s;
  p.pad_h = p.pad_w = 1;
  std::vector<float> xi(16, -INFINITY), yi(9);
  std::vector<std::int64_t> ai(9);
  kiln::cpu::max_pool2d_forward(p, xi.data(), yi.data(), ai.data());
  CHECK(ai[0] == 0);
  CHECK(ai[4] == 5);
  CHECK(yi[4] == -INFINITY);
}

TEST_CASE_TEMPLATE("max_pool2d propagates NaN", T, float, double) {
  Pool2dShape s{.n = 1, .c = 2, .h = 7, .w = 5, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2,
                .pad_h = 1, .pad_w = 1};
  std::mt19937_64 rng(3);
  std::vector<double> xd = random_vec(x_size(s), rng, false);
  xd[3 * 5 + 3] = NAN;       // channel 0, (3, 3): inside four windows
  xd[35 + 6 * 5 + 0] = NAN;  // channel 1, (6, 0)
  xd[35 + 6 * 5 + 1] = NAN;  // channel 1, (6, 1): the first NaN in row-major order wins
  const MaxRef ref = max_ref(s, xd);
  const std::vector<T> x = cast<T>(xd);
  std::vector<T> y(y_size(s));
  std::vector<std::int64_t> arg(y_size(s));
  kiln::cpu::max_pool2d_forward(s, x.data(), y.data(), arg.data());
  int nans = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isnan(y[i]) == std::isnan(ref.y[i]));
    if (!std::isnan(ref.y[i])) CHECK(y[i] == T(ref.y[i]));
    CHECK(arg[i] == ref.arg[i]);
    nans += std::isnan(y[i]);
  }
  CHECK(nans == 4 + 2);  // (3,3) sits in 2x2 windows; (6,0..1) in the last row's first 2
  CHECK(arg[3 * 4 + 3 * 3 + 0] == 6 * 5 + 0);
}

TEST_CASE_TEMPLATE("max_pool2d's 2x2 stride-2 path keeps NaN and tie rules", T, float, double) {
  // One window per case (a 2x8 input gives four 2x2 windows); positions in window order 0..3.
  Pool2dShape s{.n = 1, .c = 1, .h = 2, .w = 8, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
  const double inf = INFINITY;
  // Windows: NaN last after +inf; two NaNs (the first wins); a tie between positions 1 and 2;
  // NaN first.
  const double win[4][4] = {{1, inf, 0, NAN}, {2, NAN, NAN, 3}, {0, 5, 5, -1}, {NAN, 9, 9, 9}};
  std::vector<double> xd(16);
  for (int w = 0; w < 4; ++w)
    for (int k = 0; k < 4; ++k) xd[std::size_t((k / 2) * 8 + 2 * w + k % 2)] = win[w][k];
  const MaxRef ref = max_ref(s, xd);
  const std::vector<T> x = cast<T>(xd);
  std::vector<T> y(4);
  std::vector<std::int64_t> arg(4);
  kiln::cpu::max_pool2d_forward(s, x.data(), y.data(), arg.data());
  CHECK(arg == ref.arg);
  CHECK(arg == std::vector<std::int64_t>{9, 3, 5, 6});
  CHECK(std::isnan(y[0]));
  CHECK(std::isnan(y[1]));
  CHECK(y[2] == T(5));
  CHECK(std::isnan(y[3]));
}

TEST_CASE_TEMPLATE("avg_pool2d matches the reference for both divisors", T, float, double) {
  std::mt19937_64 rng(11);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  for (const Pool2dShape& s : shapes())
    for (bool incl : {true, false}) {
      CAPTURE(describe(s));
      CAPTURE(incl);
      const std::vector<double> xd = random_vec(x_size(s), rng, false);
      const std::vector<double> ref = avg_ref(s, xd, incl);
      const std::vector<T> x = cast<T>(xd);
      std::vector<T> y(y_size(s));
      kiln::cpu::avg_pool2d_forward(s, x.data(), y.data(), incl);
      for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(std::abs(double(y[i]) - ref[i]) < tol);

      // Backward is the adjoint: <dy, A x> == <A^T dy, x>.
      const std::vector<double> dyd = random_vec(y_size(s), rng, false);
      std::vector<T> dx(x_size(s), T(9));
      const std::vector<T> dy = cast<T>(dyd);
      kiln::cpu::avg_pool2d_backward(s, dy.data(), dx.data(), incl);
      double lhs = 0, rhs = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) lhs += double(dy[i]) * ref[i];
      for (std::size_t i = 0; i < xd.size(); ++i) rhs += double(dx[i]) * xd[i];
      REQUIRE(std::abs(lhs - rhs) < 100 * tol);
    }
}

TEST_CASE("avg_pool2d: torch divisors on padded borders") {
  // 3x3 kernel, pad 1, stride 2 on a 5x5 input of ones: the corner window holds 4 real taps.
  // (In floor mode a window never reaches past size + pad, so the padded count is kh*kw.)
  Pool2dShape s{.n = 1, .c = 1, .h = 5, .w = 5, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2,
                .pad_h = 1, .pad_w = 1};
  std::vector<double> x(25, 1.0), y(9);
  kiln::cpu::avg_pool2d_forward(s, x.data(), y.data(), true);
  CHECK(y[0] == doctest::Approx(4.0 / 9));
  CHECK(y[1] == doctest::Approx(6.0 / 9));
  CHECK(y[4] == doctest::Approx(1.0));
  CHECK(y[8] == doctest::Approx(4.0 / 9));
  kiln::cpu::avg_pool2d_forward(s, x.data(), y.data(), false);
  for (double v : y) CHECK(v == doctest::Approx(1.0));
}

// Finite differences in double of L = sum(dy * pool(x)).
template <class Fwd, class Bwd>
void gradcheck(const Pool2dShape& s, std::vector<double> x, Fwd fwd, Bwd bwd,
               std::mt19937_64& rng) {
  const std::vector<double> dy = random_vec(y_size(s), rng, false);
  std::vector<double> dx(x_size(s)), y(y_size(s));
  bwd(x, dy, dx);
  auto loss = [&](const std::vector<double>& xx) {
    fwd(xx, y);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
    return l;
  };
  const double eps = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss(x);
    x[i] = x0 - eps;
    const double lm = loss(x);
    x[i] = x0;
    REQUIRE(dx[i] == doctest::Approx((lp - lm) / (2 * eps)).epsilon(1e-6).scale(1.0));
  }
}

TEST_CASE("pool2d backward passes match finite differences (double)") {
  std::mt19937_64 rng(5);
  for (const Pool2dShape& s : shapes()) {
    CAPTURE(describe(s));
    for (bool incl : {true, false})
      gradcheck(
          s, random_vec(x_size(s), rng, false),
          [&](const std::vector<double>& x, std::vector<double>& y) {
            kiln::cpu::avg_pool2d_forward(s, x.data(), y.data(), incl);
          },
          [&](const std::vector<double>&, const std::vector<double>& dy, std::vector<double>& dx) {
            kiln::cpu::avg_pool2d_backward(s, dy.data(), dx.data(), incl);
          },
          rng);
    // Max pool away from ties: a shuffled ramp, neighbours 1e-3 apart >> eps.
    std::vector<double> x(x_size(s));
    std::iota(x.begin(), x.end(), 0.0);
    for (auto& e : x) e *= 1e-3;
    std::shuffle(x.begin(), x.end(), rng);
    std::vector<std::int64_t> arg(y_size(s));
    gradcheck(
        s, x,
        [&](const std::vector<double>& xx, std::vector<double>& y) {
          kiln::cpu::max_pool2d_forward(s, xx.data(), y.data(), arg.data());
        },
        [&](const std::vector<double>& xx, const std::vector<double>& dy, std::vector<double>& dx) {
          std::vector<double> y(y_size(s));
          kiln::cpu::max_pool2d_forward(s, xx.data(), y.data(), arg.data());
          kiln::cpu::max_pool2d_backward(s, dy.data(), arg.data(), dx.data());
        },
        rng);
  }
}

TEST_CASE("global_avg_pool forward / backward") {
  std::mt19937_64 rng(9);
  const index_t n = 2, c = 3, h = 7, w = 5;
  const std::vector<double> x = random_vec(std::size_t(n * c * h * w), rng, false);
  std::vector<double> y(std::size_t(n * c)), dx(x.size());
  kiln::cpu::global_avg_pool_forward(n, c, h, w, x.data(), y.data());
  for (index_t p = 0; p < n * c; ++p) {
    double sum = 0;
    for (index_t i = 0; i < h * w; ++i) sum += x[std::size_t(p * h * w + i)];
    CHECK(y[std::size_t(p)] == doctest::Approx(sum / double(h * w)).epsilon(1e-14));
  }
  const std::vector<float> xf = cast<float>(x);
  std::vector<float> yf(y.size());
  kiln::cpu::global_avg_pool_forward(n, c, h, w, xf.data(), yf.data());
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(yf[i] == doctest::Approx(y[i]).epsilon(1e-6));
  const std::vector<double> dy{1, 2, 3, 4, 5, 6};
  kiln::cpu::global_avg_pool_backward(n, c, h, w, dy.data(), dx.data());
  CHECK(dx[0] == doctest::Approx(1.0 / 35));
  CHECK(dx[std::size_t(5 * h * w + 34)] == doctest::Approx(6.0 / 35));
  CHECK(error_of([&] {
          kiln::cpu::global_avg_pool_forward(n, c, 0, w, x.data(), y.data());
        }).find("h=0") != std::string::npos);
}

TEST_CASE("pool2d shape errors name the values") {
  std::vector<float> buf(4096);
  std::vector<std::int64_t> arg(4096);
  auto msg = [&](const Pool2dShape& s) {
    return error_of([&] { kiln::cpu::max_pool2d_forward(s, buf.data(), buf.data(), arg.data()); });
  };
  Pool2dShape ok{.n = 1, .c = 1, .h = 5, .w = 5, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                 .pad_h = 1, .pad_w = 1};
  CHECK(msg(ok) == "<no ShapeError>");

  Pool2dShape s = ok;
  s.pad_h = 2;  // > 3 / 2
  std::string m = msg(s);
  CHECK(m.find("max_pool2d_forward") != std::string::npos);
  CHECK(m.find("at most half") != std::string::npos);
  CHECK(m.find("pad_h=2") != std::string::npos);
  CHECK(m.find("kh=3") != std::string::npos);
  s = ok;
  s.kw = 2;  // pad 1 == 2/2 is fine
  CHECK(msg(s) == "<no ShapeError>");

  s = Pool2dShape{.n = 1, .c = 1, .h = 2, .w = 5, .kh = 4, .kw = 1, .stride_h = 1, .stride_w = 1};
  m = msg(s);
  CHECK(m.find("empty output") != std::string::npos);
  CHECK(m.find("h=2") != std::string::npos);
  CHECK(m.find("4x1") != std::string::npos);

  s = ok;
  s.c = 0;
  CHECK(msg(s).find("c=0") != std::string::npos);
  s = ok;
  s.w = -3;
  CHECK(msg(s).find("w=-3") != std::string::npos);
  s = ok;
  s.kh = 0;
  CHECK(msg(s).find("kh=0") != std::string::npos);
  s = ok;
  s.stride_w = 0;
  CHECK(msg(s).find("stride_w=0") != std::string::npos);
  s = ok;
  s.pad_w = -1;
  CHECK(msg(s).find("pad_w=-1") != std::string::npos);

  s = ok;
  s.pad_h = 2;
  CHECK(error_of([&] { kiln::cpu::avg_pool2d_forward(s, buf.data(), buf.data()); })
            .find("avg_pool2d_forward") != std::string::npos);
  CHECK(error_of([&] { kiln::cpu::avg_pool2d_backward(s, buf.data(), buf.data(), false); })
            .find("pad_h=2") != std::string::npos);
  CHECK(error_of([&] { kiln::cpu::max_pool2d_backward(s, buf.data(), arg.data(), buf.data()); })
            .find("max_pool2d_backward") != std::string::npos);
  CHECK(error_of([&] { kiln::cpu::max_pool2d_backward_from_input(s, buf.data(), buf.data(), buf.data()); })
            .find("max_pool2d_backward_from_input: pad must be at most half") != std::string::npos);
}
