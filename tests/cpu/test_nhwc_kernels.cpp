// Tests for the channels-last kernels (conv2d_nhwc.hpp, conv2d_winograd.hpp, batchnorm2d_nhwc.hpp,
// pool2d_nhwc.hpp) against the NCHW kernels on the same data transposed. Convolution sums in
// another order (the patch is (i, j, c) instead of (c, i, j); Winograd's transforms add a few
// additions of values no larger than 4x the inputs'), so it is held to the dot-product error
// bound with its 4x slack. Pooling
// does each channel's arithmetic in the NCHW kernel's order and must match bit for bit (argmax
// included); batch norm does too, but the compiler may fuse different multiply-adds, so it is
// held to the summation bound (see bn_case) and its exact matches are counted.
#include <kiln/backend/cpu/batchnorm2d_nhwc.hpp>
#include <kiln/backend/cpu/conv2d_nhwc.hpp>
#include <kiln/backend/cpu/pool2d_nhwc.hpp>
#include <kiln/expr/functors.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

using kiln::index_t;
using kiln::cpu::Conv2dShape;
using kiln::cpu::Pool2dShape;

// [N, C, H, W] <-> [N, H, W, C].
template <class V>
V to_nhwc(const V& v, index_t n, index_t c, index_t h, index_t w) {
  V out(v.size());
  for (index_t i = 0; i < n; ++i)
    for (index_t ch = 0; ch < c; ++ch)
      for (index_t p = 0; p < h * w; ++p)
        out[std::size_t((i * h * w + p) * c + ch)] = v[std::size_t((i * c + ch) * h * w + p)];
  return out;
}
template <class V>
V to_nchw(const V& v, index_t n, index_t c, index_t h, index_t w) {
  V out(v.size());
  for (index_t i = 0; i < n; ++i)
    for (index_t ch = 0; ch < c; ++ch)
      for (index_t p = 0; p < h * w; ++p)
        out[std::size_t((i * c + ch) * h * w + p)] = v[std::size_t((i * h * w + p) * c + ch)];
  return out;
}

template <class T>
std::vector<T> random_vec(std::size_t size, std::mt19937_64& rng, double lo = -1.0,
                          double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(size);
  for (auto& e : v) e = T(dist(rng));
  return v;
}

template <class T>
std::vector<T> abs_of(const std::vector<T>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::abs(v[i]);
  return out;
}

template <class T>
std::vector<double> as_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Same bits everywhere (NaN payloads and signed zeros included); reports the first few misses.
template <class T>
void check_identical(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ < 3)
      FAIL_CHECK(std::string(what), " differs at ", i, ": got ", double(got[i]), " want ",
                 double(want[i]));
  CHECK_MESSAGE(bad == 0, std::string(what), ": ", bad, " of ", got.size(), " differ");
}

// ---- convolution -----------------------------------------------------------------------------

std::string describe(const Conv2dShape& s) {
  return kiln::detail::concat("n=", s.n, " cin=", s.c_in, " h=", s.h, " w=", s.w,
                              " cout=", s.c_out, " k=", s.kh, "x", s.kw, " stride=", s.stride_h,
                              ",", s.stride_w, " pad=", s.pad_h, ",", s.pad_w, " dil=", s.dil_h,
                              ",", s.dil_w);
}

std::size_t x_size(const Conv2dShape& s) { return std::size_t(s.n * s.c_in * s.h * s.w); }
std::size_t w_size(const Conv2dShape& s) { return std::size_t(s.c_out * s.col_rows()); }
std::size_t y_size(const Conv2dShape& s) {
  return std::size_t(s.n * s.c_out * s.out_h() * s.out_w());
}

// Both kernels are within gamma_len * sum|terms| of the exact value (any summation order, FMA
// or not), so they are within twice that of each other; 4x slack as test_conv2d.cpp. mag is the
// NCHW kernel run in double on |inputs|: sum|terms| per element.
template <class T>
void check_close(const char* what, const Conv2dShape& s, const std::vector<T>& got,
                 const std::vector<T>& want, const std::vector<double>& mag, index_t len) {
  const double u = std::is_same_v<T, float> ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
  REQUIRE(got.size() == want.size());
  REQUIRE(mag.size() == want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = 2 * 4.0 * double(len) * u * mag[i] + 1e-300;
    const double err = std::abs(double(got[i]) - double(want[i]));
    if (!(err <= tol) && bad++ < 3)
      FAIL_CHECK(std::string(what), " ", describe(s), " i=", i, " got=", double(got[i]),
                 " want=", double(want[i]), " tol=", tol);
  }
  CHECK_MESSAGE(bad == 0, std::string(what), " ", describe(s), ": ", bad, " out of bound");
}

// conv2d_nhwc_* on the transposed data against conv2d_* (outputs start as NaN: they must be
// overwritten, never read).
template <class T>
void conv_case(const Conv2dShape& s, std::uint64_t seed, int threads) {
  INFO(describe(s), " threads=", threads);
  namespace cpu = kiln::cpu;
  std::mt19937_64 rng(seed);
  const index_t oh = s.out_h(), ow = s.out_w();
  const auto x = random_vec<T>(x_size(s), rng), w = random_vec<T>(w_size(s), rng);
  const auto bias = random_vec<T>(std::size_t(s.c_out), rng), dy = random_vec<T>(y_size(s), rng);
  const auto xh = to_nhwc(x, s.n, s.c_in, s.h, s.w), dyh = to_nhwc(dy, s.n, s.c_out, oh, ow);
  const auto ax = as_double(abs_of(x)), aw = as_double(abs_of(w));
  const auto ab = as_double(abs_of(bias)), ady = as_double(abs_of(dy));
  const T nan = std::numeric_limits<T>::quiet_NaN();
  auto y_nchw = [&](const std::vector<T>& v) { return to_nchw(v, s.n, s.c_out, oh, ow); };

  std::vector<T> want(y_size(s)), got(y_size(s), nan);
  std::vector<double> mag(y_size(s));
  cpu::conv2d_forward(s, x.data(), w.data(), bias.data(), want.data(), 1);
  cpu::conv2d_nhwc_forward(s, xh.data(), w.data(), bias.data(), got.data(), threads);
  cpu::conv2d_forward(s, ax.data(), aw.data(), ab.data(), mag.data(), 1);
  check_close("forward", s, y_nchw(got), want, mag, s.col_rows() + 1);

  std::fill(got.begin(), got.end(), nan);
  cpu::conv2d_forward<T>(s, x.data(), w.data(), nullptr, want.data(), 1);
  cpu::conv2d_nhwc_forward<T>(s, xh.data(), w.data(), nullptr, got.data(), threads);
  cpu::conv2d_forward<double>(s, ax.data(), aw.data(), nullptr, mag.data(), 1);
  check_close("forward/no bias", s, y_nchw(got), want, mag, s.col_rows());

  std::vector<T> dx_want(x_size(s)), dx(x_size(s), nan);
  std::vector<double> dx_mag(x_size(s));
  cpu::conv2d_backward_data(s, dy.data(), w.data(), dx_want.data(), 1);
  cpu::conv2d_nhwc_backward_data(s, dyh.data(), w.data(), dx.data(), threads);
  cpu::conv2d_backward_data(s, ady.data(), aw.data(), dx_mag.data(), 1);
  check_close("backward_data", s, to_nchw(dx, s.n, s.c_in, s.h, s.w), dx_want, dx_mag,
              s.c_out * s.kh * s.kw);
  {  // accumulate: added to what the gradient holds (a skip connection's contribution), both layouts
    const auto base = random_vec<T>(x_size(s), rng), baseh = to_nhwc(base, s.n, s.c_in, s.h, s.w);
    std::vector<T> acc = base, acch = baseh, sum(x_size(s));
    std::vector<double> sum_mag(x_size(s));
    for (std::size_t i = 0; i < sum.size(); ++i) {
      sum[i] = T(dx_want[i] + base[i]);
      sum_mag[i] = dx_mag[i] + std::abs(double(base[i]));
    }
    cpu::conv2d_backward_data(s, dy.data(), w.data(), acc.data(), threads, /*accumulate=*/true);
    cpu::conv2d_nhwc_backward_data(s, dyh.data(), w.data(), acch.data(), threads, /*accumulate=*/true);
    check_close("backward_data/accumulate", s, acc, sum, sum_mag, s.c_out * s.kh * s.kw + 1);
    check_close("backward_data/accumulate nhwc", s, to_nchw(acch, s.n, s.c_in, s.h, s.w), sum, sum_mag,
                s.c_out * s.kh * s.kw + 1);
  }

  std::vector<T> dw_want(w_size(s)), db_want(std::size_t(s.c_out));
  std::vector<T> dw(w_size(s), nan), db(std::size_t(s.c_out), nan);
  std::vector<double> dw_mag(w_size(s)), db_mag(std::size_t(s.c_out));
  cpu::conv2d_backward_filter(s, x.data(), dy.data(), dw_want.data(), db_want.data(), 1);
  cpu::conv2d_nhwc_backward_filter(s, xh.data(), dyh.data(), dw.data(), db.data(), threads);
  cpu::conv2d_backward_filter(s, ax.data(), ady.data(), dw_mag.data(), db_mag.data(), 1);
  check_close("backward_filter", s, dw, dw_want, dw_mag, s.n * oh * ow);
  // dbias is summed in double over the rows in the NCHW kernel's order: the same bits.
  check_identical("backward_filter/dbias", db, db_want);

  std::vector<T> dw2(w_size(s), nan);  // dbias == nullptr is allowed and changes nothing else
  cpu::conv2d_nhwc_backward_filter<T>(s, xh.data(), dyh.data(), dw2.data(), nullptr, threads);
  check_identical("backward_filter/no dbias", dw2, dw);
}

// Odd shapes: C in {1, 3, 17}, non-square images, kernels 1/3/5, pad 0/1/2, stride 1/2,
// dilation 1/2, batch 1 or 3.
std::vector<Conv2dShape> conv_grid() {
  std::vector<Conv2dShape> out;
  const index_t hw[][2] = {{7, 5}, {9, 12}};
  const index_t chans[][2] = {{1, 3}, {3, 1}, {3, 17}, {17, 5}};
  int i = 0;
  for (auto& ch : chans)
    for (auto [h, w] : hw)
      for (index_t k : {1, 3, 5})
        for (index_t pad : {0, 1, 2})
          for (index_t stride : {1, 2})
            for (index_t dil : {1, 2}) {
              Conv2dShape s{.n = i++ % 2 ? 3 : 1, .c_in = ch[0], .h = h, .w = w, .c_out = ch[1],
                            .kh = k, .kw = k, .stride_h = stride, .stride_w = stride,
                            .pad_h = pad, .pad_w = pad, .dil_h = dil, .dil_w = dil};
              if (s.out_h() > 0 && s.out_w() > 0) out.push_back(s);
            }
  // Per-axis differences, and sizes where the GEMM blocks and threads.
  out.push_back({.n = 3, .c_in = 17, .h = 9, .w = 12, .c_out = 5, .kh = 3, .kw = 5, .stride_h = 2,
                 .stride_w = 1, .pad_h = 1, .pad_w = 2, .dil_h = 1, .dil_w = 2});
  out.push_back({.n = 3, .c_in = 2, .h = 7, .w = 5, .c_out = 4, .kh = 5, .kw = 1, .stride_h = 1,
                 .stride_w = 2, .pad_h = 2, .pad_w = 0});
  out.push_back({.n = 3, .c_in = 3, .h = 9, .w = 12, .c_out = 17, .kh = 1, .kw = 1, .stride_h = 2,
                 .stride_w = 1});  // 1x1 but not pointwise: strided in h only
  out.push_back({.n = 2, .c_in = 16, .h = 20, .w = 17, .c_out = 24, .kh = 1, .kw = 1});
  out.push_back({.n = 2, .c_in = 16, .h = 20, .w = 17, .c_out = 24, .kh = 3, .kw = 3,
                 .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1});
  // Winograd's shapes (conv2d_winograd_applies): padding 0, 1 and 2, odd and even sizes (the
  // last tiles' spare row or column), one row of output, more channels in than out and fewer.
  for (index_t pad : {0, 1, 2})
    for (auto [h, w] : {std::pair<index_t, index_t>{5, 8}, {7, 3}, {3, 10}})
      out.push_back({.n = pad == 1 ? 3 : 1, .c_in = pad == 2 ? 33 : 16, .h = h, .w = w,
                     .c_out = pad == 0 ? 40 : 17, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                     .pad_h = pad, .pad_w = pad});
  // Images large next to their channels run F(4x4, 3x3) forward and backward-data
  // (winograd_tile_side): ResNet's 14x14 (4 tiles of 4 cover 16: spare rows and columns), a
  // 13-wide image, and padding 0, 1 and 2 on 17 x 18.
  out.push_back({.n = 2, .c_in = 24, .h = 14, .w = 13, .c_out = 16, .kh = 3, .kw = 3, .stride_h = 1,
                 .stride_w = 1, .pad_h = 1, .pad_w = 1});
  for (index_t pad : {0, 1, 2})
    out.push_back({.n = 2, .c_in = 16, .h = 17, .w = 18, .c_out = 20, .kh = 3, .kw = 3, .stride_h = 1,
                   .stride_w = 1, .pad_h = pad, .pad_w = pad});
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("conv2d_nhwc matches conv2d on transposed data", T, float, double) {
  std::uint64_t seed = std::is_same_v<T, float> ? 100 : 9000;
  int count = 0;
  int f4 = 0;  // shapes whose forward and backward-data run F(4x4, 3x3)
  for (const auto& s : conv_grid()) {
    conv_case<T>(s, seed++, ++count % 3 == 0 ? 2 : 1);
    f4 += kiln::cpu::conv2d_winograd_applies(s) &&
          kiln::cpu::detail::winograd_tile_side(s.n, s.out_h(), s.out_w(), s.c_in, s.c_out) == 4 &&
          kiln::cpu::detail::winograd_tile_side(s.n, s.h, s.w, s.c_out, s.c_in) == 4;
  }
  MESSAGE("conv2d_nhwc shapes: ", count, ", of them F(4x4, 3x3): ", f4);
  CHECK(count > 250);
  CHECK(f4 >= 4);
}

TEST_CASE("conv2d_nhwc in several chunks of images: bit-identical at 1 and 2 threads") {
  // 16 x 9 x 37 x 43 column values are 0.9 MiB per image in float: chunks of 4, 4 and 1 images.
  // 37 x 43 output pixels per image: chunk boundaries do not fall on the GEMM's k blocks, so
  // chunking that followed the thread count would change dw's sums.
  const Conv2dShape shapes[] = {
      {.n = 9, .c_in = 16, .h = 37, .w = 43, .c_out = 3, .kh = 3, .kw = 3, .stride_h = 1,
       .stride_w = 1, .pad_h = 1, .pad_w = 1},
      {.n = 9, .c_in = 144, .h = 37, .w = 43, .c_out = 5, .kh = 1, .kw = 1},  // pointwise path
  };
  for (const auto& s : shapes) {
    INFO(describe(s));
    const index_t chunk = kiln::cpu::detail::conv2d_chunk<float>(s);
    REQUIRE(chunk > 1);
    REQUIRE(chunk < s.n);
    conv_case<float>(s, 11, 2);
    std::mt19937_64 rng(5);
    const auto x = random_vec<float>(x_size(s), rng), w = random_vec<float>(w_size(s), rng);
    const auto b = random_vec<float>(std::size_t(s.c_out), rng);
    const auto dy = random_vec<float>(y_size(s), rng);
    auto all = [&](int threads) {
      std::vector<float> y(y_size(s)), dx(x_size(s)), dw(w_size(s)), db(std::size_t(s.c_out));
      kiln::cpu::conv2d_nhwc_forward(s, x.data(), w.data(), b.data(), y.data(), threads);
      kiln::cpu::conv2d_nhwc_backward_data(s, dy.data(), w.data(), dx.data(), threads);
      kiln::cpu::conv2d_nhwc_backward_filter(s, x.data(), dy.data(), dw.data(), db.data(),
                                             threads);
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), dw.begin(), dw.end());
      y.insert(y.end(), db.begin(), db.end());
      return y;
    };
    check_identical("1 vs 2 threads", all(2), all(1));
  }
}

TEST_CASE("conv2d_nhwc: Winograd is the convolution, chosen automatically, and gemm keeps the old bits") {
  namespace cpu = kiln::cpu;
  const Conv2dShape shapes[] = {
      {.n = 2, .c_in = 16, .h = 9, .w = 6, .c_out = 24, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
       .pad_h = 1, .pad_w = 1},
      {.n = 1, .c_in = 20, .h = 5, .w = 7, .c_out = 16, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
       .pad_h = 2, .pad_w = 0},
  };
  for (const auto& s : shapes) {
    INFO(describe(s));
    REQUIRE(cpu::conv2d_winograd_applies(s));
    std::mt19937_64 rng(41);
    const auto x = random_vec<double>(x_size(s), rng), w = random_vec<double>(w_size(s), rng);
    const auto dy = random_vec<double>(y_size(s), rng);
    auto run = [&](cpu::conv_algorithm a) {
      cpu::set_conv_algorithm(a);
      std::vector<double> y(y_size(s)), dx(x_size(s)), dw(w_size(s));
      cpu::conv2d_nhwc_forward<double>(s, x.data(), w.data(), nullptr, y.data(), 1);
      cpu::conv2d_nhwc_backward_data<double>(s, dy.data(), w.data(), dx.data(), 1);
      cpu::conv2d_nhwc_backward_filter<double>(s, x.data(), dy.data(), dw.data(), nullptr, 1);
      cpu::set_conv_algorithm(cpu::conv_algorithm::automatic);
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), dw.begin(), dw.end());
      return y;
    };
    const auto direct = run(cpu::conv_algorithm::gemm), winograd = run(cpu::conv_algorithm::automatic);
    // fp64: the two algorithms agree to rounding (inputs in [-1, 1], sums of at most 9 * 33 *
    // 3 * 9 * 7 terms): a wrong transform is off by O(1).
    double worst = 0;
    for (std::size_t i = 0; i < direct.size(); ++i) worst = std::max(worst, std::abs(direct[i] - winograd[i]));
    CHECK(worst < 1e-12);
    CHECK(worst > 0);  // the automatic choice ran another algorithm, not the direct one again

    // automatic = the Winograd entry points bit for bit; gemm = im2col + kiln's GEMM bit for bit.
    std::vector<double> y(y_size(s)), want(y_size(s));
    cpu::conv2d_winograd_forward<double>(s, x.data(), w.data(), 1, [&](index_t pixel, const double* v) {
      std::copy(v, v + s.c_out, want.begin() + pixel * s.c_out);
    });
    cpu::conv2d_nhwc_forward<double>(s, x.data(), w.data(), nullptr, y.data(), 1);
    check_identical("automatic forward", y, want);
    const index_t k = s.col_rows(), ohw = s.out_h() * s.out_w(), rows = s.n * ohw;
    std::vector<double> col(std::size_t(rows * k)), wp(std::size_t(s.c_out * k));
    for (index_t i = 0; i < s.n; ++i)
      for (index_t oh = 0; oh < s.out_h(); ++oh)
        cpu::detail::im2col_nhwc(s, x.data() + i * s.h * s.w * s.c_in, oh, col.data() + (i * ohw + oh * s.out_w()) * k);
    cpu::detail::conv2d_nhwc_permute<true>(s, w.data(), wp.data());
    cpu::gemm_own<double>(cpu::trans::no, cpu::trans::yes, rows, s.c_out, k, 1.0, col.data(), k, wp.data(), k, 0.0,
                          want.data(), s.c_out, 1);
    check_identical("gemm forward", std::vector<double>(direct.begin(), direct.begin() + y_size(s)), want);
  }
  {  // Called directly on a shape it does not compute: an error naming the function and the shape.
    const Conv2dShape strided{.n = 1, .c_in = 16, .h = 8, .w = 8, .c_out = 16, .kh = 3, .kw = 3,
                              .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
    std::vector<float> x(x_size(strided)), w(w_size(strided)), dy(y_size(strided)), dw(w_size(strided));
    CHECK_THROWS_WITH_AS(cpu::conv2d_winograd_backward_filter<float>(strided, x.data(), dy.data(), dw.data(), 1),
                         doctest::Contains("kiln::cpu::conv2d_winograd_backward_filter: Winograd takes "
                                           "3x3, stride-1, undilated convolutions with padding <= 2, got 3x3 stride 2,2"),
                         kiln::ShapeError);
    CHECK_THROWS_AS(cpu::conv2d_winograd_forward<float>(strided, x.data(), w.data(), 1, [](index_t, const float*) {}),
                    kiln::ShapeError);
  }
  // Below 16 channels, or strided, or 5x5: the direct path.
  CHECK_FALSE(cpu::conv2d_winograd_applies({.n = 1, .c_in = 3, .h = 8, .w = 8, .c_out = 64, .kh = 3, .kw = 3}));
  CHECK_FALSE(cpu::conv2d_winograd_applies(
      {.n = 1, .c_in = 64, .h = 8, .w = 8, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2}));
  CHECK_FALSE(cpu::conv2d_winograd_applies({.n = 1, .c_in = 64, .h = 8, .w = 8, .c_out = 64, .kh = 5, .kw = 5}));
}

TEST_CASE("conv2d_nhwc Winograd in several chunks of tiles: bit-identical at 1 and 2 threads") {
  // 256 channels: 113 tiles per chunk for F(4x4, 3x3) (forward, backward-data), 256 for F(2x2,
  // 3x3) (backward-filter; WinogradGeometry::chunk); 3 images of 10 x 10 tiles of 4x4 (20 x 19 of
  // 2x2) make several chunks, the last partial, and backward-filter accumulates across them.
  const Conv2dShape s{.n = 3, .c_in = 256, .h = 40, .w = 38, .c_out = 24, .kh = 3, .kw = 3,
                      .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
  REQUIRE(kiln::cpu::conv2d_winograd_applies(s));
  for (index_t m : {2, 4}) {
    const kiln::cpu::detail::WinogradGeometry g{s.n, s.h, s.w, s.c_in, s.c_out, s.pad_h, s.pad_w, m};
    REQUIRE(g.chunk<float>() < g.tiles());
    REQUIRE(g.tiles() % g.chunk<float>() != 0);
  }
  std::mt19937_64 rng(43);
  const auto x = random_vec<float>(x_size(s), rng), w = random_vec<float>(w_size(s), rng);
  const auto dy = random_vec<float>(y_size(s), rng);
  auto all = [&](int threads) {
    std::vector<float> y(y_size(s)), dx(x_size(s)), dw(w_size(s));
    kiln::cpu::conv2d_nhwc_forward<float>(s, x.data(), w.data(), nullptr, y.data(), threads);
    kiln::cpu::conv2d_nhwc_backward_data(s, dy.data(), w.data(), dx.data(), threads);
    kiln::cpu::conv2d_nhwc_backward_filter<float>(s, x.data(), dy.data(), dw.data(), nullptr, threads);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  check_identical("1 vs 2 threads", all(2), all(1));
  conv_case<float>(s, 44, 2);  // and the convolution, against NCHW
}

TEST_CASE("conv2d_nhwc_forward_epilogue hands each pixel row to the epilogue once") {
  const Conv2dShape s{.n = 3, .c_in = 5, .h = 9, .w = 7, .c_out = 6, .kh = 3, .kw = 3,
                      .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 0};
  const index_t rows = s.n * s.out_h() * s.out_w();
  std::mt19937_64 rng(21);
  const auto x = random_vec<float>(x_size(s), rng), w = random_vec<float>(w_size(s), rng);
  const auto bias = random_vec<float>(std::size_t(s.c_out), rng);
  std::vector<float> plain(y_size(s)), y(y_size(s)), pre(y_size(s));
  kiln::cpu::conv2d_nhwc_forward(s, x.data(), w.data(), bias.data(), plain.data(), 2);
  std::vector<int> calls(std::size_t(rows), 0);
  std::vector<char> bad_args(std::size_t(rows), 0);
  // A fused bias + relu that also keeps the pre-activation (rows are disjoint across threads).
  kiln::cpu::conv2d_nhwc_forward_epilogue(
      s, x.data(), w.data(), y.data(), 2,
      [&](index_t row, const float* z, float* yr, index_t c) {
        ++calls[std::size_t(row)];
        bad_args[std::size_t(row)] = yr != y.data() + row * s.c_out || c != s.c_out;
        for (index_t p = 0; p < c; ++p) {
          pre[std::size_t(row * c + p)] = z[p] + bias[std::size_t(p)];
          yr[p] = kiln::fn::Relu{}(pre[std::size_t(row * c + p)]);
        }
      });
  CHECK(std::count(calls.begin(), calls.end(), 1) == rows);
  CHECK(std::count(bad_args.begin(), bad_args.end(), 0) == rows);
  check_identical("pre-activation", pre, plain);
  for (auto& v : plain) v = kiln::fn::Relu{}(v);
  check_identical("relu", y, plain);
}

TEST_CASE("conv2d_nhwc_forward_epilogue: an epilogue that copies only lets the GEMM write y") {
  // Several chunks of images (the GEMM writes each chunk's rows at its offset), strided and 1x1.
  for (const Conv2dShape& s :
       {Conv2dShape{.n = 5, .c_in = 4, .h = 11, .w = 9, .c_out = 7, .kh = 3, .kw = 3, .stride_h = 2,
                    .stride_w = 2, .pad_h = 1, .pad_w = 1},
        Conv2dShape{.n = 3, .c_in = 6, .h = 5, .w = 5, .c_out = 9, .kh = 1, .kw = 1}}) {
    INFO(describe(s));
    std::mt19937_64 rng(22);
    const auto x = random_vec<float>(x_size(s), rng), w = random_vec<float>(w_size(s), rng);
    std::vector<float> plain(y_size(s)), y(y_size(s), std::numeric_limits<float>::quiet_NaN());
    kiln::cpu::conv2d_nhwc_forward<float>(s, x.data(), w.data(), nullptr, plain.data(), 1);
    struct Copy {
      int* calls;
      bool copies_only() const { return true; }
      void operator()(index_t, const float*, float* yr, index_t c) const {  // never called
        ++*calls;
        std::fill(yr, yr + c, -1.f);
      }
    };
    int calls = 0;
    kiln::cpu::conv2d_nhwc_forward_epilogue(s, x.data(), w.data(), y.data(), 2, Copy{&calls});
    CHECK(calls == 0);
    check_identical("y", y, plain);
  }
}

TEST_CASE("conv2d_nhwc_forward packs patches from x: the same bits as im2col and gemm_own") {
  // Padding, stride, dilation; k = 9 * 40 = 360 (two k blocks), rows not a multiple of the
  // panel height, one image and several.
  for (const Conv2dShape& s :
       {Conv2dShape{.n = 3, .c_in = 40, .h = 9, .w = 8, .c_out = 33, .kh = 3, .kw = 3, .stride_h = 2,
                    .stride_w = 1, .pad_h = 1, .pad_w = 1},
        Conv2dShape{.n = 1, .c_in = 3, .h = 13, .w = 11, .c_out = 8, .kh = 5, .kw = 3, .stride_h = 1,
                    .stride_w = 2, .pad_h = 2, .pad_w = 0, .dil_h = 2, .dil_w = 1},
        Conv2dShape{.n = 2, .c_in = 7, .h = 6, .w = 6, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 1,
                    .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 2}}) {
    INFO(describe(s));
    std::mt19937_64 rng(31);
    const auto x = random_vec<float>(x_size(s), rng), w = random_vec<float>(w_size(s), rng);
    const index_t k = s.col_rows(), ohw = s.out_h() * s.out_w(), rows = s.n * ohw;
    std::vector<float> col(std::size_t(rows * k)), wp(std::size_t(s.c_out * k));
    for (index_t i = 0; i < s.n; ++i)
      for (index_t oh = 0; oh < s.out_h(); ++oh)
        kiln::cpu::detail::im2col_nhwc(s, x.data() + i * s.h * s.w * s.c_in, oh,
                                       col.data() + (i * ohw + oh * s.out_w()) * k);
    kiln::cpu::detail::conv2d_nhwc_permute<true>(s, w.data(), wp.data());
    std::vector<float> want(y_size(s)), got(y_size(s));
    kiln::cpu::gemm_own<float>(kiln::cpu::trans::no, kiln::cpu::trans::yes, rows, s.c_out, k, 1.f, col.data(), k, wp.data(), k, 0.f,
                               want.data(), s.c_out, 1);
    for (int threads : {1, 2}) {
      kiln::cpu::conv2d_nhwc_forward<float>(s, x.data(), w.data(), nullptr, got.data(), threads);
      check_identical("y", got, want);
    }
  }
}

TEST_CASE("conv2d_nhwc shape errors name the function and the sizes") {
  std::vector<float> buf(4096);
  float* p = buf.data();
  auto expect = [&](const Conv2dShape& s, const char* needle) {
    INFO(describe(s), " needle=", needle);
    CHECK_THROWS_WITH_AS(kiln::cpu::conv2d_nhwc_forward<float>(s, p, p, nullptr, p),
                         doctest::Contains(needle), kiln::ShapeError);
    CHECK_THROWS_WITH_AS(kiln::cpu::conv2d_nhwc_forward<float>(s, p, p, nullptr, p),
                         doctest::Contains("conv2d_nhwc_forward"), kiln::ShapeError);
    CHECK_THROWS_WITH_AS(kiln::cpu::conv2d_nhwc_backward_data<float>(s, p, p, p),
                         doctest::Contains("conv2d_nhwc_backward_data"), kiln::ShapeError);
    CHECK_THROWS_WITH_AS(kiln::cpu::conv2d_nhwc_backward_filter<float>(s, p, p, p, nullptr),
                         doctest::Contains(needle), kiln::ShapeError);
    CHECK_THROWS_WITH_AS(kiln::cpu::conv2d_nhwc_backward_filter<float>(s, p, p, p, nullptr),
                         doctest::Contains("conv2d_nhwc_backward_filter"), kiln::ShapeError);
  };
  const Conv2dShape ok{.n = 1, .c_in = 2, .h = 5, .w = 6, .c_out = 3, .kh = 3, .kw = 3};
  CHECK_NOTHROW(kiln::cpu::conv2d_nhwc_forward<float>(ok, p, p, nullptr, p, 1));
  auto s = ok;
  s.pad_h = -1;
  expect(s, "pad_h=-1");
  s = ok;
  s.kh = 7;
  expect(s, "kh=7");
  s = ok;
  s.dil_w = 4;  // dilated extent 9 > 6
  expect(s, "dil_w=4");
  s = ok;
  s.c_in = 0;
  expect(s, "c_in=0");
  s = ok;
  s.stride_w = 0;
  expect(s, "stride_w=0");
}

// ---- batch norm ------------------------------------------------------------------------------

namespace {

// Values not bit-identical to the NCHW kernel's, over all batch-norm comparisons (reported).
long bn_inexact = 0, bn_values = 0;

// |got - want| <= tol[i] elementwise.
template <class T>
void check_within(const char* what, const std::vector<T>& got, const std::vector<T>& want,
                  const std::vector<double>& tol) {
  REQUIRE(got.size() == want.size());
  REQUIRE(tol.size() == want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    bn_inexact += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    ++bn_values;
    if (!(std::abs(double(got[i]) - double(want[i])) <= tol[i]) && bad++ < 3)
      FAIL_CHECK(std::string(what), " at ", i, ": got ", double(got[i]), " want ",
                 double(want[i]), " tol ", tol[i]);
  }
  CHECK_MESSAGE(bad == 0, std::string(what), ": ", bad, " of ", got.size(), " out of bound");
}

// Every NHWC batch-norm function against its NCHW twin on the transposed data. Each channel runs
// the NCHW kernel's arithmetic in its order, so the two agree bit for bit unless the compiler
// fuses different multiply-adds in the two loops (GCC's FMA-chain tuning for Zen does, in
// double): a product then skips a rounding, and a sum of M terms can move by up to
// 2*M*u * sum|terms| (each is within gamma_M of exact). "bound" is twice that per unit of scale;
// every output is held to it times its scale, carried through the formulas. How many values
// were not bit-identical is reported. Channel 0 is
// constant (when c > 1), with a value whose sums are exact: it must normalise to exactly beta.
template <class T, class Act>
void bn_case(index_t n, index_t c, index_t h, index_t w, Act act, bool affine, int threads,
             std::uint64_t seed) {
  INFO("n=", n, " c=", c, " h=", h, " w=", w, " act=", std::string(typeid(Act).name()),
       " affine=", affine, " threads=", threads);
  namespace cpu = kiln::cpu;
  std::mt19937_64 rng(seed);
  const index_t hw = h * w;
  const std::size_t sz = std::size_t(n * c * hw), uc = std::size_t(c);
  auto chan = [&](std::size_t i) { return i / std::size_t(hw) % uc; };  // NCHW index -> channel
  // Channels with their own offset and spread, so means and variances are not ~0 and ~1/3.
  std::vector<T> x = random_vec<T>(sz, rng);
  const auto off = random_vec<double>(uc, rng, -3.0, 3.0);
  const auto spread = random_vec<double>(uc, rng, 0.1, 4.0);
  for (std::size_t i = 0; i < sz; ++i) {
    x[i] = T(off[chan(i)] + spread[chan(i)] * double(x[i]));
    if (c > 1 && chan(i) == 0) x[i] = T(0.75);
  }
  const auto dy = random_vec<T>(sz, rng);
  const auto gamma = random_vec<T>(uc, rng, -1.5, 1.5), beta = random_vec<T>(uc, rng);
  const auto rm0 = random_vec<T>(uc, rng), rv0 = random_vec<T>(uc, rng, 0.2, 2.0);
  const T* g = affine ? gamma.data() : nullptr;
  const T* b = affine ? beta.data() : nullptr;
  const auto xh = to_nhwc(x, n, c, h, w), dyh = to_nhwc(dy, n, c, h, w);
  auto back = [&](const std::vector<T>& v) { return to_nchw(v, n, c, h, w); };
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const double eps = 1e-5, mom = 0.1, big_m = double(n * hw);
  const double bound = 2 * 2 * big_m * (std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53);
  auto gc = [&](std::size_t ch) { return g ? double(g[ch]) : 1.0; };
  auto bc = [&](std::size_t ch) { return b ? double(b[ch]) : 0.0; };
  std::vector<double> mx(uc);  // mean |x| per channel
  for (std::size_t i = 0; i < sz; ++i) mx[chan(i)] += std::abs(double(x[i])) / big_m;

  // act((x - mean) * a + beta) at NCHW index i, and |dy * act'| there (the dz of the backward).
  auto pre = [&](std::size_t i, double mean, double a) {
    return T((x[i] - T(mean)) * T(a) + T(bc(chan(i))));
  };
  auto dz_mag = [&](std::size_t i, double mean, double a) {
    return std::abs(double(dy[i]) * double(act.d(pre(i, mean, a))));
  };
  // Backward checks for saved (or running) statistics mean / invstd, shared by train and eval:
  // sums of |dz| and |dz * (x - mean)| per channel.
  auto dz_sums = [&](const std::vector<double>& mean, const std::vector<double>& invstd,
                     std::vector<double>& mag_b, std::vector<double>& mag_xm) {
    mag_b.assign(uc, 0.0);
    mag_xm.assign(uc, 0.0);
    for (std::size_t i = 0; i < sz; ++i) {
      const std::size_t ch = chan(i);
      const double d = dz_mag(i, mean[ch], invstd[ch] * gc(ch));
      mag_b[ch] += d;
      mag_xm[ch] += d * std::abs(double(x[i]) - mean[ch]);
    }
  };

  if (n * hw > 1) {
    auto rm1 = rm0, rv1 = rv0, rm2 = rm0, rv2 = rv0;
    std::vector<T> y1(sz), sm1(uc), si1(uc), y2(sz, nan), sm2(uc, nan), si2(uc, nan);
    cpu::batchnorm2d_train_forward<T>(n, c, hw, x.data(), g, b, eps, mom, rm1.data(),
                                      rv1.data(), y1.data(), sm1.data(), si1.data(), 1, act);
    cpu::batchnorm2d_nhwc_train_forward<T>(n, c, hw, xh.data(), g, b, eps, mom, rm2.data(),
                                           rv2.data(), y2.data(), sm2.data(), si2.data(),
                                           threads, act);
    std::vector<double> t_mean(uc), t_invstd(uc), t_rm(uc), t_rv(uc), t_y(sz);
    for (std::size_t ch = 0; ch < uc; ++ch) {
      t_mean[ch] = bound * mx[ch];
      t_invstd[ch] = bound * double(si1[ch]);
      t_rm[ch] = bound * (mx[ch] + std::abs(double(rm1[ch])));
      t_rv[ch] = bound * double(rv1[ch]);
    }
    for (std::size_t i = 0; i < sz; ++i) {
      const std::size_t ch = chan(i);
      const double a = std::abs(double(si1[ch]) * gc(ch));
      t_y[i] = bound * (a * (mx[ch] + std::abs(double(x[i]) - double(sm1[ch]))) +
                        std::abs(bc(ch)) + std::abs(double(y1[i])));
    }
    check_within("save_mean", sm2, sm1, t_mean);
    check_within("save_invstd", si2, si1, t_invstd);
    check_within("running_mean", rm2, rm1, t_rm);
    check_within("running_var", rv2, rv1, t_rv);
    check_within("train y", back(y2), y1, t_y);
    if (c > 1 && std::is_same_v<Act, cpu::NoActivation>)
      for (index_t i = 0; i < n * hw; ++i)
        REQUIRE(y2[std::size_t(i * c)] == (affine ? beta[0] : T(0)));

    // Both get the NCHW kernel's saved statistics, so only the backward's own arithmetic differs.
    std::vector<T> dx1(sz), dg1(uc), db1(uc), dx2(sz, nan), dg2(uc, nan), db2(uc, nan);
    cpu::batchnorm2d_backward<T>(n, c, hw, x.data(), dy.data(), g, sm1.data(), si1.data(),
                                 dx1.data(), dg1.data(), db1.data(), 1, b, act);
    cpu::batchnorm2d_nhwc_backward<T>(n, c, hw, xh.data(), dyh.data(), g, sm1.data(), si1.data(),
                                      dx2.data(), dg2.data(), db2.data(), threads, b, act);
    const std::vector<double> mean(sm1.begin(), sm1.end()), invstd(si1.begin(), si1.end());
    std::vector<double> mag_b, mag_xm, t_dg(uc), t_db(uc), t_dx(sz);
    dz_sums(mean, invstd, mag_b, mag_xm);
    for (std::size_t ch = 0; ch < uc; ++ch) {
      t_db[ch] = bound * mag_b[ch];
      t_dg[ch] = bound * mag_xm[ch] * invstd[ch];
    }
    // dx = k * (dz - sum_dz / M - (x - mean) * invstd^2 * sum_dz_xm / M).
    for (std::size_t i = 0; i < sz; ++i) {
      const std::size_t ch = chan(i);
      const double xm = std::abs(double(x[i]) - mean[ch]), is = invstd[ch];
      t_dx[i] = bound * std::abs(gc(ch) * is) *
                (dz_mag(i, mean[ch], is * gc(ch)) + 2 * mag_b[ch] / big_m +
                 2 * xm * is * is * mag_xm[ch] / big_m);
    }
    check_within("backward dx", back(dx2), dx1, t_dx);
    check_within("backward dgamma", dg2, dg1, t_dg);
    check_within("backward dbeta", db2, db1, t_db);
  }

  std::vector<double> mean(uc), invstd(uc), t_y(sz), t_dx(sz), t_dg(uc), t_db(uc);
  for (std::size_t ch = 0; ch < uc; ++ch) {
    mean[ch] = double(rm0[ch]);
    invstd[ch] = 1.0 / std::sqrt(double(rv0[ch]) + eps);
  }
  std::vector<T> ye1(sz), ye2(sz, nan);
  cpu::batchnorm2d_eval_forward<T>(n, c, hw, x.data(), g, b, eps, rm0.data(), rv0.data(),
                                   ye1.data(), 1, act);
  cpu::batchnorm2d_nhwc_eval_forward<T>(n, c, hw, xh.data(), g, b, eps, rm0.data(), rv0.data(),
                                        ye2.data(), threads, act);
  std::vector<T> dx1(sz), dg1(uc), db1(uc), dx2(sz, nan), dg2(uc, nan), db2(uc, nan);
  cpu::batchnorm2d_eval_backward<T>(n, c, hw, x.data(), dy.data(), g, b, eps, rm0.data(),
                                    rv0.data(), dx1.data(), dg1.data(), db1.data(), 1, act);
  cpu::batchnorm2d_nhwc_eval_backward<T>(n, c, hw, xh.data(), dyh.data(), g, b, eps, rm0.data(),
                                         rv0.data(), dx2.data(), dg2.data(), db2.data(), threads,
                                         act);
  std::vector<double> mag_b, mag_xm;
  dz_sums(mean, invstd, mag_b, mag_xm);
  for (std::size_t i = 0; i < sz; ++i) {  // elementwise: only a fused multiply-add can differ
    const std::size_t ch = chan(i);
    const double a = std::abs(invstd[ch] * gc(ch));
    t_y[i] = bound * (a * std::abs(double(x[i]) - mean[ch]) + std::abs(bc(ch)) +
                      std::abs(double(ye1[i])));
    t_dx[i] = bound * a * (std::abs(double(dy[i])) + dz_mag(i, mean[ch], a));
  }
  for (std::size_t ch = 0; ch < uc; ++ch) {
    t_db[ch] = bound * mag_b[ch];
    t_dg[ch] = bound * mag_xm[ch] * invstd[ch];
  }
  check_within("eval y", back(ye2), ye1, t_y);
  check_within("eval backward dx", back(dx2), dx1, t_dx);
  check_within("eval backward dgamma", dg2, dg1, t_dg);
  check_within("eval backward dbeta", db2, db1, t_db);
}

template <class T, class Act>
int bn_grid(Act act, std::uint64_t seed) {
  const index_t hws[][2] = {{1, 1}, {4, 4}, {5, 7}, {9, 12}};
  int count = 0;
  for (index_t n : {1, 3})
    for (index_t c : {1, 3, 17, 70})  // 70: three blocks of channels, the last one partial
      for (auto& d : hws)
        for (bool affine : {true, false}) {
          bn_case<T>(n, c, d[0], d[1], act, affine, count % 2 ? 2 : 1, seed++);
          ++count;
        }
  return count;
}

}  // namespace

TEST_CASE_TEMPLATE("batchnorm2d_nhwc matches batchnorm2d on transposed data", T, float, double) {
  bn_inexact = bn_values = 0;
  int count = bn_grid<T>(kiln::cpu::NoActivation{}, 1);
  count += bn_grid<T>(kiln::fn::Relu{}, 1000);
  count += bn_grid<T>(kiln::fn::Silu{}, 2000);
  MESSAGE("batchnorm2d_nhwc cases: ", count, "; values not bit-identical to NCHW: ", bn_inexact,
          " of ", bn_values);
  CHECK(count == 3 * 64);
}

TEST_CASE("batchnorm2d_nhwc is bit-identical at 1, 2 and 8 threads") {
  // 70 channels: one range (blocks of 32, 32, 6) at 1 thread, 40 + 30 at 2, ranges of 8 at 8.
  const index_t n = 4, c = 70, hw = 37;
  std::mt19937_64 rng(8);
  const std::size_t sz = std::size_t(n * c * hw);
  const auto x = random_vec<float>(sz, rng, -2, 3), dy = random_vec<float>(sz, rng);
  const auto g = random_vec<float>(std::size_t(c), rng), b = random_vec<float>(std::size_t(c), rng);
  auto all = [&](int threads) {
    std::vector<float> rm(std::size_t(c), 0.f), rv(std::size_t(c), 1.f), y(sz), sm(rm), si(rm),
        dx(sz), dg(rm), db(rm);
    kiln::cpu::batchnorm2d_nhwc_train_forward(n, c, hw, x.data(), g.data(), b.data(), 1e-5, 0.1,
                                              rm.data(), rv.data(), y.data(), sm.data(), si.data(),
                                              threads, kiln::fn::Silu{});
    kiln::cpu::batchnorm2d_nhwc_backward(n, c, hw, x.data(), dy.data(), g.data(), sm.data(),
                                         si.data(), dx.data(), dg.data(), db.data(), threads,
                                         b.data(), kiln::fn::Silu{});
    for (auto* v : {&rm, &rv, &sm, &si, &dx, &dg, &db}) y.insert(y.end(), v->begin(), v->end());
    return y;
  };
  const auto one = all(1);
  check_identical("1 vs 2 threads", all(2), one);
  check_identical("1 vs 8 threads", all(8), one);
}

TEST_CASE("batchnorm2d_nhwc in place equals out of place") {
  const index_t n = 2, c = 5, hw = 21;
  std::mt19937_64 rng(4);
  const std::size_t sz = std::size_t(n * c * hw);
  const auto x = random_vec<double>(sz, rng), dy = random_vec<double>(sz, rng);
  std::vector<double> y(sz), sm(5), si(5), dx(sz), inplace = x, d_inplace = dy;
  kiln::cpu::batchnorm2d_nhwc_train_forward<double>(n, c, hw, x.data(), nullptr, nullptr, 1e-5,
                                                    0.1, nullptr, nullptr, y.data(), sm.data(),
                                                    si.data());
  kiln::cpu::batchnorm2d_nhwc_train_forward<double>(n, c, hw, inplace.data(), nullptr, nullptr,
                                                    1e-5, 0.1, nullptr, nullptr, inplace.data(),
                                                    nullptr, nullptr);
  check_identical("train y in place", inplace, y);
  kiln::cpu::batchnorm2d_nhwc_backward<double>(n, c, hw, x.data(), dy.data(), nullptr, sm.data(),
                                               si.data(), dx.data(), nullptr, nullptr);
  kiln::cpu::batchnorm2d_nhwc_backward<double>(n, c, hw, x.data(), d_inplace.data(), nullptr,
                                               sm.data(), si.data(), d_inplace.data(), nullptr,
                                               nullptr);
  check_identical("backward dx in place", d_inplace, dx);
}

TEST_CASE("batchnorm2d_nhwc reports bad sizes and arguments") {
  std::vector<float> buf(64, 0.5f), ch(4, 1.0f);
  float* p = buf.data();
  float* q = ch.data();
  using namespace kiln::cpu;
  auto train = [&](index_t n, index_t c, index_t hw, double eps = 1e-5, double mom = 0.1) {
    batchnorm2d_nhwc_train_forward<float>(n, c, hw, p, q, q, eps, mom, q, q, p, q, q);
  };
  CHECK_THROWS_WITH_AS(
      train(0, 2, 4),
      doctest::Contains("nhwc_train_forward: sizes must be positive, got n=0 c=2 hw=4"),
      kiln::ShapeError);
  CHECK_THROWS_WITH_AS(train(2, 2, 0), doctest::Contains("hw=0"), kiln::ShapeError);
  CHECK_THROWS_WITH_AS(train(1, 3, 1), doctest::Contains("more than 1 value per channel"),
                       kiln::ValueError);
  CHECK_NOTHROW(train(1, 3, 2));
  CHECK_THROWS_AS(train(2, 2, 4, -1e-5), kiln::ValueError);
  CHECK_THROWS_AS(train(2, 2, 4, 1e-5, 1.5), kiln::ValueError);
  CHECK_THROWS_AS(
      batchnorm2d_nhwc_train_forward<float>(2, 2, 4, p, q, q, 1e-5, 0.1, q, nullptr, p, q, q),
      kiln::ValueError);
  CHECK_NOTHROW(batchnorm2d_nhwc_eval_forward<float>(1, 3, 1, p, q, q, 1e-5, q, q, p));
  CHECK_THROWS_WITH_AS(batchnorm2d_nhwc_eval_forward<float>(2, 0, 4, p, q, q, 1e-5, q, q, p),
                       doctest::Contains("nhwc_eval_forward: sizes must be positive, got n=2 c=0"),
                       kiln::ShapeError);
  CHECK_THROWS_AS(batchnorm2d_nhwc_eval_forward<float>(2, 2, 4, p, q, q, 1e-5, nullptr, q, p),
                  kiln::ValueError);
  CHECK_THROWS_WITH_AS(batchnorm2d_nhwc_backward<float>(-1, 2, 4, p, p, q, q, q, p, q, q),
                       doctest::Contains("nhwc_backward: sizes must be positive, got n=-1"),
                       kiln::ShapeError);
  CHECK_THROWS_AS(batchnorm2d_nhwc_backward<float>(2, 2, 4, p, p, q, nullptr, q, p, q, q),
                  kiln::ValueError);
  CHECK_THROWS_WITH_AS(
      batchnorm2d_nhwc_eval_backward<float>(2, 2, -4, p, p, q, q, 1e-5, q, q, p, q, q),
      doctest::Contains("nhwc_eval_backward: sizes must be positive, got n=2 c=2 hw=-4"),
      kiln::ShapeError);
  CHECK_THROWS_AS(batchnorm2d_nhwc_eval_backward<float>(2, 2, 4, p, p, q, q, 1e-5, q, nullptr, p,
                                                        q, q),
                  kiln::ValueError);
}

// ---- pooling ---------------------------------------------------------------------------------

namespace {

std::string describe(const Pool2dShape& s) {
  return kiln::detail::concat("n=", s.n, " c=", s.c, " h=", s.h, " w=", s.w, " k=", s.kh, "x",
                              s.kw, " stride=", s.stride_h, ",", s.stride_w, " pad=", s.pad_h,
                              ",", s.pad_w);
}

std::vector<Pool2dShape> pool_grid() {
  const index_t hw[][2] = {{7, 5}, {9, 12}, {1, 1}, {4, 6}};
  const index_t ks[][2] = {{1, 1}, {2, 2}, {3, 3}, {2, 3}, {3, 1}, {5, 5}};
  const index_t strides[][2] = {{1, 1}, {2, 2}, {3, 3}, {1, 2}};
  std::vector<Pool2dShape> out;
  int i = 0;
  for (auto& d : hw)
    for (index_t c : {1, 3, 17})
      for (auto& k : ks)
        for (auto& st : strides)
          for (index_t p : {0, 1, 2}) {
            const Pool2dShape s{.n = i++ % 2 ? 3 : 1, .c = c, .h = d[0], .w = d[1], .kh = k[0],
                                .kw = k[1], .stride_h = st[0], .stride_w = st[1], .pad_h = p,
                                .pad_w = p};
            if (2 * p > k[0] || 2 * p > k[1] || s.out_h() <= 0 || s.out_w() <= 0) continue;
            out.push_back(s);
          }
  return out;
}

// Reals, or small integers (ties in most windows) with NaNs and -infs sprinkled in.
template <class T>
std::vector<T> pool_input(std::size_t size, std::mt19937_64& rng, bool integers) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::uniform_int_distribution<int> idist(0, 19);
  std::vector<T> v(size);
  for (auto& e : v) {
    if (!integers) {
      e = T(dist(rng));
      continue;
    }
    const int r = idist(rng);
    e = r == 0 ? std::numeric_limits<T>::quiet_NaN()
               : r == 1 ? -std::numeric_limits<T>::infinity() : T(r % 3);
  }
  return v;
}

template <class T>
void pool_case(const Pool2dShape& s, std::mt19937_64& rng, bool integers) {
  INFO(describe(s), " integers=", integers);
  namespace cpu = kiln::cpu;
  const index_t oh = s.out_h(), ow = s.out_w();
  const std::size_t xs = std::size_t(s.n * s.c * s.h * s.w), ys = std::size_t(s.n * s.c * oh * ow);
  const auto x = pool_input<T>(xs, rng, integers), dy = random_vec<T>(ys, rng);
  const auto xh = to_nhwc(x, s.n, s.c, s.h, s.w), dyh = to_nhwc(dy, s.n, s.c, oh, ow);
  auto y_back = [&](const auto& v) { return to_nchw(v, s.n, s.c, oh, ow); };
  auto x_back = [&](const auto& v) { return to_nchw(v, s.n, s.c, s.h, s.w); };
  const T nan = std::numeric_limits<T>::quiet_NaN();

  std::vector<T> y1(ys), y2(ys, nan), y3(ys, nan);
  std::vector<std::int64_t> a1(ys), a2(ys, -7);
  cpu::max_pool2d_forward(s, x.data(), y1.data(), a1.data());
  cpu::max_pool2d_nhwc_forward(s, xh.data(), y2.data(), a2.data());
  cpu::max_pool2d_nhwc_forward<T>(s, xh.data(), y3.data(), nullptr);
  check_identical("max y", y_back(y2), y1);
  check_identical("max y without argmax", y3, y2);
  const auto a2n = y_back(a2);
  const auto miss = std::mismatch(a2n.begin(), a2n.end(), a1.begin());
  CHECK_MESSAGE(miss.first == a2n.end(), "argmax differs at ", miss.first - a2n.begin());

  std::vector<T> dx1(xs), dx2(xs, nan);
  cpu::max_pool2d_backward(s, dy.data(), a1.data(), dx1.data());
  cpu::max_pool2d_nhwc_backward(s, dyh.data(), a2.data(), dx2.data());
  check_identical("max dx", x_back(dx2), dx1);
  // What the layers run: the maximum found again in x, no argmax kept.
  std::vector<T> dx3(xs, nan), dx4(xs, nan);
  cpu::max_pool2d_backward_from_input(s, x.data(), dy.data(), dx3.data());
  cpu::max_pool2d_nhwc_backward_from_input(s, xh.data(), dyh.data(), dx4.data());
  check_identical("max dx from the input", dx3, dx1);
  check_identical("max dx from the input, nhwc", x_back(dx4), dx1);

  for (bool incl : {true, false}) {
    INFO("count_include_pad=", incl);
    std::fill(y2.begin(), y2.end(), nan);
    cpu::avg_pool2d_forward(s, x.data(), y1.data(), incl);
    cpu::avg_pool2d_nhwc_forward(s, xh.data(), y2.data(), incl);
    check_identical("avg y", y_back(y2), y1);
    std::fill(dx2.begin(), dx2.end(), nan);
    cpu::avg_pool2d_backward(s, dy.data(), dx1.data(), incl);
    cpu::avg_pool2d_nhwc_backward(s, dyh.data(), dx2.data(), incl);
    check_identical("avg dx", x_back(dx2), dx1);
  }

  std::vector<T> g1(std::size_t(s.n * s.c)), g2(g1.size(), nan);
  cpu::global_avg_pool_forward(s.n, s.c, s.h, s.w, x.data(), g1.data());
  cpu::global_avg_pool_nhwc_forward(s.n, s.c, s.h, s.w, xh.data(), g2.data());
  check_identical("global avg y", g2, g1);  // [N, C] in both layouts
  const auto gdy = random_vec<T>(g1.size(), rng);
  std::fill(dx2.begin(), dx2.end(), nan);
  cpu::global_avg_pool_backward(s.n, s.c, s.h, s.w, gdy.data(), dx1.data());
  cpu::global_avg_pool_nhwc_backward(s.n, s.c, s.h, s.w, gdy.data(), dx2.data());
  check_identical("global avg dx", x_back(dx2), dx1);
}

}  // namespace

TEST_CASE_TEMPLATE("pool2d_nhwc equals pool2d bit for bit, argmax included", T, float, double) {
  std::mt19937_64 rng(std::is_same_v<T, float> ? 3 : 4);
  int count = 0;
  for (const auto& s : pool_grid())
    for (bool integers : {false, true}) {
      pool_case<T>(s, rng, integers);
      ++count;
    }
  MESSAGE("pool2d_nhwc cases: ", count);
  CHECK(count > 400);
}

TEST_CASE("max_pool2d_nhwc: ties pick the first element, NaN the first NaN, per channel") {
  // One 2x2 window over 3 channels: channel 0 all equal, channel 1 NaN at positions 1 and 3,
  // channel 2 the maximum at positions 2 and 3.
  const Pool2dShape s{.n = 1, .c = 3, .h = 2, .w = 2, .kh = 2, .kw = 2, .stride_h = 2,
                      .stride_w = 2};
  const float nan = NAN;
  const std::vector<float> x{5, 0, 1, 5, nan, 1, 5, 2, 4, 5, nan, 4};  // [h, w, c]
  std::vector<float> y(3);
  std::vector<std::int64_t> arg(3);
  kiln::cpu::max_pool2d_nhwc_forward(s, x.data(), y.data(), arg.data());
  CHECK(arg == std::vector<std::int64_t>{0, 1, 2});
  CHECK(y[0] == 5);
  CHECK(std::isnan(y[1]));
  CHECK(y[2] == 4);
}

TEST_CASE("pool2d_nhwc errors name the function and the values") {
  std::vector<float> buf(4096);
  std::vector<std::int64_t> arg(4096, 0);
  float* p = buf.data();
  Pool2dShape s{.n = 1, .c = 2, .h = 5, .w = 5, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                .pad_h = 2, .pad_w = 1};  // pad 2 > kernel 3 / 2
  using namespace kiln::cpu;
  CHECK_THROWS_WITH_AS(max_pool2d_nhwc_forward(s, p, p, arg.data()),
                       doctest::Contains("max_pool2d_nhwc_forward: pad must be at most half the "
                                         "kernel, got pad_h=2"),
                       kiln::ShapeError);
  CHECK_THROWS_WITH_AS(max_pool2d_nhwc_backward(s, p, arg.data(), p),
                       doctest::Contains("max_pool2d_nhwc_backward"), kiln::ShapeError);
  CHECK_THROWS_WITH_AS(avg_pool2d_nhwc_forward(s, p, p), doctest::Contains("pad_h=2"),
                       kiln::ShapeError);
  CHECK_THROWS_WITH_AS(avg_pool2d_nhwc_backward(s, p, p, false),
                       doctest::Contains("avg_pool2d_nhwc_backward"), kiln::ShapeError);
  CHECK_THROWS_WITH_AS(
      global_avg_pool_nhwc_forward(1, 2, 0, 5, p, p),
      doctest::Contains("global_avg_pool_nhwc_forward: sizes must be positive, got n=1 c=2 h=0"),
      kiln::ShapeError);
  CHECK_THROWS_WITH_AS(global_avg_pool_nhwc_backward(1, -2, 3, 5, p, p),
                       doctest::Contains("c=-2"), kiln::ShapeError);
  s.pad_h = 1;
  s.kh = 8;  // 5 + 2 < 8: empty output
  CHECK_THROWS_WITH_AS(max_pool2d_nhwc_forward(s, p, p, arg.data()),
                       doctest::Contains("empty output"), kiln::ShapeError);
  // An argmax outside the plane is refused, naming it.
  s.kh = 3;
  arg[5] = 25;
  CHECK_THROWS_WITH_AS(max_pool2d_nhwc_backward(s, p, arg.data(), p),
                       doctest::Contains("argmax 25 at output 5"), kiln::ValueError);
}
