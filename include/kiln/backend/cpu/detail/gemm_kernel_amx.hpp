// kiln/backend/cpu/detail/gemm_kernel_amx.hpp — the AMX microkernel of the CPU GEMM for
// kiln::bf16 inputs (Intel Sapphire Rapids and later): tdpbf16ps on tiles, fp32 accumulators,
// float C.
//
// Built when the target has AMX-TILE and AMX-BF16 besides AVX512-BF16 (e.g. -march=native on
// Sapphire Rapids) and KILN_GEMM_BF16_EMULATE is not defined; usable only once Linux granted the
// process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once: amx_tiles_usable). Where it
// is refused the vdpbf16ps kernel (gemm_kernel_bf16.hpp) runs instead.
//
// Tile: 32 rows x 32 columns of C in four 16 x 16 fp32 accumulator tiles (tmm0-3), fed per 32
// values of k by two A tiles (tmm4-5: 16 rows x 16 bf16 pairs) and two B tiles (tmm6-7: 16 pairs
// x 16 columns): four tdpbf16ps, each 16 x 16 x 32 multiply-adds. Every tile has 16 rows of 64
// bytes, so one tile configuration serves all calls; each thread loads it once.
//
// Panels: B is gemm_pack_bf16.hpp's panel (word (q, c) at q * 32 + c, pairs along k), which is
// exactly a B tile's row-major layout with a 128-byte stride. A is the transpose, row-major:
// word (r, q) at r * kw + q — a row of an A tile is 16 consecutive pairs of one row of C. Both pad
// k with zero pairs to a multiple of 16 pairs (kw = packed_k(kc)), so every tile is full.
//
// Numerics: as vdpbf16ps (gemm_kernel_bf16.hpp): exact bf16 products, fp32 accumulation rounded
// to nearest even, denormal inputs read as zero and denormal results flushed. The order of the
// sums differs from the emulation's, within the same error bound.
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_kernel_amx.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include "kiln/backend/cpu/detail/gemm_kernel_bf16.hpp"
#include "kiln/core/bf16_bulk.hpp"

#if KILN_GEMM_BF16_NATIVE && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512DQ__) && defined(__linux__)
#define KILN_GEMM_BF16_AMX 1
#else
#define KILN_GEMM_BF16_AMX 0
#endif

#if KILN_GEMM_BF16_AMX

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace kiln::cpu::detail {

// Whether this process may use the tile registers: Linux keeps the (8 KiB) tile state off until a
// process asks for it (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); asked once.
inline bool amx_tiles_usable() {
  static const bool usable = [] {
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return usable;
}

// The one tile configuration (palette 1; tmm0-7 all 16 rows x 64 bytes), loaded once per thread.
inline void amx_configure_this_thread() {
  thread_local bool configured = false;
  if (configured) return;
  alignas(64) unsigned char cfg[64] = {};
  cfg[0] = 1;  // palette
  for (int t = 0; t < 8; ++t) {
    const std::uint16_t colsb = 64;
    std::memcpy(cfg + 16 + 2 * t, &colsb, 2);  // bytes per row of tile t
    cfg[48 + t] = 16;                          // rows of tile t
  }
  _tile_loadconfig(cfg);
  configured = true;
}

inline constexpr index_t amx_pairs_per_tile = 16;  // a tile row: 16 pairs = 32 bf16 = 64 bytes
inline constexpr index_t amx_packed_k(index_t kc) {
  return (bf16_pairs(kc) + amx_pairs_per_tile - 1) / amx_pairs_per_tile * amx_pairs_per_tile;
}

// B panels: gemm_pack_bf16.hpp's, one at a time, each followed by zero pairs up to kw.
template <int R>
inline void pack_panels_amx_b(index_t rows, index_t kc, const bf16* KILN_RESTRICT src, index_t rs,
                              index_t cs, std::uint32_t* KILN_RESTRICT dst) {
  const index_t kp = bf16_pairs(kc), kw = amx_packed_k(kc);
  for (index_t r0 = 0; r0 < rows; r0 += R, src += R * rs, dst += R * kw) {
    pack_panels_bf16<R>(std::min<index_t>(R, rows - r0), kc, src, rs, cs, dst);
    std::memset(dst + R * kp, 0, std::size_t(R * (kw - kp)) * sizeof(std::uint32_t));
  }
}

// A panels: R rows, each kw words of pairs along k (zero past kc), rows past the live ones zero.
template <int R>
inline void pack_panels_amx_a(index_t rows, index_t kc, const bf16* KILN_RESTRICT src, index_t rs,
                              index_t cs, std::uint32_t* KILN_RESTRICT dst) {
  static_assert(R % 16 == 0, "AMX A panels are whole tiles of 16 rows");
  const index_t kw = amx_packed_k(kc);
  for (index_t r0 = 0; r0 < rows; r0 += R, src += R * rs, dst += R * kw) {
    const index_t live = std::min<index_t>(R, rows - r0);
    if (cs == 1) {  // each row's pairs are already adjacent in memory: a masked copy per 16 pairs
      for (index_t r = 0; r < R; ++r) {
        std::uint32_t* d = dst + r * kw;
        for (index_t q0 = 0; q0 < kw; q0 += amx_pairs_per_tile) {
          const __m512i v = r < live ? _mm512_maskz_loadu_epi16(avx512_mask32(kc - 2 * q0), src + r * rs + 2 * q0)
                                     : _mm512_setzero_si512();
          _mm512_storeu_si512(d + q0, v);
        }
      }
    } else if (rs == 1) {  // rows contiguous: interleave k pairs 16 rows at a time, then transpose
      const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                              38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
      for (index_t g = 0; g < R; g += 16) {
        const __mmask32 m = avx512_mask32(live - g);
        for (index_t q0 = 0; q0 < kw; q0 += amx_pairs_per_tile) {
          __m512 t[16];
          for (int j = 0; j < 16; ++j) {  // t[j]: pair q0 + j of rows g .. g + 15
            const index_t k0 = 2 * (q0 + j);
            const __m512i x0 = k0 < kc ? _mm512_maskz_loadu_epi16(m, src + g + k0 * cs) : _mm512_setzero_si512();
            const __m512i x1 =
                k0 + 1 < kc ? _mm512_maskz_loadu_epi16(m, src + g + (k0 + 1) * cs) : _mm512_setzero_si512();
            t[j] = _mm512_castsi512_ps(_mm512_permutex2var_epi16(x0, lo_idx, x1));
          }
          transpose16x16(t);  // t[i]: row g + i, pairs q0 .. q0 + 15
          for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + (g + i) * kw + q0, t[i]);
        }
      }
    } else {  // general strides (not produced by gemm(), which always has one unit stride)
      for (index_t r = 0; r < R; ++r)
        for (index_t q = 0; q < kw; ++q) {
          std::uint32_t w = 0;
          if (r < live && 2 * q < kc) {
            const bf16* s = src + r * rs + 2 * q * cs;
            w = s[0].bits | (2 * q + 1 < kc ? std::uint32_t(s[cs].bits) << 16 : 0u);
          }
          dst[r * kw + q] = w;
        }
    }
  }
}

// tmm0-3 = the 32 x 32 sums of an A block of 32 rows (row r's pairs from a + r * a_stride bytes:
// a packed panel, or A itself when its rows hold k contiguously) and a B panel of 32 columns,
// over kw = amx_packed_k(kc) pairs.
inline void amx_tile_sums(index_t kc, const char* KILN_RESTRICT a, long a_stride, const std::uint32_t* KILN_RESTRICT bp) {
  amx_configure_this_thread();
  const index_t kw = amx_packed_k(kc);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  constexpr long b_stride = 128;
  for (index_t q0 = 0; q0 < kw; q0 += amx_pairs_per_tile) {
    _tile_loadd(4, a + q0 * 4, a_stride);
    _tile_loadd(5, a + 16 * a_stride + q0 * 4, a_stride);
    _tile_loadd(6, bp + q0 * 32, b_stride);
    _tile_loadd(7, bp + q0 * 32 + 16, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// The sums of tmm0-3 into out, row-major.
inline void amx_spill_sums(float (&out)[32][32]) {
  _tile_stored(0, &out[0][0], 128);
  _tile_stored(1, &out[0][16], 128);
  _tile_stored(2, &out[16][0], 128);
  _tile_stored(3, &out[16][16], 128);
}

// C[0:mr, 0:nr] = alpha * sums + beta * C (beta == 0: C is not read), C as microkernel_bf16's.
inline void amx_store_sums(float* KILN_RESTRICT c, index_t rs_c, index_t cs_c, float alpha, float beta, int mr, int nr) {
  if (alpha == 1.0f && beta == 0.0f && cs_c == 1 && mr == 32 && nr == 32) {
    // C is the sums themselves (as the store below would write them: alpha 1 is exact): the
    // tiles go straight to C. Small k (a 1x1 convolution's 64 channels) spent more time in the
    // round trip through the stack than in tdpbf16ps.
    const long c_stride = long(rs_c * 4);
    _tile_stored(0, c, c_stride);
    _tile_stored(1, c + 16, c_stride);
    _tile_stored(2, c + 16 * rs_c, c_stride);
    _tile_stored(3, c + 16 * rs_c + 16, c_stride);
    return;
  }
  alignas(64) float out[32][32];
  amx_spill_sums(out);
  for (int h = 0; h < 2 && 16 * h < mr; ++h) {
    __m512 acc[16][2];
    for (int r = 0; r < 16; ++r) {
      acc[r][0] = _mm512_load_ps(&out[16 * h + r][0]);
      acc[r][1] = _mm512_load_ps(&out[16 * h + r][16]);
    }
    store_tile_avx512<16>(acc, c + 16 * h * rs_c, rs_c, cs_c, alpha, beta, mr - 16 * h, nr);
  }
}

// C[0:mr, 0:nr] = round_bf16(sums + bias [+ C]) into a bf16 C row-major with row stride rs_c (a
// convolution's bf16 output straight from the tiles: no float C written to memory and read back).
// bias: the nr columns' values (added in float, as an epilogue pass would), or nullptr;
// accumulate: C's old values are added (a gradient accumulated in bf16, rounded once per addition).
inline void amx_store_sums_rounded(bf16* KILN_RESTRICT c, index_t rs_c, const float* bias, bool accumulate, int mr,
                                   int nr) {
  alignas(64) float out[32][32];
  amx_spill_sums(out);
  if (bias) {
    alignas(64) float b[32] = {};
    std::memcpy(b, bias, std::size_t(nr) * sizeof(float));
    for (int r = 0; r < mr; ++r)
      for (int j = 0; j < 32; ++j) out[r][j] += b[j];
  }
  const __mmask32 live = avx512_mask32(nr);
  for (int r = 0; r < mr; ++r) {
    __m512 lo = _mm512_load_ps(&out[r][0]), hi = _mm512_load_ps(&out[r][16]);
    if (accumulate) {  // + float(old C): bf16 widened by a shift into the high half
      const __m512i old = _mm512_maskz_loadu_epi16(live, c + r * rs_c);
      // (maskz forms throughout: the plain ones pass GCC 12 an undefined vector it warns about)
      const __m512i old_lo =
          _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm512_maskz_extracti64x4_epi64(0xF, old, 0)), 16);
      const __m512i old_hi = _mm512_maskz_slli_epi32(
          0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm512_maskz_extracti64x4_epi64(0xF, old, 1)), 16);
      lo = _mm512_add_ps(lo, _mm512_castsi512_ps(old_lo));
      hi = _mm512_add_ps(hi, _mm512_castsi512_ps(old_hi));
      _mm512_store_ps(&out[r][0], lo);
      _mm512_store_ps(&out[r][16], hi);
    }
    // vcvtne2ps2bf16 rounds as round_to_bf16 does (to nearest even, NaN made quiet) but reads a
    // denormal as zero: the tiles' sums never are one (tdpbf16ps flushes them), a sum plus a
    // bias can be, and that row is rounded the long way. One instruction per 32 values instead of
    // eight: the store was 4% of a ResNet-9 bf16 step.
    if ((_mm512_fpclass_ps_mask(lo, 0x20) | _mm512_fpclass_ps_mask(hi, 0x20)) == 0) {
      _mm512_mask_storeu_epi16(c + r * rs_c, live, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    } else {
      alignas(64) bf16 row[32];
      round_to_bf16(out[r], row, 32);
      std::memcpy(c + r * rs_c, row, std::size_t(nr) * sizeof(bf16));
    }
  }
}

// The AMX kernel as the loop nest of gemm_driver.hpp sees it. Block sizes: a kc = 512 B panel is
// 32 KiB (as the vdpbf16ps kernel's) and so is one 32-row A panel; mc keeps an A block in L2.
struct gemm_kernel_amx {
  using input = bf16;
  using acc = float;
  using packed = std::uint32_t;
  static constexpr int mr = 32, nr = 32;
  static constexpr index_t kc = 1024, mc = 256, nc = 4096;
  static constexpr index_t kstep = 32;  // k blocks but the last fill whole tiles
  static constexpr index_t packed_k(index_t k) { return amx_packed_k(k); }
  static void pack_a(index_t rows, index_t k, const bf16* src, index_t rs, index_t cs, packed* dst) {
    pack_panels_amx_a<mr>(rows, k, src, rs, cs, dst);
  }
  static void pack_b(index_t rows, index_t k, const bf16* src, index_t rs, index_t cs, packed* dst) {
    pack_panels_amx_b<nr>(rows, k, src, rs, cs, dst);
  }
  static void tile(index_t k, const packed* ap, const packed* bp, float* c, index_t rs_c, index_t cs_c, float alpha,
                   float beta, int m_live, int n_live) {
    amx_tile_sums(k, reinterpret_cast<const char*>(ap), long(amx_packed_k(k) * 4), bp);
    amx_store_sums(c, rs_c, cs_c, alpha, beta, m_live, n_live);
  }
  static void tile_rounded(index_t k, const packed* ap, const packed* bp, bf16* c, index_t rs_c, const float* bias,
                           bool accumulate, int m_live, int n_live) {
    amx_tile_sums(k, reinterpret_cast<const char*>(ap), long(amx_packed_k(k) * 4), bp);
    amx_store_sums_rounded(c, rs_c, bias, accumulate, m_live, n_live);
  }
  // A read where it lies (gemm_driver.hpp's direct A): 32 whole rows, k contiguous in each, kc a
  // multiple of 32 (whole tiles, no padding to read), the rows lda values apart.
  static constexpr bool reads_a_in_place(index_t kc, index_t) { return kc % 32 == 0; }
  static void tile_in_place(index_t k, const bf16* a, index_t lda, const packed* bp, float* c, index_t rs_c,
                            index_t cs_c, float alpha, float beta, int n_live) {
    amx_tile_sums(k, reinterpret_cast<const char*>(a), long(lda * 2), bp);
    amx_store_sums(c, rs_c, cs_c, alpha, beta, 32, n_live);
  }
  static void tile_rounded_in_place(index_t k, const bf16* a, index_t lda, const packed* bp, bf16* c, index_t rs_c,
                                    const float* bias, bool accumulate, int n_live) {
    amx_tile_sums(k, reinterpret_cast<const char*>(a), long(lda * 2), bp);
    amx_store_sums_rounded(c, rs_c, bias, accumulate, 32, n_live);
  }
  static constexpr const char* name = "amx 32x32";
};

}  // namespace kiln::cpu::detail

#endif  // KILN_GEMM_BF16_AMX
