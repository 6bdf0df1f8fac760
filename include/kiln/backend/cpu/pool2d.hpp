// kiln/backend/cpu/pool2d.hpp — 2-D max / average / global-average pooling on the CPU, NCHW.
//
//   x [N, C, H, W], y [N, C, OH, OW]; all dense, row-major. float or double.
//
//   kiln::cpu::Pool2dShape s{.n = 8, .c = 16, .h = 32, .w = 32, .kh = 3, .kw = 3,
//                            .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
//   std::vector<std::int64_t> argmax(y.size());
//   kiln::cpu::max_pool2d_forward(s, x, y, argmax.data());
//
// PyTorch semantics: floor mode (OH = (H + 2*pad_h - kh) / stride_h + 1), padding at most half
// the kernel. Max pool: padding counts as -inf; a NaN in the window makes the output NaN (argmax
// then points at the first NaN); ties pick the first maximum in row-major window order. argmax
// holds h*W + w within the image plane, as torch's indices. Avg pool divisor as torch: with
// count_include_pad, the window clipped to the padded input; without, the real elements only.
// Everything runs on the calling thread (pooling is memory-bound and cheap next to the convs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cpu {

struct Pool2dShape {
  index_t n = 0, c = 0, h = 0, w = 0, kh = 0, kw = 0;
  index_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;

  // Output extent; 0 when the kernel does not fit in the padded input (no negative division).
  index_t out_h() const { return out_extent(h, kh, stride_h, pad_h); }
  index_t out_w() const { return out_extent(w, kw, stride_w, pad_w); }

  // Throws ShapeError naming the offending values.
  void check(const char* fn = "kiln::cpu::pool2d") const {
    KILN_CHECK(n > 0 && c > 0 && h > 0 && w > 0, ShapeError, fn,
               ": sizes must be positive, got n=", n, " c=", c, " h=", h, " w=", w);
    KILN_CHECK(kh > 0 && kw > 0, ShapeError, fn, ": kernel must be positive, got kh=", kh,
               " kw=", kw);
    KILN_CHECK(stride_h > 0 && stride_w > 0, ShapeError, fn,
               ": stride must be positive, got stride_h=", stride_h, " stride_w=", stride_w);
    KILN_CHECK(pad_h >= 0 && pad_w >= 0, ShapeError, fn,
               ": pad must be non-negative, got pad_h=", pad_h, " pad_w=", pad_w);
    KILN_CHECK(2 * pad_h <= kh && 2 * pad_w <= kw, ShapeError, fn,
               ": pad must be at most half the kernel, got pad_h=", pad_h, " pad_w=", pad_w,
               " for kh=", kh, " kw=", kw);
    KILN_CHECK(out_h() > 0 && out_w() > 0, ShapeError, fn, ": empty output: input h=", h,
               " w=", w, " with pad_h=", pad_h, " pad_w=", pad_w, " is smaller than the kernel ",
               kh, "x", kw);
  }

 private:
  static index_t out_extent(index_t in, index_t k, index_t s, index_t p) {
    const index_t span = in + 2 * p - k;
    return span < 0 || s <= 0 ? 0 : span / s + 1;
  }
};

namespace detail {

template <class T>
inline constexpr bool pool2d_type_ok = std::is_same_v<T, float> || std::is_same_v<T, double>;

// One output position's window: [h0, h1) x [w0, w1) clipped to the real input, and torch's
// count_include_pad divisor (the window clipped to the padded input).
struct PoolWindow {
  index_t h0, h1, w0, w1, padded_count;
  index_t real_count() const { return (h1 - h0) * (w1 - w0); }
};

inline PoolWindow pool_window(const Pool2dShape& s, index_t oh, index_t ow) {
  const index_t h0 = oh * s.stride_h - s.pad_h, w0 = ow * s.stride_w - s.pad_w;
  const index_t h1 = std::min(h0 + s.kh, s.h + s.pad_h), w1 = std::min(w0 + s.kw, s.w + s.pad_w);
  return {std::max<index_t>(h0, 0), std::min(h1, s.h), std::max<index_t>(w0, 0),
          std::min(w1, s.w), (h1 - h0) * (w1 - w0)};
}

// Max pooling with a 2x2 window and stride 2, no padding: the same results as the general loop
// (row-major window order, the first maximum wins ties, the first NaN wins over everything).
// Outputs go in blocks of 64: the four window values are gathered into arrays first (stride-2
// loads), so the compare-and-select loop runs on contiguous lanes and vectorises; the window
// position is kept as an int32 until it is stored.
template <class T>
void max_pool2x2(const Pool2dShape& s, const T* x, T* y, std::int64_t* argmax) {
  constexpr index_t B = 64;  // not 16: GCC 12 unrolls 16 iterations fully, then leaves them scalar
  const index_t oh_n = s.out_h(), ow_n = s.out_w(), hw = s.h * s.w, ohw = oh_n * ow_n, w = s.w;
  for (index_t p = 0; p < s.n * s.c; ++p) {
    const T* xp = x + p * hw;
    for (index_t oh = 0; oh < oh_n; ++oh) {
      const T* r0 = xp + 2 * oh * w;
      const T* r1 = r0 + w;
      const index_t o = p * ohw + oh * ow_n;
      for (index_t ow0 = 0; ow0 < ow_n; ow0 += B) {
        const index_t nb = std::min(B, ow_n - ow0);
        T v[4][B] = {};
        for (index_t j = 0; j < nb; ++j) {
          const index_t c = 2 * (ow0 + j);
          v[0][j] = r0[c];
          v[1][j] = r0[c + 1];
          v[2][j] = r1[c];
          v[3][j] = r1[c + 1];
        }
        T best[B];
        std::int32_t at[B];
        for (index_t j = 0; j < B; ++j) {
          best[j] = v[0][j];
          at[j] = 0;
        }
        for (int k = 1; k < 4; ++k)
          for (index_t j = 0; j < B; ++j) {
            // Taken when larger, or a NaN while the best so far is not one (bitwise & and |: no
            // branches).
            const bool take = (v[k][j] > best[j]) | ((v[k][j] != v[k][j]) & (best[j] == best[j]));
            best[j] = take ? v[k][j] : best[j];
            at[j] = take ? k : at[j];
          }
        for (index_t j = 0; j < nb; ++j) y[o + ow0 + j] = best[j];
        if (argmax)
          for (index_t j = 0; j < nb; ++j)
            argmax[o + ow0 + j] = (2 * oh + at[j] / 2) * w + 2 * (ow0 + j) + at[j] % 2;
      }
    }
  }
}

// The maximum of one window of the plane xp and where it is (h*W + w): row-major order, the first
// maximum wins ties, the first NaN wins over everything. pad <= kernel/2 leaves at least one
// real element in every window.
template <class T>
struct WindowMax {
  T value;
  index_t at;
};
template <class T>
WindowMax<T> window_max(const Pool2dShape& s, const T* xp, const PoolWindow& win) {
  WindowMax<T> m{-std::numeric_limits<T>::infinity(), win.h0 * s.w + win.w0};
  for (index_t ih = win.h0; ih < win.h1; ++ih)
    for (index_t iw = win.w0; iw < win.w1; ++iw) {
      const T v = xp[ih * s.w + iw];
      if (v > m.value || std::isnan(v)) {  // strict >: the first maximum wins ties
        m = {v, ih * s.w + iw};
        if (std::isnan(v)) return m;
      }
    }
  return m;
}

}  // namespace detail

// y = max over each window. argmax may be nullptr; else it gets y's shape (int64, h*W + w).
template <class T>
void max_pool2d_forward(const Pool2dShape& s, const T* x, T* y, std::int64_t* argmax) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::max_pool2d_forward");
  const index_t oh_n = s.out_h(), ow_n = s.out_w(), hw = s.h * s.w, ohw = oh_n * ow_n;
  if (s.kh == 2 && s.kw == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 && s.pad_w == 0) {
    detail::max_pool2x2(s, x, y, argmax);  // the common case, without the window arithmetic
    return;
  }
  for (index_t p = 0; p < s.n * s.c; ++p)
    for (index_t oh = 0; oh < oh_n; ++oh)
      for (index_t ow = 0; ow < ow_n; ++ow) {
        const auto [best, at] = detail::window_max(s, x + p * hw, detail::pool_window(s, oh, ow));
        const index_t o = p * ohw + oh * ow_n + ow;
        y[o] = best;
        if (argmax != nullptr) argmax[o] = at;
      }
}

// dx = 0, then dx[plane][argmax] += dy for every output (overlapping windows accumulate).
template <class T>
void max_pool2d_backward(const Pool2dShape& s, const T* dy, const std::int64_t* argmax, T* dx) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::max_pool2d_backward");
  const index_t hw = s.h * s.w, ohw = s.out_h() * s.out_w();
  for (index_t i = 0; i < s.n * s.c * hw; ++i) dx[i] = T(0);
  for (index_t p = 0; p < s.n * s.c; ++p)
    for (index_t o = 0; o < ohw; ++o) {
      const std::int64_t at = argmax[p * ohw + o];
      KILN_CHECK(at >= 0 && at < hw, ValueError,
                 "kiln::cpu::max_pool2d_backward: argmax ", at, " at output ", p * ohw + o,
                 " is outside the ", s.h, "x", s.w, " plane");
      dx[p * hw + at] += dy[p * ohw + o];
    }
}

// The same dx, with each window's maximum found again in x instead of read from an argmax: what
// the layers run, so training keeps no int64 per output (the input is kept for backward anyway —
// PyTorch keeps both). Same element as the forward's argmax: ties, NaN and padding alike.
template <class T>
void max_pool2d_backward_from_input(const Pool2dShape& s, const T* x, const T* dy, T* dx) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::max_pool2d_backward_from_input");
  const index_t hw = s.h * s.w, oh_n = s.out_h(), ow_n = s.out_w();
  std::fill(dx, dx + s.n * s.c * hw, T(0));
  for (index_t p = 0; p < s.n * s.c; ++p)
    for (index_t oh = 0; oh < oh_n; ++oh)
      for (index_t ow = 0; ow < ow_n; ++ow)
        dx[p * hw + detail::window_max(s, x + p * hw, detail::pool_window(s, oh, ow)).at] +=
            dy[(p * oh_n + oh) * ow_n + ow];
}

// y = mean over each window; the divisor follows count_include_pad as torch.
template <class T>
void avg_pool2d_forward(const Pool2dShape& s, const T* x, T* y, bool count_include_pad = true) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::avg_pool2d_forward");
  const index_t oh_n = s.out_h(), ow_n = s.out_w(), hw = s.h * s.w, ohw = oh_n * ow_n;
  for (index_t p = 0; p < s.n * s.c; ++p) {
    const T* xp = x + p * hw;
    for (index_t oh = 0; oh < oh_n; ++oh)
      for (index_t ow = 0; ow < ow_n; ++ow) {
        const detail::PoolWindow win = detail::pool_window(s, oh, ow);
        T acc = T(0);
        for (index_t ih = win.h0; ih < win.h1; ++ih)
          for (index_t iw = win.w0; iw < win.w1; ++iw) acc += xp[ih * s.w + iw];
        const index_t div = count_include_pad ? win.padded_count : win.real_count();
        y[p * ohw + oh * ow_n + ow] = acc / T(div);
      }
  }
}

// dx = adjoint of avg_pool2d_forward applied to dy; dx is overwritten.
template <class T>
void avg_pool2d_backward(const Pool2dShape& s, const T* dy, T* dx, bool count_include_pad = true) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::avg_pool2d_backward");
  const index_t oh_n = s.out_h(), ow_n = s.out_w(), hw = s.h * s.w, ohw = oh_n * ow_n;
  for (index_t i = 0; i < s.n * s.c * hw; ++i) dx[i] = T(0);
  for (index_t p = 0; p < s.n * s.c; ++p) {
    T* dxp = dx + p * hw;
    for (index_t oh = 0; oh < oh_n; ++oh)
      for (index_t ow = 0; ow < ow_n; ++ow) {
        const detail::PoolWindow win = detail::pool_window(s, oh, ow);
        const index_t div = count_include_pad ? win.padded_count : win.real_count();
        const T g = dy[p * ohw + oh * ow_n + ow] / T(div);
        for (index_t ih = win.h0; ih < win.h1; ++ih)
          for (index_t iw = win.w0; iw < win.w1; ++iw) dxp[ih * s.w + iw] += g;
      }
  }
}

// y [N, C] = mean of each H x W plane (summed in double).
template <class T>
void global_avg_pool_forward(index_t n, index_t c, index_t h, index_t w, const T* x, T* y) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  Pool2dShape{.n = n, .c = c, .h = h, .w = w, .kh = 1, .kw = 1}.check(
      "kiln::cpu::global_avg_pool_forward");
  const index_t hw = h * w;
  for (index_t p = 0; p < n * c; ++p) {
    double acc = 0;
    for (index_t i = 0; i < hw; ++i) acc += double(x[p * hw + i]);
    y[p] = T(acc / double(hw));
  }
}

// dx [N, C, H, W] = dy[n, c] / (H*W) everywhere in the plane; dx is overwritten.
template <class T>
void global_avg_pool_backward(index_t n, index_t c, index_t h, index_t w, const T* dy, T* dx) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  Pool2dShape{.n = n, .c = c, .h = h, .w = w, .kh = 1, .kw = 1}.check(
      "kiln::cpu::global_avg_pool_backward");
  const index_t hw = h * w;
  for (index_t p = 0; p < n * c; ++p) {
    const T g = dy[p] / T(hw);
    for (index_t i = 0; i < hw; ++i) dx[p * hw + i] = g;
  }
}

}  // namespace kiln::cpu
