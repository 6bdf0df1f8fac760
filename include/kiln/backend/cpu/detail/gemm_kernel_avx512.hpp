// kiln/backend/cpu/detail/gemm_kernel_avx512.hpp — the AVX-512 fp32 microkernel of the CPU GEMM
// (gemm_kernel.hpp picks it when the target has AVX-512F; double keeps the AVX2 kernel).
//
// Tile: MR = 12 rows x NR = 32 columns = 12 x 2 zmm accumulators (24 registers), 2 zmm for the
// B row of the step and broadcasts of A into the rest: 32 zmm registers, no spills. Per k step
// 2 vector loads + 12 broadcast loads feed 24 FMAs, so with two 512-bit FMA pipes and two load
// ports the FMAs set the pace (12 cycles of FMA, 7 of loads), and 24 independent accumulators
// cover the FMA latency (4 cycles x 2 pipes = 8 in flight) three times over. 12 rather than 14
// rows: a 14 x 32 tile needs all 32 registers (28 + 2 + 2 broadcasts) and wastes more padding on
// the narrow sides of the MLP shapes (m = 64: 91% vs 89%, m = 10 transposed: 83% vs 71%).
// Partial tiles: AVX-512 masks on the C loads and stores, never past the matrix. The C update
// (store_tile_avx512) is shared with the bf16 kernel (gemm_kernel_bf16.hpp).
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_kernel_avx512.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include <immintrin.h>

#include "kiln/config.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define KILN_GEMM512_UNROLL(n) _Pragma(n)
#else
#define KILN_GEMM512_UNROLL(n)
#endif

namespace kiln::cpu::detail {

// Lanes [0, n) of a 16-lane mask; n outside [0, 16] is clamped.
inline __mmask16 avx512_mask(int n) {
  return n <= 0 ? __mmask16(0) : n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}

// The unmasked unpack and 128-bit shuffle intrinsics of GCC 12 start from _mm512_undefined_ps()
// and trip -Wmaybe-uninitialized (GCC PR 105593); the zero-masked forms with every lane selected
// are the same instructions without that.
inline __m512 unpacklo16(__m512 a, __m512 b) { return _mm512_maskz_unpacklo_ps(0xFFFF, a, b); }
inline __m512 unpackhi16(__m512 a, __m512 b) { return _mm512_maskz_unpackhi_ps(0xFFFF, a, b); }
template <int Imm>
inline __m512 shuffle128(__m512 a, __m512 b) {
  return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, Imm);
}

// Transposes the 16 x 16 block whose rows are r[0..15] in place: afterwards r[j] holds column j.
inline void transpose16x16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = unpacklo16(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = unpackhi16(r[2 * i], r[2 * i + 1]);
  }
  // u[4h + q], 128-bit lane L: rows 4h..4h+3 of column 4L + q.
  for (int h = 0; h < 4; ++h) {
    u[4 * h + 0] = _mm512_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm512_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512 x0 = shuffle128<0x88>(u[q], u[4 + q]);  // lanes 0, 2 of rows 0-7
    const __m512 x1 = shuffle128<0xDD>(u[q], u[4 + q]);  // lanes 1, 3
    const __m512 y0 = shuffle128<0x88>(u[8 + q], u[12 + q]);
    const __m512 y1 = shuffle128<0xDD>(u[8 + q], u[12 + q]);
    r[q] = shuffle128<0x88>(x0, y0);
    r[8 + q] = shuffle128<0xDD>(x0, y0);
    r[4 + q] = shuffle128<0x88>(x1, y1);
    r[12 + q] = shuffle128<0xDD>(x1, y1);
  }
}

// Touches the mr x nr (nr <= 32) tile of C at c early, so its lines arrive while the k loop runs.
inline void prefetch_tile_avx512(const float* c, index_t rs_c, index_t cs_c, int mr, int nr) {
  if (cs_c == 1) {
    for (int r = 0; r < mr; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * rs_c), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * rs_c + 16), _MM_HINT_T0);
    }
  } else {
    for (int j = 0; j < nr; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(c + j * cs_c), _MM_HINT_T0);
  }
}

// C[0:mr, 0:nr] = alpha * acc + beta * C   (beta == 0: C is not read) for a register tile of MR
// rows x 32 floats, C(r, j) at c[r * rs_c + j * cs_c] with cs_c == 1 (row-major C) or rs_c == 1
// (C seen transposed). Shared by the fp32 and bf16 microkernels, which differ only in the k loop.
// requires: mr <= MR <= 16, nr <= 32.
template <int MR>
inline void store_tile_avx512(const __m512 (&acc)[MR][2], float* KILN_RESTRICT c, index_t rs_c,
                              index_t cs_c, float alpha, float beta, int mr, int nr) {
  static_assert(MR >= 1 && MR <= 16, "the transposed store handles up to 16 rows");
  constexpr int NV = 2, W = 16;
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (cs_c == 1) {
    const __mmask16 m0 = avx512_mask(nr), m1 = avx512_mask(nr - W);
    const bool full = nr == NV * W;
    KILN_GEMM512_UNROLL("GCC unroll 16")
    for (int r = 0; r < MR; ++r) {
      if (r >= mr) break;
      float* cr = c + r * rs_c;
      __m512 y0 = _mm512_mul_ps(va, acc[r][0]), y1 = _mm512_mul_ps(va, acc[r][1]);
      if (full) {
        if (beta != 0.0f) {
          y0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr), y0);
          y1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr + W), y1);
        }
        _mm512_storeu_ps(cr, y0);
        _mm512_storeu_ps(cr + W, y1);
      } else {
        if (beta != 0.0f) {
          y0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), y0);
          y1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + W), y1);
        }
        _mm512_mask_storeu_ps(cr, m0, y0);
        _mm512_mask_storeu_ps(cr + W, m1, y1);
      }
    }
    return;
  }

  // C seen transposed (narrow C computed as C^T, see gemm_driver.hpp): tile element (r, j) goes
  // to c[j * cs_c + r]. Transposing 16 x 16 blocks in registers turns each column j of the tile
  // into one masked store of mr floats.
  // Fully unrolled, like the row-major loop above: an acc index that is not a compile-time
  // constant would keep the whole tile in memory rather than in registers, for every tile (two
  // dozen spills and reloads, which cost ~20% at k = 10).
  const __mmask16 rows = avx512_mask(mr);
  KILN_GEMM512_UNROLL("GCC unroll 2")
  for (int v = 0; v < NV; ++v) {
    __m512 t[16];
    KILN_GEMM512_UNROLL("GCC unroll 16")
    for (int r = 0; r < 16; ++r)
      t[r] = r < MR ? _mm512_mul_ps(va, acc[r < MR ? r : 0][v]) : _mm512_setzero_ps();
    transpose16x16(t);
    for (int q = 0; q < W && v * W + q < nr; ++q) {
      float* p = c + (v * W + q) * cs_c;
      __m512 y = t[q];
      if (beta != 0.0f) y = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(rows, p), y);
      _mm512_mask_storeu_ps(p, rows, y);
    }
  }
}

// C[0:mr, 0:nr] = alpha * Ap * Bp + beta * C   (beta == 0: C is not read), where C(r, j) is
// c[r * rs_c + j * cs_c] and either cs_c == 1 (row-major C) or rs_c == 1 (C seen transposed).
// requires: ap holds kc x MR and bp kc x 32 packed floats, bp 64-byte aligned; mr <= MR,
// nr <= 32, MR <= 16.
template <int MR>
inline void microkernel_avx512(index_t kc, const float* KILN_RESTRICT ap,
                               const float* KILN_RESTRICT bp, float* KILN_RESTRICT c, index_t rs_c,
                               index_t cs_c, float alpha, float beta, int mr, int nr) {
  static_assert(MR >= 1 && MR <= 16, "the transposed store handles up to 16 rows");
  constexpr int NV = 2, W = 16;
  __m512 acc[MR][NV];
  KILN_GEMM512_UNROLL("GCC unroll 16")
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
  }

  prefetch_tile_avx512(c, rs_c, cs_c, mr, nr);

  KILN_GEMM512_UNROLL("GCC unroll 4")
  for (index_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + W);
    KILN_GEMM512_UNROLL("GCC unroll 16")
    for (int r = 0; r < MR; ++r) {
      const __m512 ai = _mm512_set1_ps(ap[r]);
      acc[r][0] = _mm512_fmadd_ps(ai, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ai, b1, acc[r][1]);
    }
    ap += MR;
    bp += NV * W;
  }

  store_tile_avx512<MR>(acc, c, rs_c, cs_c, alpha, beta, mr, nr);
}

// microkernel_avx512 on whole MR-row tiles with A read where it lies: row r of the tile's A at
// a + r * lda, k contiguous (a pointwise convolution's input rows, a backward-data's dy), instead
// of a packed panel — the same products in the same order, so the same bits, without the pass
// that packed them (pack_panels<12> was 9-11% of a ResNet-50 step). Three base pointers advance
// along k and the rows are addressed as base + {0, 1, 2, 3} * lda, so the twelve rows cost six
// registers rather than twelve.
// requires: MR a multiple of 4 up to 12, nr <= 32, bp as microkernel_avx512's.
template <int MR>
inline void microkernel_avx512_rows(index_t kc, const float* KILN_RESTRICT a, index_t lda,
                                    const float* KILN_RESTRICT bp, float* KILN_RESTRICT c, index_t rs_c,
                                    index_t cs_c, float alpha, float beta, int nr) {
  static_assert(MR % 4 == 0 && MR <= 12, "rows are addressed in groups of four from three bases");
  constexpr int NV = 2, W = 16;
  __m512 acc[MR][NV];
  KILN_GEMM512_UNROLL("GCC unroll 16")
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
  }

  prefetch_tile_avx512(c, rs_c, cs_c, MR, nr);

  const float* base[3] = {a, a + 4 * lda, a + 8 * lda};
  const index_t offset[4] = {0, lda, 2 * lda, 3 * lda};
  KILN_GEMM512_UNROLL("GCC unroll 4")
  for (index_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + W);
    KILN_GEMM512_UNROLL("GCC unroll 16")
    for (int r = 0; r < MR; ++r) {
      const __m512 ai = _mm512_set1_ps(base[r / 4][offset[r % 4] + p]);
      acc[r][0] = _mm512_fmadd_ps(ai, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ai, b1, acc[r][1]);
    }
    bp += NV * W;
  }

  store_tile_avx512<MR>(acc, c, rs_c, cs_c, alpha, beta, MR, nr);
}

}  // namespace kiln::cpu::detail

#undef KILN_GEMM512_UNROLL
