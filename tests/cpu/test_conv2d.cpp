// Tests for kiln::cpu::conv2d_{forward,backward_data,backward_filter} against a naive direct
// convolution in double, a finite-difference check of the backward pair, and shape errors.
#include <kiln/backend/cpu/conv2d.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using kiln::index_t;
using kiln::cpu::Conv2dShape;

std::string describe(const Conv2dShape& s) {
  return kiln::detail::concat("n=", s.n, " cin=", s.c_in, " h=", s.h, " w=", s.w,
                              " cout=", s.c_out, " k=", s.kh, "x", s.kw, " stride=", s.stride_h,
                              ",", s.stride_w, " pad=", s.pad_h, ",", s.pad_w, " dil=", s.dil_h,
                              ",", s.dil_w);
}

template <class T>
std::vector<T> random_vec(std::size_t size, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(size);
  for (auto& e : v) e = T(dist(rng));
  return v;
}

std::size_t x_size(const Conv2dShape& s) { return std::size_t(s.n * s.c_in * s.h * s.w); }
std::size_t w_size(const Conv2dShape& s) { return std::size_t(s.c_out * s.col_rows()); }
std::size_t y_size(const Conv2dShape& s) {
  return std::size_t(s.n * s.c_out * s.out_h() * s.out_w());
}

// Reference values in double plus, per element, the sum of |terms| (for the error bound).
struct ref_result {
  std::vector<double> val, mag;
};

// Visits every (x index, w index, y index) triple that contributes to the convolution.
template <class F>
void for_each_tap(const Conv2dShape& s, F f) {
  const index_t oh_n = s.out_h(), ow_n = s.out_w();
  for (index_t n = 0; n < s.n; ++n)
    for (index_t co = 0; co < s.c_out; ++co)
      for (index_t oh = 0; oh < oh_n; ++oh)
        for (index_t ow = 0; ow < ow_n; ++ow)
          for (index_t c = 0; c < s.c_in; ++c)
            for (index_t i = 0; i < s.kh; ++i)
              for (index_t j = 0; j < s.kw; ++j) {
                const index_t ih = oh * s.stride_h - s.pad_h + i * s.dil_h;
                const index_t iw = ow * s.stride_w - s.pad_w + j * s.dil_w;
                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
                f(std::size_t(((n * s.c_in + c) * s.h + ih) * s.w + iw),
                  std::size_t(((co * s.c_in + c) * s.kh + i) * s.kw + j),
                  std::size_t(((n * s.c_out + co) * oh_n + oh) * ow_n + ow));
              }
}

template <class T>
ref_result ref_forward(const Conv2dShape& s, const std::vector<T>& x, const std::vector<T>& w,
                       const std::vector<T>& bias) {
  ref_result r{std::vector<double>(y_size(s)), std::vector<double>(y_size(s))};
  for_each_tap(s, [&](std::size_t xi, std::size_t wi, std::size_t yi) {
    const double t = double(x[xi]) * double(w[wi]);
    r.val[yi] += t;
    r.mag[yi] += std::abs(t);
  });
  const std::size_t ohw = std::size_t(s.out_h() * s.out_w());
  for (std::size_t yi = 0; yi < r.val.size(); ++yi) {
    const double b = double(bias[(yi / ohw) % std::size_t(s.c_out)]);
    r.val[yi] += b;
    r.mag[yi] += std::abs(b);
  }
  return r;
}

template <class T>
ref_result ref_backward_data(const Conv2dShape& s, const std::vector<T>& dy,
                             const std::vector<T>& w) {
  ref_result r{std::vector<double>(x_size(s)), std::vector<double>(x_size(s))};
  for_each_tap(s, [&](std::size_t xi, std::size_t wi, std::size_t yi) {
    const double t = double(dy[yi]) * double(w[wi]);
    r.val[xi] += t;
    r.mag[xi] += std::abs(t);
  });
  return r;
}

template <class T>
ref_result ref_backward_filter(const Conv2dShape& s, const std::vector<T>& x,
                               const std::vector<T>& dy) {
  ref_result r{std::vector<double>(w_size(s)), std::vector<double>(w_size(s))};
  for_each_tap(s, [&](std::size_t xi, std::size_t wi, std::size_t yi) {
    const double t = double(dy[yi]) * double(x[xi]);
    r.val[wi] += t;
    r.mag[wi] += std::abs(t);
  });
  return r;
}

// |got - ref| <= 4 * len * eps * sum|terms| + tiny, with len the reduction length: fp32 (or fp64)
// accumulation order is free, so this is the usual a-priori dot-product bound with slack.
template <class T>
void check_close(const char* what, const Conv2dShape& s, const std::vector<T>& got,
                 const ref_result& ref, index_t len) {
  const double eps = std::is_same_v<T, float> ? std::ldexp(1.0, -24) : 1e-12 / double(len) / 4;
  REQUIRE(got.size() == ref.val.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = 4.0 * double(len) * eps * ref.mag[i] + 1e-30;
    const double err = std::abs(double(got[i]) - ref.val[i]);
    if (!(err <= tol) && bad++ < 3)
      FAIL_CHECK(what, " ", describe(s), " i=", i, " got=", double(got[i]), " ref=", ref.val[i],
                 " tol=", tol);
  }
  CHECK(bad == 0);
}

template <class T>
void run_case(const Conv2dShape& s, std::uint64_t seed, int threads) {
  INFO(describe(s), " threads=", threads);
  std::mt19937_64 rng(seed);
  const auto x = random_vec<T>(x_size(s), rng), w = random_vec<T>(w_size(s), rng);
  const auto bias = random_vec<T>(std::size_t(s.c_out), rng), dy = random_vec<T>(y_size(s), rng);
  const T nan = std::numeric_limits<T>::quiet_NaN();

  // Outputs start as NaN: every function must overwrite, never read, its output.
  std::vector<T> y(y_size(s), nan);
  kiln::cpu::conv2d_forward(s, x.data(), w.data(), bias.data(), y.data(), threads);
  check_close("forward", s, y, ref_forward(s, x, w, bias), s.col_rows() + 1);

  std::vector<T> y_nobias(y_size(s), nan);
  kiln::cpu::conv2d_forward<T>(s, x.data(), w.data(), nullptr, y_nobias.data(), threads);
  check_close("forward/no bias", s, y_nobias,
              ref_forward(s, x, w, std::vector<T>(std::size_t(s.c_out), T(0))), s.col_rows());

  std::vector<T> dx(x_size(s), nan);
  kiln::cpu::conv2d_backward_data(s, dy.data(), w.data(), dx.data(), threads);
  check_close("backward_data", s, dx, ref_backward_data(s, dy, w), s.c_out * s.kh * s.kw);

  std::vector<T> dw(w_size(s), nan), dbias(std::size_t(s.c_out), nan);
  kiln::cpu::conv2d_backward_filter(s, x.data(), dy.data(), dw.data(), dbias.data(), threads);
  const index_t nohw = s.n * s.out_h() * s.out_w();
  check_close("backward_filter", s, dw, ref_backward_filter(s, x, dy), nohw);
  ref_result db{std::vector<double>(std::size_t(s.c_out)),
                std::vector<double>(std::size_t(s.c_out))};
  const std::size_t ohw = std::size_t(s.out_h() * s.out_w());
  for (std::size_t yi = 0; yi < dy.size(); ++yi) {
    db.val[(yi / ohw) % std::size_t(s.c_out)] += double(dy[yi]);
    db.mag[(yi / ohw) % std::size_t(s.c_out)] += std::abs(double(dy[yi]));
  }
  check_close("backward_filter/dbias", s, dbias, db, nohw);

  std::vector<T> dw2(w_size(s), nan);  // dbias == nullptr is allowed
  kiln::cpu::conv2d_backward_filter<T>(s, x.data(), dy.data(), dw2.data(), nullptr, threads);
  CHECK(dw2 == dw);
}

// The grid of odd shapes; each entry also varies the batch and the thread count.
std::vector<Conv2dShape> shape_grid() {
  std::vector<Conv2dShape> out;
  const index_t hw[][2] = {{7, 5}, {9, 12}};
  for (index_t c_in : {1, 3})
    for (index_t c_out : {1, 2, 5})
      for (auto [h, w] : hw)
        for (index_t k : {1, 3, 5})
          for (index_t pad : {0, 1, 2})
            for (index_t stride : {1, 2})
              for (index_t dil : {1, 2}) {
                Conv2dShape s{.n = (c_out + k + pad) % 2 ? 3 : 1, .c_in = c_in, .h = h, .w = w,
                              .c_out = c_out, .kh = k, .kw = k, .stride_h = stride,
                              .stride_w = stride, .pad_h = pad, .pad_w = pad, .dil_h = dil,
                              .dil_w = dil};
                if (s.out_h() <= 0 || s.out_w() <= 0) continue;
                out.push_back(s);
              }
  // Non-square kernels, mixed strides/pads/dilations per axis.
  out.push_back({.n = 2, .c_in = 3, .h = 9, .w = 12, .c_out = 5, .kh = 3, .kw = 5, .stride_h = 2,
                 .stride_w = 1, .pad_h = 1, .pad_w = 2, .dil_h = 1, .dil_w = 2});
  out.push_back({.n = 3, .c_in = 2, .h = 7, .w = 5, .c_out = 4, .kh = 5, .kw = 1, .stride_h = 1,
                 .stride_w = 2, .pad_h = 2, .pad_w = 0, .dil_h = 1, .dil_w = 1});
  out.push_back({.n = 1, .c_in = 3, .h = 5, .w = 9, .c_out = 2, .kh = 1, .kw = 3, .stride_h = 1,
                 .stride_w = 1, .pad_h = 0, .pad_w = 0});  // 1-wide in h only: not pointwise
  // Large enough for the GEMM to block and thread: 1x1 pointwise and 3x3.
  out.push_back({.n = 2, .c_in = 16, .h = 20, .w = 17, .c_out = 24, .kh = 1, .kw = 1});
  out.push_back({.n = 2, .c_in = 16, .h = 20, .w = 17, .c_out = 24, .kh = 3, .kw = 3,
                 .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1});
  return out;
}

}  // namespace

TEST_CASE("conv2d float matches a direct double reference") {
  std::uint64_t seed = 100;
  int count = 0;
  for (const auto& s : shape_grid()) {
    run_case<float>(s, seed++, count % 3 == 0 ? 2 : 1);
    ++count;
  }
  MESSAGE("conv2d float shapes: ", count);
  CHECK(count > 200);
}

TEST_CASE("conv2d in several chunks of images matches the reference, bit for bit at any thread count") {
  // 144 x (37*43) columns are 0.9 MiB per image, so 9 images take chunks of 4, 4 and 1
  // (conv2d_chunk); the odd sizes keep chunk edges off the GEMM's own block edges.
  const Conv2dShape s{.n = 9, .c_in = 16, .h = 37, .w = 43, .c_out = 3, .kh = 3, .kw = 3,
                      .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
  REQUIRE(kiln::cpu::detail::conv2d_chunk<float>(s) > 1);
  REQUIRE(kiln::cpu::detail::conv2d_chunk<float>(s) < s.n);
  run_case<float>(s, 11, 2);
  std::mt19937_64 rng(5);
  const auto x = random_vec<float>(x_size(s), rng), w = random_vec<float>(w_size(s), rng);
  const auto dy = random_vec<float>(y_size(s), rng);
  auto all = [&](int threads) {
    std::vector<float> y(y_size(s)), dx(x_size(s)), dw(w_size(s)), db(std::size_t(s.c_out));
    kiln::cpu::conv2d_forward<float>(s, x.data(), w.data(), nullptr, y.data(), threads);
    kiln::cpu::conv2d_backward_data(s, dy.data(), w.data(), dx.data(), threads);
    kiln::cpu::conv2d_backward_filter(s, x.data(), dy.data(), dw.data(), db.data(), threads);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    y.insert(y.end(), db.begin(), db.end());
    return y;
  };
  CHECK(all(1) == all(2));
}

TEST_CASE("conv2d double matches a direct double reference to 1e-12") {
  std::uint64_t seed = 5000;
  for (const auto& s : shape_grid()) run_case<double>(s, seed++, 1);
}

TEST_CASE("conv2d backward matches central differences of sum(y * g)") {
  const Conv2dShape shapes[] = {
      {.n = 2, .c_in = 3, .h = 7, .w = 5, .c_out = 2, .kh = 3, .kw = 3, .stride_h = 2,
       .stride_w = 1, .pad_h = 1, .pad_w = 2, .dil_h = 1, .dil_w = 2},
      {.n = 1, .c_in = 2, .h = 5, .w = 6, .c_out = 3, .kh = 1, .kw = 1},
  };
  for (const auto& s : shapes) {
    INFO(describe(s));
    std::mt19937_64 rng(77);
    auto x = random_vec<double>(x_size(s), rng), w = random_vec<double>(w_size(s), rng);
    auto bias = random_vec<double>(std::size_t(s.c_out), rng);
    const auto g = random_vec<double>(y_size(s), rng);
    auto loss = [&] {
      std::vector<double> y(y_size(s));
      kiln::cpu::conv2d_forward(s, x.data(), w.data(), bias.data(), y.data(), 1);
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * g[i];
      return l;
    };
    std::vector<double> dx(x_size(s)), dw(w_size(s)), db(std::size_t(s.c_out));
    kiln::cpu::conv2d_backward_data(s, g.data(), w.data(), dx.data(), 1);
    kiln::cpu::conv2d_backward_filter(s, x.data(), g.data(), dw.data(), db.data(), 1);
    auto fd_check = [&](const char* what, std::vector<double>& p, const std::vector<double>& grad) {
      const double h = 1e-6;
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double saved = p[i];
        p[i] = saved + h;
        const double lp = loss();
        p[i] = saved - h;
        const double lm = loss();
        p[i] = saved;
        const double fd = (lp - lm) / (2 * h);
        INFO(what, " i=", i, " analytic=", grad[i], " fd=", fd);
        CHECK(std::abs(fd - grad[i]) <= 1e-7 * std::max(1.0, std::abs(grad[i])));
      }
    };
    fd_check("dx", x, dx);
    fd_check("dw", w, dw);
    fd_check("dbias", bias, db);
  }
}

namespace {
void expect_shape_error(const Conv2dShape& s, const std::vector<std::string>& needles) {
  INFO(describe(s));
  std::vector<float> buf(4096);
  CHECK_THROWS_AS(kiln::cpu::conv2d_forward<float>(s, buf.data(), buf.data(), nullptr,
                                                   buf.data()),
                  kiln::ShapeError);
  CHECK_THROWS_AS(kiln::cpu::conv2d_backward_data<float>(s, buf.data(), buf.data(), buf.data()),
                  kiln::ShapeError);
  CHECK_THROWS_AS(kiln::cpu::conv2d_backward_filter<float>(s, buf.data(), buf.data(), buf.data(),
                                                           nullptr),
                  kiln::ShapeError);
  try {
    s.check();
    FAIL("check() did not throw");
  } catch (const kiln::ShapeError& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& n : needles) CHECK(msg.find(n) != std::string::npos);
  }
}
}  // namespace

TEST_CASE("conv2d shape errors name the offending sizes") {
  const Conv2dShape ok{.n = 1, .c_in = 1, .h = 5, .w = 5, .c_out = 1, .kh = 3, .kw = 3};
  CHECK_NOTHROW(ok.check());
  CHECK(ok.out_h() == 3);
  CHECK(ok.out_w() == 3);

  auto s = ok;
  s.pad_h = -1;
  expect_shape_error(s, {"pad", "pad_h=-1"});
  s = ok;
  s.kh = 7;  // 7 > 5 with no padding: empty output
  expect_shape_error(s, {"empty output", "h=5", "pad_h=0", "kh=7"});
  s = ok;
  s.kw = 3;
  s.dil_w = 3;  // dilated extent 7 > 5 + 2*0
  expect_shape_error(s, {"empty output", "dil_w=3"});
  s = ok;
  s.stride_w = 0;
  expect_shape_error(s, {"stride", "stride_w=0"});
  s = ok;
  s.c_in = 0;
  expect_shape_error(s, {"c_in=0"});
  s = ok;
  s.n = -2;
  expect_shape_error(s, {"n=-2"});
  s = ok;
  s.kw = 0;
  expect_shape_error(s, {"kernel", "kw=0"});
  s = ok;
  s.dil_h = 0;
  expect_shape_error(s, {"dilation", "dil_h=0"});

  // Padding makes a too-large kernel fit again: 5 + 2*1 = 7.
  s = ok;
  s.kh = 7;
  s.pad_h = 1;
  CHECK_NOTHROW(s.check());
  CHECK(s.out_h() == 1);
}
