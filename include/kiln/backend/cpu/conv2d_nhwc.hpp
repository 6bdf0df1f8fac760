// kiln/backend/cpu/conv2d_nhwc.hpp — 2-D convolution on the CPU, channels-last (NHWC).
//
//   x [N, H, W, Cin], w [Cout, Cin, KH, KW] (PyTorch's layout, as conv2d.hpp), bias [Cout],
//   y [N, OH, OW, Cout]; Conv2dShape, float or double, threads and errors as conv2d.hpp.
//
// A chunk of images is ONE GEMM against col [images*OH*OW, KH*KW*Cin] whose row for output pixel
// (img, oh, ow) is that pixel's patch in (i, j, c) order, so a tap copies Cin contiguous values
// (a whole KW*Cin run when dil_w == 1). With the weight permuted to wp [Cout, KH*KW*Cin],
// Y = col * wp^T comes out in NHWC already; backward data is dcol = dY * wp then a col2im
// gathered per input pixel, backward filter dwp += dY^T * col, permuted back. dy is used in
// place: no transpose.
// 1x1 stride-1 unpadded convolutions skip im2col: x's rows are the column matrix. The forward
// never writes the column matrix: kiln's GEMM packs each block of patches from x itself
// (detail::NhwcPatches); backward-filter still gathers it (it is that product's B operand).
// 3x3 stride-1 shapes with 16 channels or more go to Winograd (F(4x4, 3x3) or F(2x2, 3x3)) instead,
// all three passes (conv2d_winograd.hpp, conv2d_winograd_applies; conv_algorithm::gemm turns it off).
// Chunks depend on the shape only, so results are the same at any thread count.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/conv2d.hpp"
#include "kiln/backend/cpu/conv2d_winograd.hpp"

namespace kiln::cpu {

namespace detail {

// Scratch slots, distinct from conv2d.hpp's 0 and 1 so mixed-layout networks keep both warm.
inline constexpr int conv_nhwc_slot_w = 2, conv_nhwc_slot_col = 3, conv_nhwc_slot_z = 4;

// x's rows serve as the column matrix (K = Cin, one row per output pixel).
inline bool conv2d_nhwc_pointwise(const Conv2dShape& s) {
  return s.kh == 1 && s.kw == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 &&
         s.pad_w == 0;
}

// wp[co][(i*KW + j)*Cin + c] = w[co][c][i][j] (ToPatch), or the inverse. Split over output
// channels when the weight is large (layer4's 3x3: 2.4 M values, three times per step: serial,
// it left the second thread waiting), each written in its own order.
template <bool ToPatch, class T>
void conv2d_nhwc_permute(const Conv2dShape& s, const T* from, T* to, int threads = 1) {
  const index_t taps = s.kh * s.kw, cin = s.c_in;
  conv2d_parallel(s.c_out, s.c_out * cin * taps >= (index_t(1) << 16) ? threads : 1, [&](index_t co) {
    const T* src = from + co * cin * taps;
    T* dst = to + co * cin * taps;
    if constexpr (ToPatch) {
      for (index_t t = 0; t < taps; ++t)
        for (index_t c = 0; c < cin; ++c) dst[t * cin + c] = src[c * taps + t];
    } else {
      for (index_t c = 0; c < cin; ++c)
        for (index_t t = 0; t < taps; ++t) dst[c * taps + t] = src[t * cin + c];
    }
  });
}

// The weight in patch order [Cout, KH*KW*Cin]: w itself for a 1x1 kernel (the order is the same:
// permuting it was a copy of the whole weight, 2% of a ResNet-50 fine-tuning step, whose 1x1
// weights are most of its parameters), else permuted into the scratch slot Slot.
template <class T, int Slot>
const T* conv2d_nhwc_patch_weight(const Conv2dShape& s, const T* w, int threads) {
  if (s.kh * s.kw == 1) return w;
  T* wp = conv2d_scratch<T, Slot>(std::size_t(s.c_out * s.col_rows()));
  conv2d_nhwc_permute<true>(s, w, wp, threads);
  return wp;
}

// Visits the taps of output pixel (oh, ow) that land inside image x_n [H, W, Cin]:
// f(offset in the patch, offset in the image, count), each a contiguous run (a whole kernel row
// when dil_w == 1); pad(offset in the patch, count) for the runs that read padding. The callers'
// copy loops are inlined here; runs are short for a small Cin (3 values for an RGB input), so
// they stay loops rather than memcpy / memset calls, as in conv2d.hpp's im2col.
template <class F, class P>
KILN_CONV_INLINE_COPIES void conv2d_nhwc_taps(const Conv2dShape& s, index_t oh, index_t ow,
                                              const F& f, const P& pad) {
  const index_t ih0 = oh * s.stride_h - s.pad_h, iw0 = ow * s.stride_w - s.pad_w, cin = s.c_in;
  const index_t row = s.kw * cin;
  // tap_range with stride = dilation and pad = -origin: the kernel rows / columns inside the image.
  const TapRange ri = tap_range(s.kh, s.dil_h, -ih0, 0, s.h);
  const TapRange rj = tap_range(s.kw, s.dil_w, -iw0, 0, s.w);
  pad(0, ri.lo * row);
  for (index_t i = ri.lo; i < ri.hi; ++i) {
    const index_t p = i * row, x0 = ((ih0 + i * s.dil_h) * s.w + iw0) * cin;
    pad(p, rj.lo * cin);
    if (s.dil_w == 1) {
      f(p + rj.lo * cin, x0 + rj.lo * cin, (rj.hi - rj.lo) * cin);
    } else {
      for (index_t j = rj.lo; j < rj.hi; ++j) f(p + j * cin, x0 + j * s.dil_w * cin, cin);
    }
    pad(p + rj.hi * cin, (s.kw - rj.hi) * cin);
  }
  pad(ri.hi * row, (s.kh - ri.hi) * row);
}

// Values [p0, p1) of output pixel (oh, ow)'s patch in image x_n, padding as zeros, into
// out[0, p1 - p0): the part of a column-matrix row one k block needs (the whole row: 0, K).
template <class T>
KILN_CONV_INLINE_COPIES void nhwc_patch_values(const Conv2dShape& s, const T* x_n, index_t oh, index_t ow,
                                               index_t p0, index_t p1, T* out) {
  conv2d_nhwc_taps(
      s, oh, ow,
      [&](index_t p, index_t q, index_t len) {
        const index_t lo = std::max(p, p0), hi = std::min(p + len, p1);
        for (index_t e = lo; e < hi; ++e) out[e - p0] = x_n[q + (e - p)];
      },
      [&](index_t p, index_t len) {
        const index_t lo = std::max(p, p0), hi = std::min(p + len, p1);
        for (index_t e = lo; e < hi; ++e) out[e - p0] = T(0);
      });
}

// col rows for output row oh of image x_n: OW patches of K values. Whole patches: each run is
// copied whole, with memcpy once it is long (Cin of 16 and up: every ResNet layer but the stem).
template <class T>
void im2col_nhwc(const Conv2dShape& s, const T* x_n, index_t oh, T* col) {
  const index_t k = s.col_rows();
  for (index_t ow = 0; ow < s.out_w(); ++ow) {
    T* out = col + ow * k;
    conv2d_nhwc_taps(
        s, oh, ow,
        [&](index_t p, index_t q, index_t len) {
          if (len >= 16) std::memcpy(out + p, x_n + q, std::size_t(len) * sizeof(T));
          else for (index_t e = 0; e < len; ++e) out[p + e] = x_n[q + e];
        },
        [&](index_t p, index_t len) {
          if (len >= 16) std::memset(static_cast<void*>(out + p), 0, std::size_t(len) * sizeof(T));
          else for (index_t e = 0; e < len; ++e) out[p + e] = T(0);
        });
  }
}

// Row ih of an image's dx += col2im(dcol): the adjoint of im2col_nhwc, gathered per input pixel so
// that rows are independent (split across threads even when a chunk is one image, as layer1's
// 3x3 convolutions are). A pixel's contributions are added in the order of the output pixels
// that read it (oh, then ow, increasing: kernel rows and columns from the last one down), the
// order a scatter over the output pixels would add them in, so the bits do not depend on the
// split. fresh: the row is overwritten (starting from zero) instead of added to. dx_row: the
// row's W * Cin values.
template <class T>
void col2im_nhwc_row(const Conv2dShape& s, const T* dcol, index_t ih, T* dx_row, bool fresh) {
  const index_t k = s.col_rows(), oh_n = s.out_h(), ow_n = s.out_w(), cin = s.c_in;
  for (index_t iw = 0; iw < s.w; ++iw) {
    T* d = dx_row + iw * cin;
    if (fresh) std::fill(d, d + cin, T(0));
    for (index_t i = s.kh - 1; i >= 0; --i) {
      const index_t rh = ih + s.pad_h - i * s.dil_h;
      if (rh < 0 || rh % s.stride_h != 0 || rh / s.stride_h >= oh_n) continue;
      const index_t oh = rh / s.stride_h;
      for (index_t j = s.kw - 1; j >= 0; --j) {
        const index_t rw = iw + s.pad_w - j * s.dil_w;
        if (rw < 0 || rw % s.stride_w != 0 || rw / s.stride_w >= ow_n) continue;
        const T* src = dcol + (oh * ow_n + rw / s.stride_w) * k + (i * s.kw + j) * cin;
        for (index_t c = 0; c < cin; ++c) d[c] += src[c];
      }
    }
  }
}

// dbias = sum of dy [N*OH*OW, Cout] over its rows, in double: each channel sums every row in order
// (the order conv2d_backward_filter uses, so dbias matches it bit for bit). The channels are split
// into one contiguous block per thread, each reading its part of every row, rows in order: dy
// (often larger than the cache) is streamed once. Blocks of 32 channels, each a pass over all
// rows, read it once per block — the hardware fetches lines in pairs — and left the loads waiting
// on memory (a ResNet-9 bf16 step spent 3.7% of its time here). dy float, double or bf16.
template <class G, class T>
void conv2d_nhwc_bias_grad(const Conv2dShape& s, const G* dy, T* dbias, int threads) {
  const index_t rows = s.n * s.out_h() * s.out_w();
  const index_t parts = std::max<index_t>(1, std::min<index_t>(threads, s.c_out / 16));
  const index_t block = (s.c_out + parts - 1) / parts;
  conv2d_parallel(parts, threads, [&](index_t b) {
    const index_t c0 = b * block, cb = std::min(block, s.c_out - c0);
    std::vector<double> acc(static_cast<std::size_t>(cb), 0.0);
    double* a = acc.data();
    for (index_t r = 0; r < rows; ++r) {
      const G* p = dy + r * s.c_out + c0;
      for (index_t c = 0; c < cb; ++c) {
        if constexpr (std::is_same_v<G, bf16>) a[c] += double(float(p[c]));  // bf16 widens through float
        else a[c] += double(p[c]);
      }
    }
    for (index_t c = 0; c < cb; ++c) dbias[c0 + c] = T(a[c]);
  });
}

// The chunk's column matrix: x's rows themselves for a pointwise convolution, else im2col into
// scratch, split over (image, output row).
template <class T>
const T* conv2d_nhwc_columns(const Conv2dShape& s, const T* x, index_t n0, index_t cn,
                             int threads) {
  const index_t hwc = s.h * s.w * s.c_in;
  if (conv2d_nhwc_pointwise(s)) return x + n0 * hwc;
  const index_t oh_n = s.out_h(), k = s.col_rows(), ohw = oh_n * s.out_w();
  T* col = conv2d_scratch<T, conv_nhwc_slot_col>(std::size_t(conv2d_chunk<T>(s) * ohw * k));
  conv2d_parallel(cn * oh_n, threads, [&](index_t r) {
    const index_t i = r / oh_n, oh = r % oh_n;
    im2col_nhwc(s, x + (n0 + i) * hwc, oh, col + (i * ohw + oh * s.out_w()) * k);
  });
  return col;
}

// The column matrix of a chunk of images as a GEMM A source (gemm_with_a_source): each panel's
// rows are built in an L1-sized buffer straight from x — only the k block asked for — and packed
// from there, so the column matrix is never written to memory and read back (for a 3x3
// convolution it is 9x the input: ResNet-50's layer1 at batch 8, 58 MB per convolution).
template <class T>
struct NhwcPatches {
  const Conv2dShape* s;
  const T* x;  // the chunk's first image

  static void pack(const void* ctx, index_t r0, index_t rows, index_t p0, index_t kc, T* dst) {
    constexpr int mr = gemm_source_rows<T>;
    const NhwcPatches& src = *static_cast<const NhwcPatches*>(ctx);
    const Conv2dShape& s = *src.s;
    const index_t ow_n = s.out_w(), ohw = s.out_h() * ow_n, hwc = s.h * s.w * s.c_in;
    alignas(64) T rows_buf[mr * gemm_source_kc<T>];
    for (index_t panel = 0; panel * mr < rows; ++panel) {
      const index_t live = std::min<index_t>(mr, rows - panel * mr);
      for (index_t r = 0; r < live; ++r) {
        const index_t pixel = r0 + panel * mr + r, img = pixel / ohw, oh = pixel % ohw / ow_n, ow = pixel % ow_n;
        nhwc_patch_values(s, src.x + img * hwc, oh, ow, p0, p0 + kc, rows_buf + r * kc);
      }
      pack_panels<mr>(live, kc, rows_buf, kc, 1, dst + panel * mr * kc);
    }
  }
};

}  // namespace detail

// y = epilogue(conv(x, w)): for each output pixel row = n*OH*OW + oh*OW + ow, the chunk's GEMM
// values z [Cout] are handed to epi(row, z, y + row*Cout, Cout), which writes y's row (and
// whatever else it keeps) while z is in cache. An epilogue with copies_only() true is not
// called: the GEMM writes y.
template <class T, class Epilogue>
void conv2d_nhwc_forward_epilogue(const Conv2dShape& s, const T* x, const T* w, T* y, int threads,
                                  const Epilogue& epi) {
  static_assert(detail::conv2d_type_ok<T>,
                "kiln::cpu::conv2d_nhwc_forward: T must be float or double");
  s.check("kiln::cpu::conv2d_nhwc_forward");
  threads = detail::conv2d_threads(threads);
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows();
  const index_t chunk = detail::conv2d_chunk<T>(s);
  // An epilogue that would copy z unchanged (no bias, no activation, nothing kept) lets the GEMM
  // write y's rows itself: NHWC's GEMM rows are y's rows, so the copy pass is saved.
  bool direct = false;
  if constexpr (requires { { epi.copies_only() } -> std::convertible_to<bool>; }) direct = epi.copies_only();
  if (conv2d_winograd_applies(s)) {
    conv2d_winograd_forward(s, x, w, threads, [&](index_t row, const T* z) {
      if (direct) std::copy(z, z + s.c_out, y + row * s.c_out);
      else epi(row, z, y + row * s.c_out, s.c_out);
    });
    return;
  }
  // Patches packed from x by the GEMM (no column matrix) unless x's rows are the column matrix
  // already or CBLAS runs the products.
  const bool patches = !detail::conv2d_nhwc_pointwise(s) && current_gemm_backend() == gemm_backend::own;
  T* z = direct ? nullptr
                : detail::conv2d_scratch<T, detail::conv_nhwc_slot_z>(std::size_t(chunk * ohw * s.c_out));
  const T* wp = detail::conv2d_nhwc_patch_weight<T, detail::conv_nhwc_slot_w>(s, w, threads);
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), rows = cn * ohw;
    const index_t r0 = n0 * ohw;
    T* out = direct ? y + r0 * s.c_out : z;
    if (patches) {  // kiln's own GEMM packs the patches from x itself
      const detail::NhwcPatches<T> src{&s, x + n0 * s.h * s.w * s.c_in};
      gemm_with_a_source<T>(rows, s.c_out, k, {&detail::NhwcPatches<T>::pack, &src}, trans::yes, wp, k, T(0), out,
                            s.c_out, threads);
    } else {
      const T* col = detail::conv2d_nhwc_columns(s, x, n0, cn, threads);
      gemm<T>(trans::no, trans::yes, rows, s.c_out, k, T(1), col, k, wp, k, T(0), out, s.c_out, threads);
    }
    if (direct) continue;
    detail::conv2d_parallel(rows, threads, [&](index_t r) {
      epi(r0 + r, z + r * s.c_out, y + (r0 + r) * s.c_out, s.c_out);
    });
  }
}

// y = conv(x, w) + bias. bias may be nullptr. y is overwritten (never read).
template <class T>
void conv2d_nhwc_forward(const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y,
                         int threads = 0) {
  conv2d_nhwc_forward_epilogue(s, x, w, y, threads, [bias](index_t, const T* z, T* yr, index_t c) {
    if (bias) {
      for (index_t p = 0; p < c; ++p) yr[p] = z[p] + bias[p];
    } else {
      std::copy(z, z + c, yr);
    }
  });
}

// dx = d(sum y * dy)/dx for y = conv2d_nhwc_forward(x, w): dcol = dY * wp, then col2im.
// dx is overwritten, or added to with accumulate (a gradient that already holds a contribution:
// no temporary of x's size).
template <class T>
void conv2d_nhwc_backward_data(const Conv2dShape& s, const T* dy, const T* w, T* dx,
                               int threads = 0, bool accumulate = false) {
  static_assert(detail::conv2d_type_ok<T>,
                "kiln::cpu::conv2d_nhwc_backward_data: T must be float or double");
  s.check("kiln::cpu::conv2d_nhwc_backward_data");
  threads = detail::conv2d_threads(threads);
  if (conv2d_winograd_applies(s)) {
    conv2d_winograd_backward_data(s, dy, w, threads, [&](index_t pixel, const T* v) {
      T* out = dx + pixel * s.c_in;
      if (accumulate) {
        for (index_t c = 0; c < s.c_in; ++c) out[c] += v[c];
      } else {
        std::copy(v, v + s.c_in, out);
      }
    });
    return;
  }
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows(), hwc = s.h * s.w * s.c_in;
  const index_t chunk = detail::conv2d_chunk<T>(s);
  const bool pointwise = detail::conv2d_nhwc_pointwise(s);
  const T* wp = detail::conv2d_nhwc_patch_weight<T, detail::conv_nhwc_slot_w>(s, w, threads);
  T* dcol = pointwise ? nullptr
                      : detail::conv2d_scratch<T, detail::conv_nhwc_slot_col>(
                            std::size_t(chunk * ohw * k));
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), rows = cn * ohw;
    const T* dyc = dy + n0 * ohw * s.c_out;
    if (pointwise) {  // dcol is dx's rows
      gemm<T>(trans::no, trans::no, rows, k, s.c_out, T(1), dyc, s.c_out, wp, k, accumulate ? T(1) : T(0),
              dx + n0 * hwc, k, threads);
      continue;
    }
    gemm<T>(trans::no, trans::no, rows, k, s.c_out, T(1), dyc, s.c_out, wp, k, T(0), dcol, k,
            threads);
    detail::conv2d_parallel(cn * s.h, threads, [&](index_t r) {
      const index_t i = r / s.h;
      detail::col2im_nhwc_row(s, dcol + i * ohw * k, r % s.h, dx + (n0 + i) * hwc + r % s.h * s.w * s.c_in,
                              !accumulate);
    });
  }
}

// dw = sum over pixels of dy (x) patch, permuted back to [Cout, Cin, KH, KW]; dbias = sum of dy
// over n, oh, ow in double (skipped when dbias is nullptr). dw and dbias are overwritten.
template <class T>
void conv2d_nhwc_backward_filter(const Conv2dShape& s, const T* x, const T* dy, T* dw, T* dbias,
                                 int threads = 0) {
  static_assert(detail::conv2d_type_ok<T>,
                "kiln::cpu::conv2d_nhwc_backward_filter: T must be float or double");
  s.check("kiln::cpu::conv2d_nhwc_backward_filter");
  threads = detail::conv2d_threads(threads);
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows();
  if (conv2d_winograd_applies(s)) {
    conv2d_winograd_backward_filter(s, x, dy, dw, threads);
  } else {
    const index_t chunk = detail::conv2d_chunk<T>(s);
    const bool pointwise_weight = s.kh * s.kw == 1;  // patch order is the weight's own: no permuting back
    T* dwp = pointwise_weight ? dw : detail::conv2d_scratch<T, detail::conv_nhwc_slot_w>(std::size_t(s.c_out * k));
    for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
      const index_t cn = std::min(chunk, s.n - n0), rows = cn * ohw;
      const T* col = detail::conv2d_nhwc_columns(s, x, n0, cn, threads);
      // beta = 0 on the first chunk: dw need not be initialised by the caller.
      gemm<T>(trans::yes, trans::no, s.c_out, k, rows, T(1), dy + n0 * ohw * s.c_out, s.c_out, col,
              k, n0 == 0 ? T(0) : T(1), dwp, k, threads);
    }
    if (!pointwise_weight) detail::conv2d_nhwc_permute<false>(s, dwp, dw, threads);
  }
  if (dbias != nullptr) detail::conv2d_nhwc_bias_grad(s, dy, dbias, threads);
}

}  // namespace kiln::cpu
