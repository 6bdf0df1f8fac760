// kiln/backend/cpu/conv2d.hpp — 2-D convolution on the CPU, NCHW, as im2col + kiln's GEMM.
//
//   x [N, Cin, H, W], w [Cout, Cin, KH, KW], bias [Cout], y [N, Cout, OH, OW]; all dense,
//   row-major. float or double (double is there for gradchecks).
//
//   kiln::cpu::Conv2dShape s{.n = 8, .c_in = 3, .h = 32, .w = 32, .c_out = 16, .kh = 3, .kw = 3,
//                            .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
//   kiln::cpu::conv2d_forward(s, x, w, bias, y);
//
// Each image is one GEMM against its column matrix col [Cin*KH*KW, OH*OW], where
// col[(c*KH + i)*KW + j][oh*OW + ow] = x[c][oh*sh - ph + i*dh][ow*sw - pw + j*dw] (0 outside).
// A 1x1 stride-1 unpadded convolution has col == x_n, so it skips the copy.
//
// Scratch: this first slice allocates the column buffer as a std::vector per call (one image's
// worth, reused across the batch); moving it onto a reusable pool is left for later.
// im2col / col2im run on the calling thread; only the GEMMs use `threads`.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

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

// col = im2col(x_n); see the layout at the top of the file.
template <class T>
void im2col(const Conv2dShape& s, const T* x, T* col) {
  const index_t oh_n = s.out_h(), ow_n = s.out_w();
  for (index_t c = 0; c < s.c_in; ++c)
    for (index_t i = 0; i < s.kh; ++i)
      for (index_t j = 0; j < s.kw; ++j) {
        T* row = col + ((c * s.kh + i) * s.kw + j) * oh_n * ow_n;
        for (index_t oh = 0; oh < oh_n; ++oh) {
          const index_t ih = oh * s.stride_h - s.pad_h + i * s.dil_h;
          T* out = row + oh * ow_n;
          if (ih < 0 || ih >= s.h) {
            for (index_t ow = 0; ow < ow_n; ++ow) out[ow] = T(0);
            continue;
          }
          const T* in = x + (c * s.h + ih) * s.w;
          for (index_t ow = 0; ow < ow_n; ++ow) {
            const index_t iw = ow * s.stride_w - s.pad_w + j * s.dil_w;
            out[ow] = iw >= 0 && iw < s.w ? in[iw] : T(0);
          }
        }
      }
}

// dx_n += col2im(col): the adjoint of im2col; overlapping taps add up.
template <class T>
void col2im_add(const Conv2dShape& s, const T* col, T* dx) {
  const index_t oh_n = s.out_h(), ow_n = s.out_w();
  for (index_t c = 0; c < s.c_in; ++c)
    for (index_t i = 0; i < s.kh; ++i)
      for (index_t j = 0; j < s.kw; ++j) {
        const T* row = col + ((c * s.kh + i) * s.kw + j) * oh_n * ow_n;
        for (index_t oh = 0; oh < oh_n; ++oh) {
          const index_t ih = oh * s.stride_h - s.pad_h + i * s.dil_h;
          if (ih < 0 || ih >= s.h) continue;
          const T* in = row + oh * ow_n;
          T* out = dx + (c * s.h + ih) * s.w;
          for (index_t ow = 0; ow < ow_n; ++ow) {
            const index_t iw = ow * s.stride_w - s.pad_w + j * s.dil_w;
            if (iw >= 0 && iw < s.w) out[iw] += in[ow];
          }
        }
      }
}

// x_n is already the column matrix: no window, no stride, no padding.
inline bool conv2d_is_pointwise(const Conv2dShape& s) {
  return s.kh == 1 && s.kw == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 &&
         s.pad_w == 0;
}

}  // namespace detail

// y = conv(x, w) + bias. bias may be nullptr. y is overwritten (never read).
// threads: as for gemm (0 = omp_get_max_threads()).
template <class T>
void conv2d_forward(const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y,
                    int threads = 0) {
  static_assert(detail::conv2d_type_ok<T>, "kiln::cpu::conv2d_forward: T must be float or double");
  s.check("kiln::cpu::conv2d_forward");
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows();
  const bool pointwise = detail::conv2d_is_pointwise(s);
  std::vector<T> col(pointwise ? 0 : std::size_t(k * ohw));
  for (index_t n = 0; n < s.n; ++n) {
    const T* xn = x + n * s.c_in * s.h * s.w;
    T* yn = y + n * s.c_out * ohw;
    const T* b = xn;
    if (!pointwise) {
      detail::im2col(s, xn, col.data());
      b = col.data();
    }
    gemm<T>(trans::no, trans::no, s.c_out, ohw, k, T(1), w, k, b, ohw, T(0), yn, ohw, threads);
    if (bias != nullptr)
      for (index_t co = 0; co < s.c_out; ++co)
        for (index_t p = 0; p < ohw; ++p) yn[co * ohw + p] += bias[co];
  }
}

// dx = d(sum y * dy)/dx for y = conv2d_forward(x, w): dcol = W^T dy_n, then col2im.
// dx is overwritten.
template <class T>
void conv2d_backward_data(const Conv2dShape& s, const T* dy, const T* w, T* dx, int threads = 0) {
  static_assert(detail::conv2d_type_ok<T>,
                "kiln::cpu::conv2d_backward_data: T must be float or double");
  s.check("kiln::cpu::conv2d_backward_data");
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows(), hw = s.h * s.w;
  const bool pointwise = detail::conv2d_is_pointwise(s);
  std::vector<T> dcol(pointwise ? 0 : std::size_t(k * ohw));
  for (index_t n = 0; n < s.n; ++n) {
    const T* dyn = dy + n * s.c_out * ohw;
    T* dxn = dx + n * s.c_in * hw;
    if (pointwise) {  // dcol is dx_n itself; beta = 0 overwrites it
      gemm<T>(trans::yes, trans::no, k, ohw, s.c_out, T(1), w, k, dyn, ohw, T(0), dxn, ohw,
              threads);
      continue;
    }
    gemm<T>(trans::yes, trans::no, k, ohw, s.c_out, T(1), w, k, dyn, ohw, T(0), dcol.data(), ohw,
            threads);
    for (index_t p = 0; p < s.c_in * hw; ++p) dxn[p] = T(0);
    detail::col2im_add(s, dcol.data(), dxn);
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
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows();
  const bool pointwise = detail::conv2d_is_pointwise(s);
  std::vector<T> col(pointwise ? 0 : std::size_t(k * ohw));
  for (index_t n = 0; n < s.n; ++n) {
    const T* xn = x + n * s.c_in * s.h * s.w;
    const T* dyn = dy + n * s.c_out * ohw;
    const T* b = xn;
    if (!pointwise) {
      detail::im2col(s, xn, col.data());
      b = col.data();
    }
    // beta = 0 on the first image: dw need not be initialised by the caller.
    gemm<T>(trans::no, trans::yes, s.c_out, k, ohw, T(1), dyn, ohw, b, ohw, n == 0 ? T(0) : T(1),
            dw, k, threads);
  }
  if (dbias == nullptr) return;
  for (index_t co = 0; co < s.c_out; ++co) {
    // Summed in double: the reduction is N*OH*OW long, and this pass is cheap next to the GEMM.
    double acc = 0;
    for (index_t n = 0; n < s.n; ++n) {
      const T* p = dy + (n * s.c_out + co) * ohw;
      for (index_t q = 0; q < ohw; ++q) acc += double(p[q]);
    }
    dbias[co] = T(acc);
  }
}

}  // namespace kiln::cpu
