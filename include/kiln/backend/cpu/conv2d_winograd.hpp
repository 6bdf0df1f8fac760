// kiln/backend/cpu/conv2d_winograd.hpp — 3x3 stride-1 convolutions, channels-last, by Winograd's
// minimal filtering (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015):
// forward and backward-data by F(4x4, 3x3) where the image is large next to the channels and
// F(2x2, 3x3) elsewhere (winograd_tile_side), backward-filter by F(2x2, 3x3).
//
// Each m x m block of output pixels (a tile) is computed from the (m + 2) x (m + 2) block of input
// pixels that covers it: V = B^T d B per input channel, U = G g G^T per filter, M = U . V summed
// over input channels — one GEMM per position of the transform, [tiles, Cin] x [Cin, Cout] — and
// Y = A^T M A. F(4x4, 3x3) does 36 multiply-adds per tile of 16 outputs and channel pair where the
// direct convolution (im2col + GEMM) does 144: 4x fewer (F(2x2, 3x3): 16 for 4 outputs, 2.25x),
// for memory passes over 2.25x the input's and output's size (done per chunk of tiles that stays
// near the caches). ResNet-50 spends about a third of its step in 3x3 stride-1 convolutions,
// forward and backward-data.
//
// Backward-data of a stride-1 3x3 convolution with padding p is the forward convolution of dy,
// padded by 2 - p, with the filter rotated by 180 degrees and its channels swapped: the same code
// with another filter transform (winograd_f4_filter's adjoint form). Backward-filter is the exact
// adjoint of an F(2x2, 3x3) forward: dU = dM^T V per position, dw = G^T dU G.
//
// Arithmetic: F(2x2)'s coefficients are 0, +-1 and +-1/2 (exact in binary); F(4x4)'s reach 8 in
// A and 5 in B and are fractions of 6 and 24 in G. Measured in fp32 against fp64 (56x56x64, unit
// variance data, outputs up to 4.8): F(4x4)'s largest error 4.7e-5 (rms 1.7e-6), the direct
// convolution's 2.0e-6, F(2x2)'s 3.1e-6 on 14x14x256 — cuDNN's and oneDNN's Winograd algorithms
// trade the same way. The chunking depends on the shape only: the bits are the same at any thread
// count. Who wants the direct convolution's bits sets conv_algorithm::gemm (set_conv_algorithm).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kiln/backend/cpu/conv2d.hpp"

namespace kiln::cpu {

// Which algorithm the CPU's channels-last convolutions use.
//   automatic  Winograd for 3x3 stride-1 convolutions where it measured faster
//              (conv2d_winograd_applies), the direct im2col / implicit-GEMM path elsewhere;
//   gemm       the direct path always (the bits of kiln before Winograd).
enum class conv_algorithm { automatic, gemm };

namespace detail {
inline std::atomic<conv_algorithm>& conv_algorithm_setting() {
  static std::atomic<conv_algorithm> setting{conv_algorithm::automatic};
  return setting;
}
}  // namespace detail

// Process-wide, like set_gemm_backend.
inline void set_conv_algorithm(conv_algorithm a) noexcept {
  detail::conv_algorithm_setting().store(a, std::memory_order_relaxed);
}
inline conv_algorithm current_conv_algorithm() noexcept {
  return detail::conv_algorithm_setting().load(std::memory_order_relaxed);
}

// True when a channels-last convolution of shape s runs by Winograd (forward, backward-data and
// backward-filter):
// 3x3, stride 1, dilation 1, padding at most 2 (the backward's padding is 2 - p), and at least
// 16 channels in and out — below that the transforms' memory passes cost more than the
// multiply-adds they save (an RGB stem has 3).
inline bool conv2d_winograd_applies(const Conv2dShape& s) {
  return current_conv_algorithm() == conv_algorithm::automatic && s.kh == 3 && s.kw == 3 &&
         s.stride_h == 1 && s.stride_w == 1 && s.dil_h == 1 && s.dil_w == 1 && s.pad_h <= 2 &&
         s.pad_w <= 2 && s.c_in >= 16 && s.c_out >= 16;
}

namespace detail {

// Scratch slots (conv2d_scratch), distinct from conv2d.hpp's and conv2d_nhwc.hpp's.
inline constexpr int winograd_slot_u = 5, winograd_slot_v = 6, winograd_slot_m = 7,
                     winograd_slot_zero = 8, winograd_slot_tile = 9;

// Distance between consecutive planes of U, V and M (one per position) for planes of `values`:
// one cache line more than the plane, because the transforms touch all planes at once and planes
// of a power-of-two size (layer4's U: 1 MiB each) would put every stream in the same cache set —
// measured, the filter transform alone then took half of layer4's convolution.
template <class T>
index_t winograd_plane_stride(index_t values) {
  return values + index_t(64 / sizeof(T));
}

// Runs transform(g, bn, out) over w's [co][ci][3][3] filters in blocks of up to 64 input channels:
// g[tap][i] holds the block's 9 taps transposed (rotated by 180 degrees for the adjoint form,
// backward-data's filter), so that the transform runs on vectors across i and stores contiguous
// runs into each of U's planes at out + i (scalar, one filter at a time, it took half of layer4's
// convolution). U keeps w's [co][ci] order, so w is read once in order and each plane written in
// order (a transposed U made layer4's 512x512 filter a gather of strided reads: slower than the
// whole convolution's multiply-adds); the GEMMs read a plane transposed (forward: B = U^T) or as
// it is (backward-data: dy's channels are co).
template <class T, class Transform>
void winograd_filter_blocks(const T* w, index_t co, index_t ci, bool adjoint, T* u, int threads,
                            const Transform& transform) {
  constexpr index_t block = 64;
  conv2d_parallel(co, threads, [&](index_t o) {
    for (index_t i0 = 0; i0 < ci; i0 += block) {
      const index_t bn = std::min(block, ci - i0);
      alignas(64) T g[9][block];
      for (index_t i = 0; i < bn; ++i) {
        const T* f = w + (o * ci + i0 + i) * 9;
        for (int t = 0; t < 9; ++t) g[adjoint ? 8 - t : t][i] = f[t];
      }
      transform(g, bn, u + o * ci + i0);
    }
  });
}

// U[xi][o][i] = (G g G^T)[xi], xi = 6 * row + column, for the 3x3 filter g = w[o][i] (forward) or
// w[o][i] rotated by 180 degrees (adjoint), F(4x4, 3x3)'s G = [[1/4, 0, 0], [-1/6, -1/6, -1/6],
// [-1/6, 1/6, -1/6], [1/24, 1/12, 1/6], [1/24, -1/12, 1/6], [0, 0, 1]]; 36 planes.
template <class T>
void winograd_f4_filter(const T* w, index_t co, index_t ci, bool adjoint, T* u, int threads) {
  const index_t plane = winograd_plane_stride<T>(co * ci);
  // G's rows applied to (a, b, c), one filter row or column.
  auto g_rows = [](T a, T b, T c, T* r) {
    r[0] = T(0.25) * a;
    r[1] = T(-1.0 / 6) * (a + b + c);
    r[2] = T(-1.0 / 6) * (a - b + c);
    r[3] = T(1.0 / 24) * a + T(1.0 / 12) * b + T(1.0 / 6) * c;
    r[4] = T(1.0 / 24) * a - T(1.0 / 12) * b + T(1.0 / 6) * c;
    r[5] = c;
  };
  winograd_filter_blocks(w, co, ci, adjoint, u, threads, [&](const auto& g, index_t bn, T* out) {
#pragma GCC ivdep
    for (index_t i = 0; i < bn; ++i) {
      T gg[3][6];  // (G g)^T: G applied down each of the filter's 3 columns
      for (int c = 0; c < 3; ++c) g_rows(g[c][i], g[3 + c][i], g[6 + c][i], gg[c]);
      for (int r = 0; r < 6; ++r) {  // (G g) G^T, row r
        T row[6];
        g_rows(gg[0][r], gg[1][r], gg[2][r], row);
        for (int c = 0; c < 6; ++c) out[(r * 6 + c) * plane + i] = row[c];
      }
    }
  });
}

// The same for F(2x2, 3x3): xi = 4 * row + column, G = [[1, 0, 0], [1/2, 1/2, 1/2],
// [1/2, -1/2, 1/2], [0, 0, 1]]; 16 planes.
template <class T>
void winograd_f2_filter(const T* w, index_t co, index_t ci, bool adjoint, T* u, int threads) {
  const index_t plane = winograd_plane_stride<T>(co * ci);
  winograd_filter_blocks(w, co, ci, adjoint, u, threads, [&](const auto& g, index_t bn, T* out) {
#pragma GCC ivdep
    for (index_t i = 0; i < bn; ++i) {
      T gg[4][3];  // G g
      for (int c = 0; c < 3; ++c) {
        const T g0 = g[c][i], g1 = g[3 + c][i], g2 = g[6 + c][i];
        gg[0][c] = g0;
        gg[1][c] = T(0.5) * (g0 + g1 + g2);
        gg[2][c] = T(0.5) * (g0 - g1 + g2);
        gg[3][c] = g2;
      }
      for (int r = 0; r < 4; ++r) {  // (G g) G^T
        out[(r * 4 + 0) * plane + i] = gg[r][0];
        out[(r * 4 + 1) * plane + i] = T(0.5) * (gg[r][0] + gg[r][1] + gg[r][2]);
        out[(r * 4 + 2) * plane + i] = T(0.5) * (gg[r][0] - gg[r][1] + gg[r][2]);
        out[(r * 4 + 3) * plane + i] = gg[r][2];
      }
    }
  });
}

// The geometry of one Winograd convolution: input [n, h, w, ci] padded by (ph, pw), output
// [n, oh, ow, co] with oh = h + 2 ph - 2, ow = w + 2 pw - 2, in tiles of m x m output pixels
// (m = 4: F(4x4, 3x3); 2: F(2x2, 3x3)), each from (m + 2) x (m + 2) input pixels.
struct WinogradGeometry {
  index_t n, h, w, ci, co, ph, pw, m;
  index_t positions() const { return (m + 2) * (m + 2); }
  index_t out_h() const { return h + 2 * ph - 2; }
  index_t out_w() const { return w + 2 * pw - 2; }
  index_t tiles_h() const { return (out_h() + m - 1) / m; }
  index_t tiles_w() const { return (out_w() + m - 1) / m; }
  index_t tiles() const { return n * tiles_h() * tiles_w(); }
  // Tile t's image and its row and column of tiles (tiles run image by image, row by row).
  struct Tile {
    index_t img, th, tw;
  };
  Tile tile(index_t t) const { return {t / (tiles_h() * tiles_w()), t / tiles_w() % tiles_h(), t % tiles_w()}; }
  // Tiles per chunk: V [positions, tiles, ci] and M [positions, tiles, co] stay under about 4 MiB
  // each (as conv2d_chunk bounds the column matrix), at least 64 so a GEMM's packing of U's
  // blocks is spread over enough rows. Depends on the shape only.
  template <class T>
  index_t chunk() const {
    const index_t per_tile = positions() * std::max(ci, co) * index_t(sizeof(T));
    return std::min(std::max<index_t>(index_t(std::size_t(4) << 20) / per_tile, 64), std::max<index_t>(tiles(), 1));
  }
};

// The (m + 2)^2 input pixels of tile t: pointers to their [ci] channels, or to zeros outside the
// image (the padding), row-major.
template <class T>
void winograd_tile_inputs(const WinogradGeometry& g, const T* x, index_t t, const T* zeros, const T** d) {
  const auto [img, th, tw] = g.tile(t);
  const index_t side = g.m + 2, ih0 = g.m * th - g.ph, iw0 = g.m * tw - g.pw;
  for (index_t i = 0; i < side; ++i)
    for (index_t j = 0; j < side; ++j) {
      const index_t ih = ih0 + i, iw = iw0 + j;
      const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
      d[i * side + j] = inside ? x + ((img * g.h + ih) * g.w + iw) * g.ci : zeros;
    }
}

// V[xi][t][c] = (B^T d B)[xi] for tile t0 + t of x, F(4x4, 3x3)'s
// B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
// [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]].
template <class T>
void winograd_f4_input(const WinogradGeometry& g, const T* x, index_t t0, index_t tc, index_t plane,
                       const T* zeros, T* v, int threads) {
  const index_t ci = g.ci;
  // B^T applied to (d0 .. d5), one column or row of the tile.
  auto bt = [](T d0, T d1, T d2, T d3, T d4, T d5, T* r) {
    r[0] = T(4) * d0 - T(5) * d2 + d4;
    r[1] = d3 + d4 - T(4) * (d1 + d2);
    r[2] = d4 - d3 + T(4) * (d1 - d2);
    r[3] = d4 - d2 + T(2) * (d3 - d1);
    r[4] = d4 - d2 + T(2) * (d1 - d3);
    r[5] = T(4) * d1 - T(5) * d3 + d5;
  };
  conv2d_parallel(tc, threads, [&](index_t t) {
    const T* d[36];
    winograd_tile_inputs(g, x, t0 + t, zeros, d);
    T* out = v + t * ci;
#pragma GCC ivdep
    for (index_t c = 0; c < ci; ++c) {
      T r[6][6];  // (B^T d)^T: B^T down each column
      for (int j = 0; j < 6; ++j)
        bt(d[j][c], d[6 + j][c], d[12 + j][c], d[18 + j][c], d[24 + j][c], d[30 + j][c], r[j]);
      for (int i = 0; i < 6; ++i) {  // (B^T d) B, row i
        T row[6];
        bt(r[0][i], r[1][i], r[2][i], r[3][i], r[4][i], r[5][i], row);
        for (int j = 0; j < 6; ++j) out[(i * 6 + j) * plane + c] = row[j];
      }
    }
  });
}

// F(2x2, 3x3)'s V[xi][t][c] = (B^T d B)[xi], xi = 4 * row + column, for tile t0 + t of x,
// B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]] (backward-filter's).
template <class T>
void winograd_f2_input(const WinogradGeometry& g, const T* x, index_t t0, index_t tc, index_t plane,
                       const T* zeros, T* v, int threads) {
  const index_t ci = g.ci;
  conv2d_parallel(tc, threads, [&](index_t t) {
    const T* d[16];
    winograd_tile_inputs(g, x, t0 + t, zeros, d);
    T* out = v + t * ci;
#pragma GCC ivdep
    for (index_t c = 0; c < ci; ++c) {
      T r[4][4];  // B^T d: rows combined, per column
      for (int j = 0; j < 4; ++j) {
        const T d0 = d[j][c], d1 = d[4 + j][c], d2 = d[8 + j][c], d3 = d[12 + j][c];
        r[0][j] = d0 - d2;
        r[1][j] = d1 + d2;
        r[2][j] = d2 - d1;
        r[3][j] = d1 - d3;
      }
      for (int i = 0; i < 4; ++i) {  // (B^T d) B: columns combined
        out[(i * 4 + 0) * plane + c] = r[i][0] - r[i][2];
        out[(i * 4 + 1) * plane + c] = r[i][1] + r[i][2];
        out[(i * 4 + 2) * plane + c] = r[i][2] - r[i][1];
        out[(i * 4 + 3) * plane + c] = r[i][1] - r[i][3];
      }
    }
  });
}

// Where a Winograd convolution hands its output pixels: fn(ctx, pixel, values [co]). A function
// pointer rather than a template parameter, so the convolution is compiled once per element type
// (in kiln::kernels, below) and not once per epilogue in every translation unit: one indirect call
// per output pixel of 16 to 2048 channels.
template <class T>
struct WinogradEmit {
  void (*fn)(const void* ctx, index_t pixel, const T* values);
  const void* ctx;
  void operator()(index_t pixel, const T* values) const { fn(ctx, pixel, values); }
};

// Runs transform(in, y) for tiles t0 .. t0 + tc - 1 of a chunk — in: the tile's M values at
// m + t * co (one plane per position), y: a per-thread buffer of its m x m pixels' [co] values —
// then hands the tile's pixels inside the image to emit(pixel, values [co]) with
// pixel = (img * oh + oh_i) * ow + ow_j.
template <class T, class Transform>
void winograd_output_tiles(const WinogradGeometry& g, const T* m, index_t t0, index_t tc, int threads,
                           const WinogradEmit<T>& emit, const Transform& transform) {
  const index_t co = g.co, side = g.m, pixels = side * side, oh_n = g.out_h(), ow_n = g.out_w();
  T* buf = conv2d_scratch<T, winograd_slot_tile>(std::size_t(pixels * co * std::max(threads, 1)));
  conv2d_parallel(tc, threads, [&](index_t t) {
    const auto [img, th, tw] = g.tile(t0 + t);
#if defined(_OPENMP)
    T* y = buf + pixels * co * (threads > 1 ? omp_get_thread_num() : 0);
#else
    T* y = buf;
#endif
    transform(m + t * co, y);
    for (index_t i = 0; i < side; ++i)
      for (index_t j = 0; j < side; ++j) {
        const index_t oh = side * th + i, ow = side * tw + j;
        if (oh < oh_n && ow < ow_n) emit((img * oh_n + oh) * ow_n + ow, y + (i * side + j) * co);
      }
  });
}

// Output tile t0 + t = A^T M A, F(4x4, 3x3)'s A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0],
// [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], each pixel handed to emit (winograd_output_tiles).
template <class T>
void winograd_f4_output(const WinogradGeometry& g, const T* m, index_t t0, index_t tc, index_t plane,
                        int threads, const WinogradEmit<T>& emit) {
  const index_t co = g.co;
  // A^T applied to (m0 .. m5), one column or row of the tile.
  auto at = [](T m0, T m1, T m2, T m3, T m4, T m5, T* r) {
    const T p12 = m1 + m2, n12 = m1 - m2, p34 = m3 + m4, n34 = m3 - m4;
    r[0] = m0 + p12 + p34;
    r[1] = n12 + T(2) * n34;
    r[2] = p12 + T(4) * p34;
    r[3] = n12 + T(8) * n34 + m5;
  };
  winograd_output_tiles(g, m, t0, tc, threads, emit, [&](const T* in, T* y) {
#pragma GCC ivdep
    for (index_t k = 0; k < co; ++k) {
      T r[6][4];  // (A^T M)^T: A^T down each column
      for (int j = 0; j < 6; ++j)
        at(in[j * plane + k], in[(6 + j) * plane + k], in[(12 + j) * plane + k], in[(18 + j) * plane + k],
           in[(24 + j) * plane + k], in[(30 + j) * plane + k], r[j]);
      for (int i = 0; i < 4; ++i) {  // (A^T M) A, row i
        T row[4];
        at(r[0][i], r[1][i], r[2][i], r[3][i], r[4][i], r[5][i], row);
        for (int j = 0; j < 4; ++j) y[(i * 4 + j) * co + k] = row[j];
      }
    }
  });
}

// The same for F(2x2, 3x3): A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
template <class T>
void winograd_f2_output(const WinogradGeometry& g, const T* m, index_t t0, index_t tc, index_t plane,
                        int threads, const WinogradEmit<T>& emit) {
  const index_t co = g.co;
  winograd_output_tiles(g, m, t0, tc, threads, emit, [&](const T* in, T* y) {
#pragma GCC ivdep
    for (index_t k = 0; k < co; ++k) {
      T r[2][4];  // A^T M
      for (int j = 0; j < 4; ++j) {
        const T m0 = in[j * plane + k], m1 = in[(4 + j) * plane + k], m2 = in[(8 + j) * plane + k],
                m3 = in[(12 + j) * plane + k];
        r[0][j] = m0 + m1 + m2;
        r[1][j] = m1 - m2 - m3;
      }
      for (int i = 0; i < 2; ++i) {  // (A^T M) A
        y[(i * 2 + 0) * co + k] = r[i][0] + r[i][1] + r[i][2];
        y[(i * 2 + 1) * co + k] = r[i][1] - r[i][2] - r[i][3];
      }
    }
  });
}

// The adjoint of winograd_f2_output: dM[xi][t][k] = (A dY A^T)[xi] for tile t0 + t of dy
// [n, oh, ow, co], A = [[1, 0], [1, 1], [1, -1], [0, -1]]; pixels past the image's edge (the
// last tiles' spare row or column) read zero.
template <class T>
void winograd_f2_output_adjoint(const WinogradGeometry& g, const T* dy, index_t t0, index_t tc, index_t plane,
                                const T* zeros, T* dm, int threads) {
  const index_t co = g.co, oh_n = g.out_h(), ow_n = g.out_w();
  conv2d_parallel(tc, threads, [&](index_t t) {
    const auto [img, th, tw] = g.tile(t0 + t);
    const T* d[4];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const index_t oh = 2 * th + i, ow = 2 * tw + j;
        d[i * 2 + j] = oh < oh_n && ow < ow_n ? dy + ((img * oh_n + oh) * ow_n + ow) * co : zeros;
      }
    T* out = dm + t * co;
#pragma GCC ivdep
    for (index_t k = 0; k < co; ++k) {
      const T d00 = d[0][k], d01 = d[1][k], d10 = d[2][k], d11 = d[3][k];
      const T r[4][2] = {{d00, d01}, {d00 + d10, d01 + d11}, {d00 - d10, d01 - d11}, {-d10, -d11}};  // A dY
      for (int i = 0; i < 4; ++i) {  // (A dY) A^T
        out[(i * 4 + 0) * plane + k] = r[i][0];
        out[(i * 4 + 1) * plane + k] = r[i][0] + r[i][1];
        out[(i * 4 + 2) * plane + k] = r[i][0] - r[i][1];
        out[(i * 4 + 3) * plane + k] = -r[i][1];
      }
    }
  });
}

// The adjoint of F(2x2, 3x3)'s filter transform U = G g G^T: dw[o][i] = G^T dU[.][o][i] G for the
// 16 planes of du (stride plane), G^T = [[1, 1/2, 1/2, 0], [0, 1/2, -1/2, 0], [0, 1/2, 1/2, 1]].
template <class T>
void winograd_f2_filter_adjoint(const T* du, index_t plane, index_t co, index_t ci, T* dw, int threads) {
  conv2d_parallel(co, threads, [&](index_t o) {
    for (index_t i = 0; i < ci; ++i) {
      T e[4][4];
      for (int xi = 0; xi < 16; ++xi) e[xi / 4][xi % 4] = du[xi * plane + o * ci + i];
      T r[3][4];  // G^T dU
      for (int j = 0; j < 4; ++j) {
        r[0][j] = e[0][j] + T(0.5) * (e[1][j] + e[2][j]);
        r[1][j] = T(0.5) * (e[1][j] - e[2][j]);
        r[2][j] = T(0.5) * (e[1][j] + e[2][j]) + e[3][j];
      }
      T* f = dw + (o * ci + i) * 9;
      for (int a = 0; a < 3; ++a) {  // (G^T dU) G
        f[a * 3 + 0] = r[a][0] + T(0.5) * (r[a][1] + r[a][2]);
        f[a * 3 + 1] = T(0.5) * (r[a][1] - r[a][2]);
        f[a * 3 + 2] = T(0.5) * (r[a][1] + r[a][2]) + r[a][3];
      }
    }
  });
}

// One convolution's scratch: U (the transformed filter, or its gradient), V and M for a chunk of
// tiles, their planes winograd_plane_stride apart, and zeros for the pixels past the edges.
template <class T>
struct WinogradBuffers {
  index_t chunk, u_plane, v_plane, m_plane;
  T *u, *v, *m;
  const T* zeros;

  explicit WinogradBuffers(const WinogradGeometry& g)
      : chunk(g.chunk<T>()),
        u_plane(winograd_plane_stride<T>(g.ci * g.co)),
        v_plane(winograd_plane_stride<T>(chunk * g.ci)),
        m_plane(winograd_plane_stride<T>(chunk * g.co)),
        u(conv2d_scratch<T, winograd_slot_u>(std::size_t(g.positions() * u_plane))),
        v(conv2d_scratch<T, winograd_slot_v>(std::size_t(g.positions() * v_plane))),
        m(conv2d_scratch<T, winograd_slot_m>(std::size_t(g.positions() * m_plane))) {
    const index_t wide = std::max(g.ci, g.co);
    T* z = conv2d_scratch<T, winograd_slot_zero>(std::size_t(wide));
    std::fill(z, z + wide, T(0));
    zeros = z;
  }
};

// product(xi, threads) for each of the positions. With kiln's own GEMM the products are split
// across threads, one thread each: a product of a few channels does not split well by itself
// (backward-filter's [co, ci] result with 64 x 32 channels is one GEMM panel: serial at two
// threads), and one thread per product has no fork and join per GEMM; a product's bits do not
// depend on which thread runs it. A CBLAS is not called from several threads at once (not every
// build allows it): the products run in turn, each on all threads.
template <class F>
void winograd_products(index_t positions, int threads, const F& product) {
  if (current_gemm_backend() == gemm_backend::own) {
    conv2d_parallel(positions, threads, [&](index_t xi) { product(xi, 1); });
  } else {
    for (index_t xi = 0; xi < positions; ++xi) product(xi, threads);
  }
}

// The convolution of x by the filter transformed into b.u (winograd_f4_filter or _f2_filter, as
// g.m: U^T for the forward, U as it is for backward-data), each output pixel handed to
// emit(pixel, values [co]) once.
template <class T>
void winograd_run(const WinogradGeometry& g, const T* x, const WinogradBuffers<T>& b, bool u_transposed,
                  int threads, const WinogradEmit<T>& emit) {
  const index_t tiles = g.tiles();
  for (index_t t0 = 0; t0 < tiles; t0 += b.chunk) {
    const index_t tc = std::min(b.chunk, tiles - t0);
    if (g.m == 4) winograd_f4_input(g, x, t0, tc, b.v_plane, b.zeros, b.v, threads);
    else winograd_f2_input(g, x, t0, tc, b.v_plane, b.zeros, b.v, threads);
    winograd_products(g.positions(), threads, [&](index_t xi, int product_threads) {
      gemm<T>(trans::no, u_transposed ? trans::yes : trans::no, tc, g.co, g.ci, T(1), b.v + xi * b.v_plane, g.ci,
              b.u + xi * b.u_plane, u_transposed ? g.ci : g.co, T(0), b.m + xi * b.m_plane, g.co, product_threads);
    });
    if (g.m == 4) winograd_f4_output(g, b.m, t0, tc, b.m_plane, threads, emit);
    else winograd_f2_output(g, b.m, t0, tc, b.m_plane, threads, emit);
  }
}

// The output tile side for a forward (or backward-data) of geometry g: F(4x4, 3x3) where tiles of
// 4x4 outnumber the channels, F(2x2, 3x3) below. F(4x4) does 1.8x fewer multiply-adds than F(2x2)
// but transforms 36 positions instead of 16 — the filter's (36 planes of ci x co) and each
// product's packing of its plane cost as much per call whatever the tiles — so it wins where the
// image is large next to the channels. Measured (AMD EPYC Zen 3, one thread, batch 8, forward /
// backward-data ms, F(2x2) -> F(4x4)): ResNet-50's 56x56x64 15.7 -> 12.6, 28x28x128 12.8 -> 9.9
// (tiles / channels 24 and 3: F(4x4)); 14x14x256 12.1 -> 12.7, 7x7x512 17.0 -> 21.1 (0.5 and
// 0.06: F(2x2)). Depends on the shape only.
inline index_t winograd_tile_side(index_t n, index_t out_h, index_t out_w, index_t ci, index_t co) {
  const index_t tiles4 = n * ((out_h + 3) / 4) * ((out_w + 3) / 4);
  return tiles4 >= std::max(ci, co) ? 4 : 2;
}

// The shape checks of the public entry points: a valid convolution, and one Winograd's 3x3
// transforms compute (any other would come out wrong, not slow).
inline void winograd_check(const Conv2dShape& s, const char* fn) {
  s.check(fn);
  KILN_CHECK(s.kh == 3 && s.kw == 3 && s.stride_h == 1 && s.stride_w == 1 && s.dil_h == 1 && s.dil_w == 1 &&
                 s.pad_h <= 2 && s.pad_w <= 2,
             ShapeError, fn, ": Winograd takes 3x3, stride-1, undilated convolutions with padding <= 2, got ",
             s.kh, "x", s.kw, " stride ", s.stride_h, ",", s.stride_w, " dilation ", s.dil_h, ",", s.dil_w,
             " padding ", s.pad_h, ",", s.pad_w);
}

// The passes behind conv2d_winograd_forward / _backward_data with the filter transform, compiled
// once per element type.
template <class T>
void winograd_forward(const Conv2dShape& s, const T* x, const T* w, int threads, const WinogradEmit<T>& emit) {
  const index_t m = winograd_tile_side(s.n, s.out_h(), s.out_w(), s.c_in, s.c_out);
  const WinogradGeometry g{s.n, s.h, s.w, s.c_in, s.c_out, s.pad_h, s.pad_w, m};
  const WinogradBuffers<T> b(g);
  if (m == 4) winograd_f4_filter(w, s.c_out, s.c_in, /*adjoint=*/false, b.u, threads);
  else winograd_f2_filter(w, s.c_out, s.c_in, /*adjoint=*/false, b.u, threads);
  winograd_run(g, x, b, /*u_transposed=*/true, threads, emit);
}

template <class T>
void winograd_backward_data(const Conv2dShape& s, const T* dy, const T* w, int threads,
                            const WinogradEmit<T>& emit) {
  const index_t m = winograd_tile_side(s.n, s.h, s.w, s.c_out, s.c_in);
  const WinogradGeometry g{s.n, s.out_h(), s.out_w(), s.c_out, s.c_in, 2 - s.pad_h, 2 - s.pad_w, m};
  const WinogradBuffers<T> b(g);
  if (m == 4) winograd_f4_filter(w, s.c_out, s.c_in, /*adjoint=*/true, b.u, threads);
  else winograd_f2_filter(w, s.c_out, s.c_in, /*adjoint=*/true, b.u, threads);
  winograd_run(g, dy, b, /*u_transposed=*/false, threads, emit);
}

template <class T, class Emit>
WinogradEmit<T> winograd_emit(const Emit& emit) {
  return {[](const void* ctx, index_t pixel, const T* values) { (*static_cast<const Emit*>(ctx))(pixel, values); },
          &emit};
}

}  // namespace detail

// y = conv(x, w) for a shape conv2d_winograd_applies to, each output pixel's [Cout] values handed
// to emit(pixel, values) (pixel = n*OH*OW + oh*OW + ow; values in a per-thread buffer).
template <class T, class Emit>
void conv2d_winograd_forward(const Conv2dShape& s, const T* x, const T* w, int threads, const Emit& emit) {
  detail::winograd_check(s, "kiln::cpu::conv2d_winograd_forward");
  detail::winograd_forward<T>(s, x, w, threads, detail::winograd_emit<T>(emit));
}

// dx = d(sum y * dy)/dx for the same shapes: the Winograd forward of dy padded by 2 - p with the
// rotated, transposed filter; each input pixel's [Cin] values handed to emit(pixel, values).
template <class T, class Emit>
void conv2d_winograd_backward_data(const Conv2dShape& s, const T* dy, const T* w, int threads, const Emit& emit) {
  detail::winograd_check(s, "kiln::cpu::conv2d_winograd_backward_data");
  detail::winograd_backward_data<T>(s, dy, w, threads, detail::winograd_emit<T>(emit));
}

// dw = d(sum y * dy)/dw for the same shapes (overwritten): the exact adjoint of
// conv2d_winograd_forward — dU[xi] = sum over tiles of dM[xi]^T V[xi] (one GEMM per position and
// chunk of tiles, accumulated in chunk order), then dw = G^T dU G.
template <class T>
void conv2d_winograd_backward_filter(const Conv2dShape& s, const T* x, const T* dy, T* dw, int threads) {
  using namespace detail;
  winograd_check(s, "kiln::cpu::conv2d_winograd_backward_filter");
  const WinogradGeometry g{s.n, s.h, s.w, s.c_in, s.c_out, s.pad_h, s.pad_w, 2};
  const index_t tiles = g.tiles();
  const WinogradBuffers<T> b(g);  // b.u holds dU, b.m holds dM
  for (index_t t0 = 0; t0 < tiles; t0 += b.chunk) {
    const index_t tc = std::min(b.chunk, tiles - t0);
    winograd_f2_input(g, x, t0, tc, b.v_plane, b.zeros, b.v, threads);
    winograd_f2_output_adjoint(g, dy, t0, tc, b.m_plane, b.zeros, b.m, threads);
    winograd_products(g.positions(), threads, [&](index_t xi, int product_threads) {
      gemm<T>(trans::yes, trans::no, g.co, g.ci, tc, T(1), b.m + xi * b.m_plane, g.co, b.v + xi * b.v_plane, g.ci,
              t0 == 0 ? T(0) : T(1), b.u + xi * b.u_plane, g.ci, product_threads);
    });
  }
  winograd_f2_filter_adjoint(b.u, b.u_plane, g.co, g.ci, dw, threads);
}

// Compiled once in kiln::kernels (src/kernels/conv_winograd.cpp) for the element types the
// convolutions take.
#define KILN_CPU_WINOGRAD_INSTANCES(EXTERN, T)                                                              \
  EXTERN template void detail::winograd_forward<T>(const Conv2dShape&, const T*, const T*, int,              \
                                                   const detail::WinogradEmit<T>&);                        \
  EXTERN template void detail::winograd_backward_data<T>(const Conv2dShape&, const T*, const T*, int,        \
                                                         const detail::WinogradEmit<T>&);                  \
  EXTERN template void conv2d_winograd_backward_filter<T>(const Conv2dShape&, const T*, const T*, T*, int);
#if KILN_EXTERN_KERNELS
KILN_CPU_WINOGRAD_INSTANCES(extern, float)
KILN_CPU_WINOGRAD_INSTANCES(extern, double)
#endif

}  // namespace kiln::cpu
