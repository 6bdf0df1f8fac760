// kiln/backend/cpu/conv2d_nhwc_bf16.hpp — channels-last 2-D convolution with kiln::bf16 inputs
// on the bf16 GEMM (AMX tiles or vdpbf16ps where the CPU has them, gemm.hpp's gemm_bf16_path):
// mixed precision's convolution (nn::Conv2d under bf16_mixed).
//
//   x [N, H, W, Cin] bf16, w [Cout, Cin, KH, KW] bf16, dy [N, OH, OW, Cout] bf16;
//   y and dx bf16 (each value rounded once from its float sum), dw, dbias float.
//
// The column matrix of conv2d_nhwc.hpp (row per output pixel, patch in (i, j, c) order) in bf16,
// chunked as there (chunks depend on the shape only, so the bits do not depend on the thread
// count). Forward Y = col * wp^T: written by gemm_rounded when at most a bias follows (on AMX
// rounded as it leaves the tiles, the bias added there, and the patches copied from x by the
// GEMM into its A panels: no column matrix in memory), else float rows through the epilogue,
// rounded in cache.
// Backward-data: for stride 1, the forward convolution of dy with the kernel flipped and its
// channels swapped (dy's bf16 patches, dx rounded from the GEMM); otherwise dcol = dY * wp in
// float, then col2im, rounded row by row. Backward-filter dwp = dY^T * col, summed over chunks in
// float. Pointwise (1x1 stride-1 unpadded) convolutions read x's and dy's rows directly, and a
// 1x1 kernel's weight is used as it is. No Winograd: its transforms would round to bf16 between
// stages (the error F(4x4) adds in fp32 is 20x the direct one's, README), and on AMX the
// products are no longer what costs.
//
// Numerics: every product of two bf16 values is exact; sums are fp32 (in the order the GEMM
// path sums them: gemm_kernel_bf16.hpp / gemm_kernel_amx.hpp), so a result is within the float
// convolution's error bound of the float convolution of the same (rounded) values, then rounded.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstring>

#include "kiln/backend/cpu/conv2d_nhwc.hpp"
#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/core/bf16_bulk.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::cpu {

namespace detail {
// Scratch slots of the bf16 path's own buffers (conv2d_scratch keys on the type too).
inline constexpr int conv_bf16_slot_w = 5, conv_bf16_slot_col = 6, conv_bf16_slot_z = 7, conv_bf16_slot_dw = 8,
                     conv_bf16_slot_row = 9, conv_bf16_slot_wt = 10;

// The epilogue of a plain convolution: the sums themselves (copies_only: gemm_rounded writes y).
struct ConvCopy {
  static constexpr bool copies_only() { return true; }
  void operator()(index_t, const float* z, float* out, index_t c) const { std::copy(z, z + c, out); }
};

// The epilogue of a convolution added into y (a gradient that already holds a contribution):
// y = round(float(y) + sum), the old row read before its rounded sum replaces it. accumulates():
// gemm_rounded adds it as it writes y.
struct ConvAccumulate {
  const bf16* y;
  static constexpr bool accumulates() { return true; }
  void operator()(index_t row, const float* z, float* out, index_t c) const {
    widen_bf16(y + row * c, out, c);
    for (index_t j = 0; j < c; ++j) out[j] += z[j];
  }
};

// The weight in patch order [Cout, KH*KW*Cin]: w itself for a 1x1 kernel, else permuted into scratch.
inline const bf16* conv2d_bf16_patch_weight(const Conv2dShape& s, const bf16* w, int threads) {
  return conv2d_nhwc_patch_weight<bf16, conv_bf16_slot_w>(s, w, threads);
}

// The column matrix of a chunk of images as rows the GEMM asks for (gemm_bf16_row_source): each
// output pixel's patch values [p0, p0 + kc) copied from x where the GEMM packs them (on AMX, into
// the tiles' A panels), runs of a kernel row whole (memcpy once long), padding as zeros.
struct NhwcPatchRows {
  const Conv2dShape* s;
  const bf16* x;  // the chunk's first image

  static void rows(const void* ctx, index_t r0, index_t count, index_t p0, index_t kc, bf16* dst, index_t ld) {
    const NhwcPatchRows& src = *static_cast<const NhwcPatchRows*>(ctx);
    const Conv2dShape& s = *src.s;
    const index_t ow_n = s.out_w(), ohw = s.out_h() * ow_n, hwc = s.h * s.w * s.c_in, p1 = p0 + kc;
    for (index_t r = 0; r < count; ++r) {
      const index_t pixel = r0 + r, img = pixel / ohw, oh = pixel % ohw / ow_n, ow = pixel % ow_n;
      const bf16* x_n = src.x + img * hwc;
      bf16* out = dst + r * ld;  // out[p - p0]: patch value p
      conv2d_nhwc_taps(
          s, oh, ow,
          [&](index_t p, index_t q, index_t len) {
            const index_t lo = std::max(p, p0), hi = std::min(p + len, p1);
            if (hi - lo >= 16) std::memcpy(out + (lo - p0), x_n + q + (lo - p), std::size_t(hi - lo) * sizeof(bf16));
            else for (index_t e = lo; e < hi; ++e) out[e - p0] = x_n[q + (e - p)];
          },
          [&](index_t p, index_t len) {
            const index_t lo = std::max(p, p0), hi = std::min(p + len, p1);
            if (lo < hi) std::fill(out + (lo - p0), out + (hi - p0), bf16{});
          });
    }
  }
};

}  // namespace detail

// y = round(epilogue(conv(x, w))) as conv2d_nhwc_forward_epilogue: epi(row, z, out, Cout) per
// output pixel with the GEMM's float values z [Cout] writes the row's float values to out, which
// are rounded into y's row. An epilogue with copies_only() true, or whose bias_only() names a
// bias b [Cout] it adds and nothing else, is not called: gemm_rounded writes y, each value the
// sum over the whole patch (+ b) rounded once — on AMX as it leaves the tiles, the patches packed
// from x by the GEMM itself (no column matrix).
template <class Epilogue>
void conv2d_nhwc_bf16_forward_epilogue(const Conv2dShape& s, const bf16* x, const bf16* w, bf16* y, int threads,
                                       const Epilogue& epi) {
  s.check("kiln::cpu::conv2d_nhwc_bf16_forward");
  threads = detail::conv2d_threads(threads);
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows(), hwc = s.h * s.w * s.c_in;
  const index_t chunk = detail::conv2d_chunk<bf16>(s);
  bool direct = false, accumulate = false;
  const float* bias = nullptr;
  if constexpr (requires { { epi.copies_only() } -> std::convertible_to<bool>; }) direct = epi.copies_only();
  if constexpr (requires { { epi.bias_only() } -> std::convertible_to<const float*>; }) {
    bias = epi.bias_only();
    direct = direct || bias != nullptr;
  }
  if constexpr (requires { { epi.accumulates() } -> std::convertible_to<bool>; }) {
    accumulate = epi.accumulates();
    direct = direct || accumulate;
  }
  const bf16* wp = detail::conv2d_bf16_patch_weight(s, w, threads);
  float* z = direct ? nullptr
                    : detail::conv2d_scratch<float, detail::conv_bf16_slot_z>(std::size_t(chunk * ohw * s.c_out));
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), rows = cn * ohw, r0 = n0 * ohw;
    if (direct && !detail::conv2d_nhwc_pointwise(s)) {
      const detail::NhwcPatchRows patches{&s, x + n0 * hwc};
      if (gemm_rounded_with_a_source<bf16>(rows, s.c_out, k, {&detail::NhwcPatchRows::rows, &patches}, trans::yes, wp,
                                           k, y + r0 * s.c_out, s.c_out, threads, bias, accumulate))
        continue;
    }
    const bf16* col = detail::conv2d_nhwc_columns<bf16>(s, x, n0, cn, threads);
    if (direct) {  // y is the sums (+ bias, + y) rounded (on AMX, as they leave the tiles)
      gemm_rounded<bf16>(trans::no, trans::yes, rows, s.c_out, k, col, k, wp, k, y + r0 * s.c_out, s.c_out, threads,
                         bias, accumulate);
      continue;
    }
    gemm<bf16>(trans::no, trans::yes, rows, s.c_out, k, 1.0f, col, k, wp, k, 0.0f, z, s.c_out, threads);
    // Rows in blocks (one per thread task; a chunk is often one image), each row's float values
    // rounded while in cache.
    constexpr index_t block = 64;
    detail::conv2d_parallel((rows + block - 1) / block, threads, [&](index_t b) {
      const index_t end = std::min(rows, (b + 1) * block);
      float* out = detail::conv2d_scratch<float, detail::conv_bf16_slot_row>(std::size_t(s.c_out));
      for (index_t r = b * block; r < end; ++r) {
        epi(r0 + r, z + r * s.c_out, out, s.c_out);
        round_to_bf16(out, y + (r0 + r) * s.c_out, s.c_out);
      }
    });
  }
}

// dx = d(sum y * dy)/dx, each value rounded once into dx; dx overwritten, or with accumulate
// dx = round(float(dx) + value). Stride 1: a forward convolution of dy (below); pointwise: dY * wp
// itself, rounded by the GEMM; otherwise dcol = dY * wp (float), then col2im in float.
inline void conv2d_nhwc_bf16_backward_data(const Conv2dShape& s, const bf16* dy, const bf16* w, bf16* dx,
                                           int threads = 0, bool accumulate = false) {
  s.check("kiln::cpu::conv2d_nhwc_bf16_backward_data");
  threads = detail::conv2d_threads(threads);
  if (!detail::conv2d_nhwc_pointwise(s) && s.stride_h == 1 && s.stride_w == 1 && s.dil_h == 1 && s.dil_w == 1 &&
      s.pad_h < s.kh && s.pad_w < s.kw) {
    // Stride 1: dx is the forward convolution of dy, padded by K - 1 - pad, with the kernel
    // flipped and its channels swapped — patches of dy (bf16) instead of a float column matrix
    // gathered back (col2im), and dx's values rounded as they leave the GEMM.
    Conv2dShape t = s;
    t.c_in = s.c_out, t.h = s.out_h(), t.w = s.out_w(), t.c_out = s.c_in;
    t.pad_h = s.kh - 1 - s.pad_h, t.pad_w = s.kw - 1 - s.pad_w;
    bf16* wt = detail::conv2d_scratch<bf16, detail::conv_bf16_slot_wt>(std::size_t(s.c_in * s.c_out * s.kh * s.kw));
    const index_t taps = s.kh * s.kw;
    detail::conv2d_parallel(s.c_in, threads, [&](index_t ci) {  // wt[ci][co][i][j] = w[co][ci][K-1-i][K-1-j]
      for (index_t co = 0; co < s.c_out; ++co)
        for (index_t t0 = 0; t0 < taps; ++t0) wt[(ci * s.c_out + co) * taps + t0] = w[(co * s.c_in + ci) * taps + taps - 1 - t0];
    });
    if (!accumulate) conv2d_nhwc_bf16_forward_epilogue(t, dy, wt, dx, threads, detail::ConvCopy{});
    else conv2d_nhwc_bf16_forward_epilogue(t, dy, wt, dx, threads, detail::ConvAccumulate{dx});
    return;
  }
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows(), hwc = s.h * s.w * s.c_in;
  const bf16* wp = detail::conv2d_bf16_patch_weight(s, w, threads);
  const index_t chunk = detail::conv2d_chunk<float>(s);  // dcol is float (and gemm_rounded's scratch off AMX)
  if (detail::conv2d_nhwc_pointwise(s)) {
    // dx's rows are dY * wp's, rounded as they leave the GEMM (with accumulate, each added to
    // dx's old value first: no float rows written and read back to add them).
    for (index_t n0 = 0; n0 < s.n; n0 += chunk)
      gemm_rounded<bf16>(trans::no, trans::no, std::min(chunk, s.n - n0) * ohw, k, s.c_out, dy + n0 * ohw * s.c_out,
                         s.c_out, wp, k, dx + n0 * hwc, k, threads, nullptr, accumulate);
    return;
  }
  float* dcol = detail::conv2d_scratch<float, detail::conv_bf16_slot_col>(std::size_t(chunk * ohw * k));
  const index_t row_len = s.w * s.c_in;  // an input row's values
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), rows = cn * ohw;
    gemm<bf16>(trans::no, trans::no, rows, k, s.c_out, 1.0f, dy + n0 * ohw * s.c_out, s.c_out, wp, k, 0.0f, dcol, k,
               threads);
    // Input row by input row, gathered (col2im).
    detail::conv2d_parallel(cn * s.h, threads, [&](index_t r) {
      const index_t i = r / s.h, ih = r % s.h;
      float* buf = detail::conv2d_scratch<float, detail::conv_bf16_slot_row>(std::size_t(row_len));
      bf16* out = dx + (n0 + i) * hwc + ih * row_len;
      detail::col2im_nhwc_row(s, dcol + i * ohw * k, ih, buf, true);
      if (accumulate) add_round_to_bf16(buf, out, row_len);
      else round_to_bf16(buf, out, row_len);
    });
  }
}

// dw = sum over pixels of dy (x) patch, permuted back to [Cout, Cin, KH, KW]; dbias = sum of dy
// over n, oh, ow in double (skipped when dbias is nullptr). dw and dbias are overwritten.
inline void conv2d_nhwc_bf16_backward_filter(const Conv2dShape& s, const bf16* x, const bf16* dy, float* dw,
                                             float* dbias, int threads = 0) {
  s.check("kiln::cpu::conv2d_nhwc_bf16_backward_filter");
  threads = detail::conv2d_threads(threads);
  const index_t ohw = s.out_h() * s.out_w(), k = s.col_rows();
  const index_t chunk = detail::conv2d_chunk<bf16>(s);
  const bool pointwise_weight = s.kh * s.kw == 1;  // patch order is the weight's own: no permuting back
  float* dwp = pointwise_weight ? dw : detail::conv2d_scratch<float, detail::conv_bf16_slot_dw>(std::size_t(s.c_out * k));
  for (index_t n0 = 0; n0 < s.n; n0 += chunk) {
    const index_t cn = std::min(chunk, s.n - n0), rows = cn * ohw;
    const bf16* col = detail::conv2d_nhwc_columns<bf16>(s, x, n0, cn, threads);
    gemm<bf16>(trans::yes, trans::no, s.c_out, k, rows, 1.0f, dy + n0 * ohw * s.c_out, s.c_out, col, k,
               n0 == 0 ? 0.0f : 1.0f, dwp, k, threads);
  }
  if (!pointwise_weight) detail::conv2d_nhwc_permute<false>(s, dwp, dw, threads);
  if (dbias != nullptr) detail::conv2d_nhwc_bias_grad(s, dy, dbias, threads);
}

}  // namespace kiln::cpu
