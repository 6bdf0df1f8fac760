// kiln/backend/cpu/pool2d_nhwc.hpp — 2-D max / average / global-average pooling, channels-last.
//
//   x [N, H, W, C], y [N, OH, OW, C] (argmax too); Pool2dShape, float or double. Same semantics
//   and errors as pool2d.hpp: argmax holds h*W + w within the (n, c) plane, the first maximum
//   wins ties, the first NaN wins over everything, torch's avg divisors.
//
// Each output pixel runs its window in the NCHW kernel's row-major order with the C channels as
// the vector lanes, so every value, argmax and sum comes out exactly as pool2d.hpp's.
// Runs on the calling thread (memory-bound and cheap next to the convs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln/backend/cpu/pool2d.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::cpu {

namespace detail {

// f(n, o, window) for every output pixel, o = (n*OH + oh)*OW + ow its row of y.
template <class F>
void pool2d_nhwc_pixels(const Pool2dShape& s, const F& f) {
  const index_t oh_n = s.out_h(), ow_n = s.out_w();
  for (index_t n = 0; n < s.n; ++n)
    for (index_t oh = 0; oh < oh_n; ++oh)
      for (index_t ow = 0; ow < ow_n; ++ow)
        f(n, (n * oh_n + oh) * ow_n + ow, pool_window(s, oh, ow));
}

// One output pixel's window maximum per channel into best[0, C) and, unless at is nullptr, its
// position h*W + w into at[0, C), in the NCHW kernel's window order. x may be stored narrower
// than T (bf16: widened exactly as it is read).
template <class T, bool WithArgmax, class X = T>
void window_max_nhwc(const Pool2dShape& s, const X* x, index_t n, const PoolWindow& win, T* best,
                     std::int64_t* at) {
  const index_t c = s.c;  // a local: the int64 argmax stores could alias s.c, which would
                          // keep the channel loop from vectorising
  // pad <= kernel/2 leaves at least one real element in every window.
  std::fill(best, best + c, -std::numeric_limits<T>::infinity());
  if constexpr (WithArgmax) std::fill(at, at + c, std::int64_t(win.h0 * s.w + win.w0));
  for (index_t ih = win.h0; ih < win.h1; ++ih)
    for (index_t iw = win.w0; iw < win.w1; ++iw) {
      const X* v = x + ((n * s.h + ih) * s.w + iw) * c;
      const std::int64_t pos = ih * s.w + iw;
      for (index_t ch = 0; ch < c; ++ch) {
        // Strictly larger (ties keep the first), or a NaN while the best is not one (the
        // first NaN then stays). Bitwise & and |: no branches, so the channels vectorise.
        const T vc = static_cast<T>(v[ch]);
        const bool take = (vc > best[ch]) | ((vc != vc) & (best[ch] == best[ch]));
        best[ch] = take ? vc : best[ch];
        if constexpr (WithArgmax) at[ch] = take ? pos : at[ch];
      }
    }
}

template <class T, bool WithArgmax>
void max_pool2d_nhwc(const Pool2dShape& s, const T* x, T* y, std::int64_t* argmax) {
  pool2d_nhwc_pixels(s, [&](index_t n, index_t o, const PoolWindow& win) {
    window_max_nhwc<T, WithArgmax>(s, x, n, win, y + o * s.c, WithArgmax ? argmax + o * s.c : nullptr);
  });
}

}  // namespace detail

// y = max over each window. argmax may be nullptr; else it gets y's shape (int64, h*W + w).
template <class T>
void max_pool2d_nhwc_forward(const Pool2dShape& s, const T* x, T* y, std::int64_t* argmax) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::max_pool2d_nhwc_forward");
  if (argmax) detail::max_pool2d_nhwc<T, true>(s, x, y, argmax);
  else detail::max_pool2d_nhwc<T, false>(s, x, y, nullptr);
}

// bf16 in and out: each maximum is one of the inputs, so rounding it back is exact — the bits of
// widening x, pooling in float and rounding y (as the layers did), without those two passes.
inline void max_pool2d_nhwc_forward(const Pool2dShape& s, const bf16* x, bf16* y) {
  s.check("kiln::cpu::max_pool2d_nhwc_forward");
  std::vector<float> best(static_cast<std::size_t>(s.c));
  detail::pool2d_nhwc_pixels(s, [&](index_t n, index_t o, const detail::PoolWindow& win) {
    detail::window_max_nhwc<float, false>(s, x, n, win, best.data(), nullptr);
    bf16* yo = y + o * s.c;
    for (index_t ch = 0; ch < s.c; ++ch) yo[ch] = bf16(best[std::size_t(ch)]);
  });
}

// dx = 0, then dx[n, argmax, c] += dy for every output (overlapping windows accumulate, in the
// NCHW kernel's order).
template <class T>
void max_pool2d_nhwc_backward(const Pool2dShape& s, const T* dy, const std::int64_t* argmax,
                              T* dx) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::max_pool2d_nhwc_backward");
  const index_t hw = s.h * s.w, ohw = s.out_h() * s.out_w(), c = s.c;
  std::fill(dx, dx + s.n * hw * c, T(0));
  for (index_t n = 0; n < s.n; ++n)
    for (index_t o = 0; o < ohw; ++o) {
      const index_t row = (n * ohw + o) * c;
      for (index_t ch = 0; ch < c; ++ch) {
        const std::int64_t at = argmax[row + ch];
        KILN_CHECK(at >= 0 && at < hw, ValueError, "kiln::cpu::max_pool2d_nhwc_backward: argmax ",
                   at, " at output ", row + ch, " is outside the ", s.h, "x", s.w, " plane");
        dx[(n * hw + at) * c + ch] += dy[row + ch];
      }
    }
}

// The same dx, with each window's maximum found again in x instead of read from an argmax
// (pool2d.hpp's max_pool2d_backward_from_input: what the layers run; no int64 per output kept).
// x and dy may be bf16 (read widened: no float copies of them), dx is T.
template <class T, class X = T, class G = T>
void max_pool2d_nhwc_backward_from_input(const Pool2dShape& s, const X* x, const G* dy, T* dx) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::max_pool2d_nhwc_backward_from_input");
  const index_t hw = s.h * s.w, c = s.c;
  std::fill(dx, dx + s.n * hw * c, T(0));
  std::vector<T> best(static_cast<std::size_t>(c));
  std::vector<std::int64_t> at(static_cast<std::size_t>(c));
  detail::pool2d_nhwc_pixels(s, [&](index_t n, index_t o, const detail::PoolWindow& win) {
    detail::window_max_nhwc<T, true>(s, x, n, win, best.data(), at.data());
    const G* g = dy + o * c;
    T* d = dx + n * hw * c;
    for (index_t ch = 0; ch < c; ++ch) d[at[std::size_t(ch)] * c + ch] += static_cast<T>(g[ch]);
  });
}

// y = mean over each window; the divisor follows count_include_pad as torch.
template <class T>
void avg_pool2d_nhwc_forward(const Pool2dShape& s, const T* x, T* y,
                             bool count_include_pad = true) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::avg_pool2d_nhwc_forward");
  const index_t c = s.c;
  detail::pool2d_nhwc_pixels(s, [&](index_t n, index_t o, const detail::PoolWindow& win) {
    T* acc = y + o * c;
    std::fill(acc, acc + c, T(0));
    for (index_t ih = win.h0; ih < win.h1; ++ih)
      for (index_t iw = win.w0; iw < win.w1; ++iw) {
        const T* v = x + ((n * s.h + ih) * s.w + iw) * c;
        for (index_t ch = 0; ch < c; ++ch) acc[ch] += v[ch];
      }
    const T div = T(count_include_pad ? win.padded_count : win.real_count());
    for (index_t ch = 0; ch < c; ++ch) acc[ch] /= div;
  });
}

// dx = adjoint of avg_pool2d_nhwc_forward applied to dy; dx is overwritten.
template <class T>
void avg_pool2d_nhwc_backward(const Pool2dShape& s, const T* dy, T* dx,
                              bool count_include_pad = true) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  s.check("kiln::cpu::avg_pool2d_nhwc_backward");
  const index_t c = s.c;
  std::fill(dx, dx + s.n * s.h * s.w * c, T(0));
  std::vector<T> g(static_cast<std::size_t>(c));
  detail::pool2d_nhwc_pixels(s, [&](index_t n, index_t o, const detail::PoolWindow& win) {
    const T div = T(count_include_pad ? win.padded_count : win.real_count());
    for (index_t ch = 0; ch < c; ++ch) g[std::size_t(ch)] = dy[o * c + ch] / div;
    for (index_t ih = win.h0; ih < win.h1; ++ih)
      for (index_t iw = win.w0; iw < win.w1; ++iw) {
        T* d = dx + ((n * s.h + ih) * s.w + iw) * c;
        for (index_t ch = 0; ch < c; ++ch) d[ch] += g[std::size_t(ch)];
      }
  });
}

// y [N, C] = mean of each image's H*W rows, per channel (summed in double, pixels in order).
template <class T>
void global_avg_pool_nhwc_forward(index_t n, index_t c, index_t h, index_t w, const T* x, T* y) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  Pool2dShape{.n = n, .c = c, .h = h, .w = w, .kh = 1, .kw = 1}.check(
      "kiln::cpu::global_avg_pool_nhwc_forward");
  const index_t hw = h * w;
  std::vector<double> acc(static_cast<std::size_t>(c));
  for (index_t i = 0; i < n; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (index_t p = 0; p < hw; ++p) {
      const T* v = x + (i * hw + p) * c;
      for (index_t ch = 0; ch < c; ++ch) acc[std::size_t(ch)] += double(v[ch]);
    }
    for (index_t ch = 0; ch < c; ++ch) y[i * c + ch] = T(acc[std::size_t(ch)] / double(hw));
  }
}

// dx [N, H, W, C] = dy[n, c] / (H*W) at every pixel; dx is overwritten.
template <class T>
void global_avg_pool_nhwc_backward(index_t n, index_t c, index_t h, index_t w, const T* dy,
                                   T* dx) {
  static_assert(detail::pool2d_type_ok<T>, "kiln::cpu pooling: T must be float or double");
  Pool2dShape{.n = n, .c = c, .h = h, .w = w, .kh = 1, .kw = 1}.check(
      "kiln::cpu::global_avg_pool_nhwc_backward");
  const index_t hw = h * w;
  for (index_t i = 0; i < n; ++i)
    for (index_t p = 0; p < hw; ++p)
      for (index_t ch = 0; ch < c; ++ch) dx[(i * hw + p) * c + ch] = dy[i * c + ch] / T(hw);
}

}  // namespace kiln::cpu
