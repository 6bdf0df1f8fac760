// kiln/backend/cpu/detail/gemm_pack_bf16.hpp — copies blocks of op(A) and op(B) into the bf16
// pair panels the vdpbf16ps microkernel reads (gemm_kernel_bf16.hpp), keeping bf16.
//
// The panels are those of gemm_pack.hpp (R rows, panel-major, zero rows past the live ones) with
// each element a 32-bit word holding two bf16 neighbours along k: word (q, r) of a panel, at
// dst[q * R + r], has element (r, 2q) in its low half and (r, 2q + 1) in its high half, which is
// the pair vdpbf16ps multiplies into lane r. An odd kc gets a zero high half in its last word, so
// a panel of kc values is ceil(kc / 2) * R words. For B the rows are C's columns and a k step of
// a 32-wide panel is two zmm loads; for A a word is one broadcast.
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_pack_bf16.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kiln/backend/cpu/detail/gemm_kernel_avx512.hpp"
#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::cpu::detail {

inline constexpr index_t bf16_pairs(index_t kc) { return (kc + 1) / 2; }

// Lanes [0, n) of a 32-lane mask; n outside [0, 32] is clamped.
inline __mmask32 avx512_mask32(index_t n) {
  return n <= 0 ? __mmask32(0) : n >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << n) - 1u);
}

// Stores words [0, N) of v at dst (N <= 16 known at compile time).
template <int N>
inline void store_words(std::uint32_t* dst, __m512i v) {
  if constexpr (N >= 16) {
    _mm512_storeu_si512(dst, v);
  } else {
    _mm512_mask_storeu_epi32(dst, avx512_mask(N), v);
  }
}

// One panel whose R rows are contiguous (rs == 1) and k strided by cs: per pair q, rows 2q and
// 2q + 1 of the source (32 bf16 each, masked to the live ones) are interleaved 16 bits at a time
// by two vpermt2w into the words of columns 0-15 and 16-31.
template <int R>
inline void pack_bf16_rows_contiguous(index_t kc, const bf16* src, index_t cs, index_t live,
                                      std::uint32_t* dst) {
  static_assert(R >= 1 && R <= 32, "a contiguous bf16 panel is at most one zmm of rows wide");
  const __mmask32 m = avx512_mask32(live);
  // Word i of lo interleaves element i of x0 (even k) and of x1 (odd k); hi does i + 16.
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  const index_t kp = bf16_pairs(kc);
  for (index_t q = 0; q < kp; ++q) {
    const __m512i x0 = _mm512_maskz_loadu_epi16(m, src + 2 * q * cs);
    const __m512i x1 = 2 * q + 1 < kc ? _mm512_maskz_loadu_epi16(m, src + (2 * q + 1) * cs)
                                      : _mm512_setzero_si512();
    std::uint32_t* d = dst + q * R;
    store_words<std::min(R, 16)>(d, _mm512_permutex2var_epi16(x0, lo_idx, x1));
    if constexpr (R > 16) store_words<R - 16>(d + 16, _mm512_permutex2var_epi16(x0, hi_idx, x1));
  }
}

// One panel whose rows are contiguous along k (cs == 1): 16 rows x 16 pairs (32 bf16, one masked
// zmm load per row, zero past kc) are a 16 x 16 block of words, transposed in registers so that
// each pair q becomes one store of the panel's words (q, 16g .. 16g + 15).
template <int R>
inline void pack_bf16_k_contiguous(index_t kc, const bf16* src, index_t rs, index_t live,
                                   std::uint32_t* dst) {
  const index_t kp = bf16_pairs(kc);
  for (index_t q0 = 0; q0 < kp; q0 += 16) {
    const __mmask32 m = avx512_mask32(kc - 2 * q0);
    const index_t np = std::min<index_t>(16, kp - q0);
    for (int g = 0; g < (R + 15) / 16; ++g) {
      __m512 t[16];
      for (int i = 0; i < 16; ++i) {
        const int row = 16 * g + i;
        t[i] = row < live
                   ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, src + row * rs + 2 * q0))
                   : _mm512_setzero_ps();
      }
      transpose16x16(t);
      const __mmask16 cols = avx512_mask(R - 16 * g);
      std::uint32_t* d = dst + q0 * R + 16 * g;
      for (index_t j = 0; j < np; ++j)
        _mm512_mask_storeu_epi32(d + j * R, cols, _mm512_castps_si512(t[j]));
    }
  }
}

// Packs `rows` x kc bf16 values, element (r, p) at src[r * rs + p * cs], into ceil(rows / R)
// panels of pairs at dst (see the file comment).
// requires: dst has room for ceil(rows / R) * R * ceil(kc / 2) words; R <= 32.
template <int R>
inline void pack_panels_bf16(index_t rows, index_t kc, const bf16* KILN_RESTRICT src, index_t rs,
                             index_t cs, std::uint32_t* KILN_RESTRICT dst) {
  const index_t kp = bf16_pairs(kc);
  for (index_t r0 = 0; r0 < rows; r0 += R, src += R * rs, dst += R * kp) {
    const index_t live = std::min<index_t>(R, rows - r0);
    if (rs == 1) {
      pack_bf16_rows_contiguous<R>(kc, src, cs, live, dst);
    } else if (cs == 1) {
      pack_bf16_k_contiguous<R>(kc, src, rs, live, dst);
    } else {  // general strides (not produced by gemm(), which always has one unit stride)
      for (index_t q = 0; q < kp; ++q) {
        for (index_t r = 0; r < R; ++r) {
          std::uint32_t w = 0;
          if (r < live) {
            const bf16* s = src + r * rs + 2 * q * cs;
            w = s[0].bits | (2 * q + 1 < kc ? std::uint32_t(s[cs].bits) << 16 : 0u);
          }
          dst[q * R + r] = w;
        }
      }
    }
  }
}

}  // namespace kiln::cpu::detail
