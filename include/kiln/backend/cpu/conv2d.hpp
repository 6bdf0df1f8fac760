// kiln/backend/cpu/conv2d.hpp — 2-D convolution on the CPU, NCHW, as im2col + kiln's GEMM.
//
//   x [N, Cin, H, W], w [Cout, Cin, KH, KW], bias [Cout], y [N, Cout, OH, OW]; all dense,
//   row-major. float or double (double is there for gradchecks).
//
//   kiln::cpu::Conv2dShape s{.n = 8, .c_in = 3, .h = 32, .w = 32, .c_out = 16, .kh = 3, .kw = 3,
//                            .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
//   kiln::cpu::conv2d_forward(s, x, w, bias, y);
//
// Images are taken in chunks (as many as keep the column matrix under ~4 MiB); a chunk is ONE
// GEMM against its column matrix col [Cin*KH*KW, images*OH*OW], where
// col[(c*KH + i)*KW + j][img*OH*OW + oh*OW + ow] = x[img][c][oh*sh - ph + i*dh][ow*sw - pw + j*dw]
// (0 outside), so a small image still gives a wide GEMM. The GEMM writes [Cout, images*OH*OW];
// an epilogue pass scatters it to NCHW (adding the bias, or whatever the caller fuses there).
//
// Threads: the GEMMs use `threads`; im2col, col2im and the scatter split over images or rows.
// The chunking depends on the shape only, and kiln's GEMM gives the same bits at every thread
// count, so the results do too. Scratch is reused per thread across calls (conv2d_scratch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cpu {

struct Conv2dShape {
  index_t n = 0, c_in = 0, h = 0, w = 0, c_out = 0, kh = 0, kw = 0;
  index_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  index_t dil_h = 1, dil_w = 1;

  // Output extent; 0 when the dilated kernel does not fit in the padded input. Computed without
  // dividing a negative number (C++ truncates toward zero, which would give 1 instead of 0).
  index_t out_h() const { return out_extent(h, kh, stride_h, pad_h, dil_h); }
  index_t out_w() const { return out_extent(w, kw, stride_w, pad_w, dil_w); }

  // Rows of the column matrix (the GEMM's reduction length in forward).
  index_t col_rows() const { return c_in * kh * kw; }

  // Throws ShapeError naming the offending values.
  void check(const char* fn = "kiln::cpu::conv2d") const {
    KILN_CHECK(n > 0 && c_in > 0 && h > 0 && w > 0 && c_out > 0, ShapeError, fn,
               ": sizes must be positive, got n=", n, " c_in=", c_in, " h=", h, " w=", w,
               " c_out=", c_out);
    KILN_CHECK(kh > 0 && kw > 0, ShapeError, fn, ": kernel must be positive, got kh=", kh,
               " kw=", kw);
    KILN_CHECK(stride_h > 0 && stride_w > 0, ShapeError, fn,
               ": stride must be positive, got stride_h=", stride_h, " stride_w=", stride_w);
    KILN_CHECK(dil_h > 0 && dil_w > 0, ShapeError, fn,
               ": dilation must be positive, got dil_h=", dil_h, " dil_w=", dil_w);
    KILN_CHECK(pad_h >= 0 && pad_w >= 0, ShapeError, fn,
               ": pad must be non-negative, got pad_h=", pad_h, " pad_w=", pad_w);
    KILN_CHECK(out_h() > 0 && out_w() > 0, ShapeError, fn,
               ": empty output: input h=", h, " w=", w, " with pad_h=", pad_h, " pad_w=", pad_w,
               " is smaller than the dilated kernel ", dil_h * (kh - 1) + 1, "x",
               dil_w * (kw - 1) + 1, " (kh=", kh, " kw=", kw, " dil_h=", dil_h, " dil_w=", dil_w,
               ")");
  }

 private:
  static index_t out_extent(index_t in, index_t k, index_t s, index_t p, index_t d) {
    const index_t span = in + 2 * p - (d * (k - 1) + 1);
    return span < 0 || s <= 0 ? 0 : span / s + 1;
  }
};

namespace detail {

template <class T>
inline constexpr bool conv2d_type_ok = std::is_same_v<T, float> || std::is_same_v<T, double>;

// The first ow in [0, ow_n) whose input column ow*stride - pad + tap is >= 0, and the end of the
// run that stays < w: taps outside [lo, hi) read padding.
struct TapRange {
  index_t lo, hi;
};
inline TapRange tap_range(index_t ow_n, index_t stride, index_t pad, index_t tap, index_t w) {
  const index_t first = pad - tap;  // ow*stride >= first
  index_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const index_t last = w - 1 + pad - tap;  // ow*stride <= last
  index_t hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, ow_n);
  hi = std::clamp(hi, lo, ow_n);
  return {lo, hi};
}

// Columns of image x_n into col, whose rows are ld apart:
// col[(c*KH + i)*KW + j][oh*OW + ow] = x_n[c][oh*sh - ph + i*dh][ow*sw - pw + j*dw] (0 outside).
// Its rows are short (a few dozen values), so plain loops beat memcpy / memset calls; GCC would
// turn them back into such calls, hence the attribute.
#if defined(__GNUC__) && !defined(__clang__)
#define KILN_CONV_INLINE_COPIES __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define KILN_CONV_INLINE_COPIES
#endif
template <class T>
KILN_CONV_INLINE_COPIES void im2col(const Conv2dShape& s, const T* x, T* col, index_t ld) {
  const index_t oh_n = s.out_h(), ow_n = s.out_w();
  for (index_t c = 0; c < s.c_in; ++c)
    for (index_t i = 0; i < s.kh; ++i)
      for (index_t j = 0; j < s.kw; ++j) {
        T* row = col + ((c * s.kh + i) * s.kw + j) * ld;
        const TapRange r = tap_range(ow_n, s.stride_w, s.pad_w, j * s.dil_w, s.w);
        for (index_t oh = 0; oh < oh_n; ++oh) {
          const index_t ih = oh * s.stride_h - s.pad_h + i * s.dil_h;
          T* out = row + oh * ow_n;
          if (ih < 0 || ih >= s.h) {
            for (index_t ow = 0; ow < ow_n; ++ow) out[ow] = T(0);
            continue;
          }
          const T* in = x + (c * s.h + ih) * s.w - s.pad_w + j * s.dil_w;
          for (index_t ow = 0; ow < r.lo; ++ow) out[ow] = T(0);
          if (s.stride_w == 1) {
            for (index_t ow = r.lo; ow < r.hi; ++ow) out[ow] = in[ow];
          } else {
            for (index_t ow = r.lo; ow < r.hi; ++ow) out[ow] = in[ow * s.stride_w];
          }
          for (index_t ow = r.hi; ow < ow_n; ++ow) out[ow] = T(0);
        }
      }
}

// dx_n += col2im(col): the adjoint of im2col; overlapping taps add up.
template <class T>
void col2im_add(const Conv2dShape& s, const T* col, index_t ld, T* dx) {
  const index_t oh_n = s.out_h(), ow_n = s.out_w();
  for (index_t c = 0; c < s.c_in; ++c)
    for (index_t i = 0; i < s.kh; ++i)
      for (index_t j = 0; j < s.kw; ++j) {
        const T* row = col + ((c * s.kh + i) * s.kw + j) * ld;
        const TapRange r = tap_range(ow_n, s.stride_w, s.pad_w, j * s.dil_w, s.w);
        for (index_t oh = 0; oh < oh_n; ++oh) {
          const index_t ih = oh * s.stride_h - s.pad_h + i * s.dil_h;
          if (ih < 0 || ih >= s.h) continue;
          const T* in = row + oh * ow_n;
          T* out = dx + (c * s.h + ih) * s.w - s.pad_w + j * s.dil_w;
          for (index_t ow = r.lo; ow < r.hi; ++ow) out[ow * s.stride_w] += in[ow];
        }
      }
}

// Images per chunk: a chunk's column matrix [Cin*KH*KW, images*OH*OW] stays under about
// 4 MiB, so the GEMM gets a long dimension of many images' outputs (small images give tiny
// per-image GEMMs) without the scratch growing with the batch, and the columns are still in cache
// when the GEMM packs them (4 MiB measured 15-35% faster than 16 MiB at ResNet shapes, both
// layouts, one thread). The chunking depends only on the shape, never on the thread count, so
// results are the same at every thread count.
template <class T>
index_t conv2d_chunk(const Conv2dShape& s) {
  const index_t per_image = std::max<index_t>(1, s.col_rows() * s.out_h() * s.out_w());
  return std::clamp<index_t>(index_t((std::size_t(4) << 20) / sizeof(T)) / per_image, 1, s.n);
}

// Scratch reused across calls on this thread (col, and the output or gradient in [C, images*OH*OW]
// order): a convolution runs every step, and fresh multi-MiB buffers would fault in new pages
// each time. Grows to the largest chunk seen; never shrinks.
template <class T, int Slot>
T* conv2d_scratch(std::size_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

inline int conv2d_threads(int threads) {
#if defined(_OPENMP)
  return threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
  return 1;
#endif
}

// f(i) for i in [0, n), split across threads (each i independent).
template <class F>
void conv2d_parallel(index_t n, int threads, const F& f) {
#if defined(_OPENMP)
  if (threads > 1 && n > 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (index_t i = 0; i < n; ++i) f(i);
    return;
  }
#endif
  (void)threads;
  for (index_t i = 0; i < n; ++i) f(i);
}

// The chunk's columns: col [Cin*KH*KW, cn*OH*OW] for images n0 .. n0+cn.
template <class T>
void im2col_chunk(const Conv2dShape& s, const T* x, index_t n0, index_t cn, T* col, int threads) {
  const index_t ohw = s.out_h() * s.out_w(), ld = cn * ohw;
  conv2d_parallel(cn, threads, [&](index_t i) { im2col(s, x + (n0 + i) * s.c_in * s.h * s.w, col + i * ohw, ld); });
}

// dyt [Cout, cn*OH*OW] = the chunk's images of dy [N, Cout, OH*OW], channel-major.
template <class T>
void gather_channels(const Conv2dShape& s, const T* dy, index_t n0, index_t cn, T* dyt, int threads) {
  const index_t ohw = s.out_h() * s.out_w();
  conv2d_parallel(cn * s.c_out, threads, [&](index_t r) {
    const index_t i = r / s.c_out, co = r % s.c_out;
    const T* src = dy + ((n0 + i) * s.c_out + co) * ohw;
    std::copy(src, src + ohw, dyt + co * cn * ohw + i * ohw);
  });
}

}  // namespace detail

// y = epilogue(conv(x, w)): the chunk's GEMM result z [Cout, images*OH*OW] is handed to
// epi(n, co, z_row, y_row, OH*OW), which writes image n's channel co of y (and whatever else it
// keeps, such as a pre-activation for backward) while the row is in cache.
template <class T, class Epilogue>
void conv2d_forward_epilogue(const Conv2dShape& s, const T* x, const T* w, T* y, int threads,
                             const Epilogue& epi) {
  static_assert(detail::conv2d_type_ok<T>, "kiln::cpu::conv2d_forward: T must be float or double");
  s.check("kiln::cpu::conv2d_forward");
  threads = detail::conv2d_threads(threads);
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows(), chunk = detail::conv2d_chunk<T>(s);
  T* col = detail::conv2d_scratch<T, 0>(std::size_t(k * chunk * ohw));
  T* z = detail::conv2d_scratch<T, 1>(std::size_t(s.c_out * chunk * ohw));
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), ld = cn * ohw;
    detail::im2col_chunk(s, x, n0, cn, col, threads);
    gemm<T>(trans::no, trans::no, s.c_out, ld, k, T(1), w, k, col, ld, T(0), z, ld, threads);
    detail::conv2d_parallel(cn * s.c_out, threads, [&](index_t r) {
      const index_t i = r / s.c_out, co = r % s.c_out;
      epi(n0 + i, co, z + co * ld + i * ohw, y + ((n0 + i) * s.c_out + co) * ohw, ohw);
    });
  }
}

// y = conv(x, w) + bias. bias may be nullptr. y is overwritten (never read).
// threads: as for gemm (0 = omp_get_max_threads()).
template <class T>
void conv2d_forward(const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y,
                    int threads = 0) {
  conv2d_forward_epilogue(s, x, w, y, threads, [bias](index_t, index_t co, const T* z, T* yr, index_t len) {
    const T b = bias ? bias[co] : T(0);
    for (index_t p = 0; p < len; ++p) yr[p] = z[p] + b;
  });
}

// dx = d(sum y * dy)/dx for y = conv2d_forward(x, w): dcol = W^T dy, then col2im.
// dx is overwritten, or added to with accumulate.
template <class T>
void conv2d_backward_data(const Conv2dShape& s, const T* dy, const T* w, T* dx, int threads = 0,
                          bool accumulate = false) {
  static_assert(detail::conv2d_type_ok<T>,
                "kiln::cpu::conv2d_backward_data: T must be float or double");
  s.check("kiln::cpu::conv2d_backward_data");
  threads = detail::conv2d_threads(threads);
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows(), hw = s.h * s.w;
  const index_t chunk = detail::conv2d_chunk<T>(s);
  T* dcol = detail::conv2d_scratch<T, 0>(std::size_t(k * chunk * ohw));
  T* dyt = detail::conv2d_scratch<T, 1>(std::size_t(s.c_out * chunk * ohw));
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), ld = cn * ohw;
    detail::gather_channels(s, dy, n0, cn, dyt, threads);
    gemm<T>(trans::yes, trans::no, k, ld, s.c_out, T(1), w, k, dyt, ld, T(0), dcol, ld, threads);
    detail::conv2d_parallel(cn, threads, [&](index_t i) {
      T* dxn = dx + (n0 + i) * s.c_in * hw;
      if (!accumulate) std::fill(dxn, dxn + s.c_in * hw, T(0));
      detail::col2im_add(s, dcol + i * ohw, ld, dxn);
    });
  }
}

// dw = sum_n dy_n col_n^T; dbias = sum of dy over n, oh, ow (skipped when dbias is nullptr).
// dw and dbias are overwritten.
template <class T>
void conv2d_backward_filter(const Conv2dShape& s, const T* x, const T* dy, T* dw, T* dbias,
                            int threads = 0) {
  static_assert(detail::conv2d_type_ok<T>,
                "kiln::cpu::conv2d_backward_filter: T must be float or double");
  s.check("kiln::cpu::conv2d_backward_filter");
  threads = detail::conv2d_threads(threads);
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows(), chunk = detail::conv2d_chunk<T>(s);
  T* col = detail::conv2d_scratch<T, 0>(std::size_t(k * chunk * ohw));
  T* dyt = detail::conv2d_scratch<T, 1>(std::size_t(s.c_out * chunk * ohw));
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), ld = cn * ohw;
    detail::im2col_chunk(s, x, n0, cn, col, threads);
    detail::gather_channels(s, dy, n0, cn, dyt, threads);
    // beta = 0 on the first chunk: dw need not be initialised by the caller.
    gemm<T>(trans::no, trans::yes, s.c_out, k, ld, T(1), dyt, ld, col, ld, n0 == 0 ? T(0) : T(1), dw, k,
            threads);
  }
  if (dbias == nullptr) return;
  detail::conv2d_parallel(s.c_out, threads, [&](index_t co) {
    // Summed in double: the reduction is N*OH*OW long, and this pass is cheap next to the GEMM.
    double acc = 0;
    for (index_t n = 0; n < s.n; ++n) {
      const T* p = dy + (n * s.c_out + co) * ohw;
      for (index_t q = 0; q < ohw; ++q) acc += double(p[q]);
    }
    dbias[co] = T(acc);
  });
}

}  // namespace kiln::cpu
